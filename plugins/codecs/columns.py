"""MySQL column types as the message protocols see them.

Type codes (:class:`~cdcflow.core.data.types.TypeCode`) and flags are
those of :class:`~cdcflow.core.data.events.ColumnInfo`. When a row arrives
without a table schema (a test source, a raw key-value feed),
:func:`column_for` infers a type from the Python value, so that every
protocol can still encode it; such inferred columns carry no key flags.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Mapping
from typing import Any

from cdcflow.core.data.events import ColumnInfo, RowChange
from cdcflow.core.data.types import TypeCode

__all__ = [
    "column_for",
    "column_of",
    "columns_of",
    "elements_of",
    "format_date_value",
    "fsp_of",
    "handle_key_names",
    "is_binary_string",
    "schema_column",
]


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
    """Sorted handle-key column names of ``row`` (cached per column tuple: a per-row hot path)."""
    schema = row.schema
    if schema is None:
        return tuple(sorted(n for n, c in columns_of(row).items() if c.is_handle_key))
    columns = schema.columns
    hit = _HANDLE_KEYS.get(id(columns))
    if hit is None or hit[0] is not columns:
        if len(_HANDLE_KEYS) > 4096:
            _HANDLE_KEYS.clear()
        hit = _HANDLE_KEYS[id(columns)] = (columns, tuple(sorted(c.name for c in columns if c.is_handle_key)))
    return hit[1]


_BY_NAME: dict[int, tuple[object, dict[str, ColumnInfo]]] = {}


def schema_column(row: RowChange, name: str) -> ColumnInfo | None:
    """Column ``name`` of ``row``'s schema (None without a schema); cached per column tuple."""
    if row.schema is None:
        return None
    columns = row.schema.columns
    hit = _BY_NAME.get(id(columns))
    if hit is None or hit[0] is not columns:
        if len(_BY_NAME) > 4096:
            _BY_NAME.clear()
        hit = _BY_NAME[id(columns)] = (columns, {c.name: c for c in columns})
    return hit[1].get(name)


def is_binary_string(column: ColumnInfo) -> bool:
    return bool(column.flags & ColumnInfo.BINARY)


_FSP = re.compile(r"^(?:datetime|timestamp|time)\((\d)\)")
_ELEMENTS = re.compile(r"'((?:[^']|'')*)'")


def fsp_of(column: ColumnInfo) -> int | None:
    """Fractional-second digits of a DATETIME/TIMESTAMP/TIME column, from its ``sql_type`` (None: unknown)."""
    if not column.sql_type:
        return None
    match = _FSP.match(column.sql_type)
    return int(match.group(1)) if match else 0


def elements_of(column: ColumnInfo) -> list[str]:
    """Members of an ENUM/SET column, from its ``sql_type`` (``enum('a','b')``); empty when unknown."""
    return [m.replace("''", "'") for m in _ELEMENTS.findall(column.sql_type)]


def format_date_value(code: int, value: Any, fsp: int | None = None) -> str:
    """DATE / DATETIME / TIMESTAMP / TIME values as TiDB prints them.

    Fractional seconds get ``fsp`` digits (the column's precision); when the
    precision is unknown, six digits if non-zero. Timezone-aware datetimes
    (TIMESTAMP from the TiKV source) are printed in UTC.
    Strings (zero dates) pass through unchanged.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, dt.datetime):
        moment: dt.datetime = value.astimezone(dt.UTC) if value.tzinfo is not None else value
        # not strftime: %Y drops the leading zeros of years before 1000; isoformat keeps
        # them (YYYY-MM-DD HH:MM:SS, then the UTC offset of an aware value, cut off)
        return moment.isoformat(" ", "seconds")[:19] + _fraction(moment.microsecond, fsp)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        return f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}" + _fraction(value.microsecond, fsp)
    if isinstance(value, dt.timedelta):
        micros = abs(value) // dt.timedelta(microseconds=1)
        sign = "-" if value < dt.timedelta(0) else ""
        seconds, micro = divmod(micros, 1_000_000)
        hours, rest = divmod(seconds, 3600)
        return f"{sign}{hours:02d}:{rest // 60:02d}:{rest % 60:02d}" + _fraction(micro, fsp)
    raise TypeError(f"cannot format {type(value).__name__} as a MySQL type {code} value")


def _fraction(micro: int, fsp: int | None) -> str:
    if fsp is None:
        return f".{micro:06d}" if micro else ""
    return f".{micro:06d}"[: fsp + 1] if fsp > 0 else ""
