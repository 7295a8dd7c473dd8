"""Small pieces shared by the sub-commands: exit codes and output helpers."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["EXIT_CONFIG", "EXIT_ERROR", "EXIT_OK", "EXIT_UNAVAILABLE", "EXIT_USAGE", "print_json", "unavailable"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
#: The configuration is invalid (``cdcflow validate`` and friends).
EXIT_CONFIG = 3
#: The command exists but is not available in this build (sysexits EX_UNAVAILABLE).
EXIT_UNAVAILABLE = 69


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def unavailable(command: str, what: str) -> int:
    """Say plainly that ``command`` is not available yet; never pretend to run."""
    from cdcflow.core.version import __version__

    sys.stderr.write(f"cdcflow {command}: not available in cdcflow {__version__} yet.\nWhen available it will {what}\n")
    return EXIT_UNAVAILABLE
