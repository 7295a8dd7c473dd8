"""Small pieces shared by the sub-commands: exit codes and output helpers."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["EXIT_CONFIG", "EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "print_json"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
#: The configuration is invalid (``cdcflow validate`` and friends).
EXIT_CONFIG = 3


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")
