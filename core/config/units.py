"""Durations and byte sizes as people write them in YAML: ``30m``, ``24h``, ``1GiB``."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated

from pydantic import BeforeValidator

__all__ = ["MAX_BYTES", "MAX_SECONDS", "ByteSize", "Duration", "parse_bytes", "parse_duration"]

#: The largest size a setting may have: 8 EiB - 1, what a signed 64-bit counter holds.
MAX_BYTES = 2**63 - 1
#: The longest duration a setting may have: 100 years.
MAX_SECONDS = 100 * 365 * 86400.0

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
    seconds: float | None = None
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        seconds = float(min(value, MAX_SECONDS * 2)) if isinstance(value, int) else value
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            seconds = float(Decimal(match.group(1)) * Decimal(_DURATION_UNITS[match.group(2)]))
    if seconds is None:
        raise ValueError(f"{value!r} is not a duration; write e.g. 500ms, 30s, 5m, 24h or a number of seconds")
    if math.isnan(seconds) or seconds > MAX_SECONDS:
        raise ValueError(f"{value!r} is not a duration of at most 100 years")
    return seconds


def parse_bytes(value: object) -> int:
    """Bytes from an integer or a string such as ``64MiB``, ``1GiB``, ``10MB``."""
    if isinstance(value, bool):
        raise ValueError("a size, e.g. 64MiB")
    size: int | None = None
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        size = value
    elif isinstance(value, str):
        match = _SIZE.match(value)
        if match and len(match.group(1)) <= 40:
            unit = (match.group(2) or "B").lower()
            size = int(Decimal(match.group(1)) * _SIZE_UNITS[unit])
    if size is None:
        raise ValueError(f"{value!r} is not a size; write e.g. 512KiB, 64MiB, 1GiB or a number of bytes")
    if size > MAX_BYTES:
        raise ValueError(f"{value!r} is larger than the largest size, 8EiB")
    return size


#: Seconds, written as a number or ``30s`` / ``5m`` / ``24h``.
Duration = Annotated[float, BeforeValidator(parse_duration)]
#: Bytes, written as a number or ``64MiB`` / ``1GiB``.
ByteSize = Annotated[int, BeforeValidator(parse_bytes)]
