"""Durations and byte sizes as people write them in YAML: ``30m``, ``24h``, ``1GiB``."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

__all__ = ["ByteSize", "Duration", "parse_bytes", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_duration(value: object) -> float:
    """Seconds from a number of seconds or a string such as ``500ms``, ``30m``, ``24h``."""
    if isinstance(value, bool):
        raise ValueError("a duration, e.g. 30s, 5m or 24h")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    raise ValueError(f"{value!r} is not a duration; write e.g. 500ms, 30s, 5m, 24h or a number of seconds")


def parse_bytes(value: object) -> int:
    """Bytes from an integer or a string such as ``64MiB``, ``1GiB``, ``10MB``."""
    if isinstance(value, bool):
        raise ValueError("a size, e.g. 64MiB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            unit = (match.group(2) or "B").lower()
            return int(float(match.group(1)) * _SIZE_UNITS[unit])
    raise ValueError(f"{value!r} is not a size; write e.g. 512KiB, 64MiB, 1GiB or a number of bytes")


#: Seconds, written as a number or ``30s`` / ``5m`` / ``24h``.
Duration = Annotated[float, BeforeValidator(parse_duration)]
#: Bytes, written as a number or ``64MiB`` / ``1GiB``.
ByteSize = Annotated[int, BeforeValidator(parse_bytes)]
