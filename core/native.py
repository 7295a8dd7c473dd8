"""Optional C extensions: loaded where they were built, and turned off on request.

cdcflow's C extensions (the TiDB row decoder, the Open Protocol image writer)
are built by the install where a C compiler is found and are optional
otherwise; each has a Python path that gives the same results.
``CDCFLOW_PURE_PYTHON=1`` in a process's environment (inherited by its local
Spark workers) turns them all off there.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["PURE_PYTHON_ENV", "native_module"]

#: Set to anything but "" or "0" to use no C extension.
PURE_PYTHON_ENV = "CDCFLOW_PURE_PYTHON"


def native_module(name: str) -> Any:
    """The C extension module ``name``, or None: not built, or turned off with
    ``CDCFLOW_PURE_PYTHON=1``."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
