"""MySQL column types as the message protocols see them.

Type codes are MySQL's type bytes (Open Protocol §2.4) and flags the Open
Protocol column flag bits (§2.5), as carried by
:class:`~cdcflow.core.events.ColumnInfo`. When a row arrives without a
table schema (a test source, a raw key-value feed), :func:`column_for` infers
a type from the Python value, so that every protocol can still encode it;
such inferred columns carry no key flags.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping
from typing import Any

from cdcflow.core.events import ColumnInfo, RowChange

__all__ = [
    "TypeCode",
    "column_for",
    "column_of",
    "columns_of",
    "format_date_value",
    "handle_key_names",
    "is_binary_string",
]


class TypeCode:
    """MySQL type bytes used in the ``t`` field of Open Protocol columns."""

    DECIMAL = 0
    TINY = 1
    SHORT = 2
    LONG = 3
    FLOAT = 4
    DOUBLE = 5
    NULL = 6
    TIMESTAMP = 7
    LONGLONG = 8
    INT24 = 9
    DATE = 10
    DURATION = 11
    DATETIME = 12
    YEAR = 13
    NEWDATE = 14
    VARCHAR = 15
    BIT = 16
    VECTOR = 225
    JSON = 245
    NEWDECIMAL = 246
    ENUM = 247
    SET = 248
    TINY_BLOB = 249
    MEDIUM_BLOB = 250
    LONG_BLOB = 251
    BLOB = 252
    VAR_STRING = 253
    STRING = 254
    GEOMETRY = 255

    INTEGERS = frozenset({TINY, SHORT, LONG, LONGLONG, INT24, YEAR})
    FLOATS = frozenset({FLOAT, DOUBLE})
    DECIMALS = frozenset({DECIMAL, NEWDECIMAL})
    DATES = frozenset({DATE, NEWDATE})
    DATETIMES = frozenset({TIMESTAMP, DATETIME})
    UNSIGNED_INTS = frozenset({BIT, ENUM, SET})
    STRINGS = frozenset({VARCHAR, VAR_STRING, STRING})
    BLOBS = frozenset({TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, BLOB})


_MAX_INT64 = (1 << 63) - 1


def column_for(name: str, value: Any) -> ColumnInfo:
    """A column type for ``value`` when the row carries no schema."""
    flags = ColumnInfo.NULLABLE
    if value is None:
        code = TypeCode.NULL
    elif isinstance(value, bool | int):
        code = TypeCode.LONGLONG
        if value > _MAX_INT64:
            flags |= ColumnInfo.UNSIGNED
    elif isinstance(value, float):
        code = TypeCode.DOUBLE
    elif isinstance(value, decimal.Decimal):
        code = TypeCode.NEWDECIMAL
    elif isinstance(value, bytes | bytearray | memoryview):
        code, flags = TypeCode.VARCHAR, flags | ColumnInfo.BINARY
    elif isinstance(value, dt.datetime):
        code = TypeCode.DATETIME
    elif isinstance(value, dt.date):
        code = TypeCode.DATE
    elif isinstance(value, dt.timedelta | dt.time):
        code = TypeCode.DURATION
    elif isinstance(value, dict | list):
        code = TypeCode.JSON
    else:
        code = TypeCode.VARCHAR
    return ColumnInfo(name, code, flags)


def column_of(row: RowChange, name: str, value: Any) -> ColumnInfo:
    """The schema's column ``name`` of ``row``, or one inferred from ``value``."""
    if row.schema is not None:
        for column in row.schema.columns:
            if column.name == name:
                return column
    return column_for(name, value)


def columns_of(row: RowChange) -> Mapping[str, ColumnInfo]:
    """Column info by name for every column of ``row``'s images (inferred from the first non-null value)."""
    known = {c.name: c for c in row.schema.columns} if row.schema is not None else {}
    out: dict[str, ColumnInfo] = {}
    for image in (row.after, row.before):
        for name, value in (image or {}).items():
            if name not in out or (out[name].type_code == TypeCode.NULL and value is not None):
                out[name] = known.get(name) or column_for(name, value)
    return out


_HANDLE_KEYS: dict[int, tuple[object, tuple[str, ...]]] = {}


def handle_key_names(row: RowChange) -> tuple[str, ...]:
    """Sorted handle-key column names of ``row`` (cached per schema object: a per-row hot path)."""
    schema = row.schema
    if schema is None:
        return tuple(sorted(n for n, c in columns_of(row).items() if c.is_handle_key))
    hit = _HANDLE_KEYS.get(id(schema))
    if hit is None or hit[0] is not schema:
        if len(_HANDLE_KEYS) > 4096:
            _HANDLE_KEYS.clear()
        hit = _HANDLE_KEYS[id(schema)] = (schema, tuple(sorted(schema.handle_key_columns())))
    return hit[1]


def is_binary_string(column: ColumnInfo) -> bool:
    return bool(column.flags & ColumnInfo.BINARY)


def format_date_value(code: int, value: Any) -> str:
    """DATE / DATETIME / TIMESTAMP / TIME values as TiDB prints them.

    Fractional seconds are written as six digits when non-zero (the column's
    fsp is not known here); strings pass through unchanged.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, dt.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        return text + (f".{value.microsecond:06d}" if value.microsecond else "")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        text = value.strftime("%H:%M:%S")
        return text + (f".{value.microsecond:06d}" if value.microsecond else "")
    if isinstance(value, dt.timedelta):
        micros = abs(value) // dt.timedelta(microseconds=1)
        sign = "-" if value < dt.timedelta(0) else ""
        seconds, micro = divmod(micros, 1_000_000)
        hours, rest = divmod(seconds, 3600)
        text = f"{sign}{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
        return text + (f".{micro:06d}" if micro else "")
    raise TypeError(f"cannot format {type(value).__name__} as a MySQL type {code} value")
