"""TiDB's packed time (DATE, DATETIME, TIMESTAMP) and durations (TIME).

Packed time (``types.Time.ToPackedUint``)::

    ymd  = (year * 13 + month) << 5 | day
    hms  = hour << 12 | minute << 6 | second
    packed = ((ymd << 17 | hms) << 24) | microsecond

TIMESTAMP values are packed in UTC. A TIME value is a signed count of
nanoseconds. MySQL's zero dates (``0000-00-00``, or a zero month or day)
have no Python ``date``; they decode to their MySQL text.
"""

from __future__ import annotations

import datetime as dt

__all__ = [
    "TimeFormatError",
    "duration_text",
    "pack_time",
    "packed_text",
    "unpack_time",
]


class TimeFormatError(ValueError):
    """A packed time with fields out of range."""


def pack_time(value: dt.date | dt.datetime) -> int:
    """Packed form of a date or datetime (aware datetimes are converted to UTC first)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        hms = value.hour << 12 | value.minute << 6 | value.second
        micro = value.microsecond
    else:
        hms = micro = 0
    ymd = (value.year * 13 + value.month) << 5 | value.day
    return ((ymd << 17 | hms) << 24) | micro


def _fields(packed: int) -> tuple[int, int, int, int, int, int, int]:
    micro = packed & 0xFFFFFF
    ymdhms = packed >> 24
    ymd, hms = ymdhms >> 17, ymdhms & 0x1FFFF
    day, ym = ymd & 0x1F, ymd >> 5
    year, month = divmod(ym, 13)
    return year, month, day, hms >> 12, (hms >> 6) & 0x3F, hms & 0x3F, micro


def unpack_time(packed: int, *, date_only: bool = False, utc: bool = False) -> dt.date | dt.datetime | str:
    """The date (``date_only``) or datetime of a packed time; ``utc`` makes it timezone-aware.

    Zero dates come back as MySQL text (``0000-00-00`` / ``0000-00-00 00:00:00``).
    """
    year, month, day, hour, minute, second, micro = _fields(packed)
    if month == 0 or day == 0:
        return packed_text(packed, date_only=date_only)
    try:
        if date_only:
            return dt.date(year, month, day)
        return dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=dt.UTC if utc else None)
    except ValueError as e:
        raise TimeFormatError(f"packed time {packed:#x} is not a valid time: {e}") from None


def packed_text(packed: int, *, date_only: bool = False) -> str:
    year, month, day, hour, minute, second, micro = _fields(packed)
    text = f"{year:04d}-{month:02d}-{day:02d}"
    if date_only:
        return text
    text += f" {hour:02d}:{minute:02d}:{second:02d}"
    return text + (f".{micro:06d}" if micro else "")


def duration_text(ns: int, fsp: int = 0) -> str:
    sign = "-" if ns < 0 else ""
    micros = abs(ns) // 1000
    secs, micro = divmod(micros, 1_000_000)
    hours, rem = divmod(secs, 3600)
    text = f"{sign}{hours:02d}:{rem // 60:02d}:{rem % 60:02d}"
    if fsp > 0:
        text += "." + f"{micro:06d}"[:fsp]
    return text
