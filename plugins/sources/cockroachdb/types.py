"""CockroachDB column types onto the core's column types, and JSON values onto Python values.

The core describes columns as MySQL type bytes (``ColumnInfo.type_code``) so
that every codec and sink works from one vocabulary; this module is the
mapping table of docs/how-to/replicate-from-cockroachdb.md ("Types"). ``crdb_type`` is the
``crdb_sql_type`` of ``information_schema.columns`` (``INT8``, ``STRING(64)``,
``DECIMAL(12,2)``, ``TIMESTAMPTZ``…). Changefeed JSON writes numbers as JSON
numbers, DECIMAL as a JSON number (parsed here as Decimal, exactly), BYTES as
``"\\x<hex>"``, times in ISO 8601, JSONB inline; :func:`decode_value` reverses it.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from decimal import Decimal
from typing import Any

from cdcflow.core.data.events import ColumnInfo

__all__ = ["MappedType", "column_info", "decode_value", "kind_of", "map_type"]

# MySQL type bytes (Open Protocol §2.4), as plugins.codecs.columns.TypeCode names them.
_TINY, _SHORT, _LONG, _FLOAT, _DOUBLE, _TIMESTAMP, _LONGLONG = 1, 2, 3, 4, 5, 7, 8
_DATE, _DURATION, _DATETIME, _VARCHAR, _JSON, _NEWDECIMAL, _BLOB = 10, 11, 12, 15, 245, 246, 252


class MappedType:
    """A CockroachDB type as the core sees it: type byte, binary flag, MySQL DDL text, value kind."""

    __slots__ = ("binary", "kind", "sql_type", "type_code")

    def __init__(self, type_code: int, sql_type: str, kind: str, *, binary: bool = False) -> None:
        self.type_code = type_code
        self.sql_type = sql_type
        self.kind = kind
        self.binary = binary


_TYPE = re.compile(r"^\s*([A-Za-z0-9_ ]+?)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*(\[\])?\s*$")


def map_type(crdb_type: str) -> MappedType:  # noqa: PLR0912
    """The core's type for a CockroachDB SQL type (unknown types travel as text)."""
    match = _TYPE.match(crdb_type)
    if match is None or match.group(4):
        return MappedType(_VARCHAR, "text", "text")  # arrays and anything unparsed: their text form
    base = match.group(1).upper().strip()
    p, s = match.group(2), match.group(3)
    if base in ("INT2", "SMALLINT"):
        return MappedType(_SHORT, "smallint", "int")
    if base in ("INT4", "INTEGER"):
        return MappedType(_LONG, "int", "int")
    if base in ("INT8", "INT", "BIGINT", "SERIAL", "SERIAL8"):
        return MappedType(_LONGLONG, "bigint", "int")
    if base in ("FLOAT4", "REAL"):
        return MappedType(_FLOAT, "float", "float")
    if base in ("FLOAT8", "FLOAT", "DOUBLE PRECISION"):
        return MappedType(_DOUBLE, "double", "float")
    if base in ("DECIMAL", "NUMERIC", "DEC"):
        return MappedType(_NEWDECIMAL, f"decimal({p or 65},{s or 0})" if p else "decimal(65,30)", "decimal")
    if base in ("BOOL", "BOOLEAN"):
        return MappedType(_TINY, "tinyint(1)", "bool")
    if base in ("STRING", "VARCHAR", "CHAR", "TEXT", "CHARACTER VARYING", "CHARACTER", "NAME"):
        return MappedType(_VARCHAR, f"varchar({p})" if p else "text", "text")
    if base in ("BYTES", "BYTEA", "BLOB"):
        return MappedType(_BLOB, "longblob", "bytes", binary=True)
    if base == "DATE":
        return MappedType(_DATE, "date", "date")
    if base in ("TIMESTAMP", "TIMESTAMP WITHOUT TIME ZONE"):
        return MappedType(_DATETIME, f"datetime({min(int(p or 6), 6)})", "timestamp")
    if base in ("TIMESTAMPTZ", "TIMESTAMP WITH TIME ZONE"):
        return MappedType(_TIMESTAMP, f"timestamp({min(int(p or 6), 6)})", "timestamptz")
    if base in ("TIME", "TIME WITHOUT TIME ZONE"):
        return MappedType(_DURATION, f"time({min(int(p or 6), 6)})", "time")
    if base in ("JSONB", "JSON"):
        return MappedType(_JSON, "json", "json")
    if base == "UUID":
        return MappedType(_VARCHAR, "char(36)", "text")
    return MappedType(_VARCHAR, "text", "text")  # INET, INTERVAL, ENUMs, GEOMETRY…: their text form


def column_info(name: str, crdb_type: str, *, nullable: bool, primary_key: bool) -> ColumnInfo:
    """A catalog column as the core's :class:`ColumnInfo` (key flags from the primary key)."""
    mapped = map_type(crdb_type)
    flags = 0
    if primary_key:
        flags |= ColumnInfo.PRIMARY_KEY | ColumnInfo.HANDLE_KEY
    if nullable:
        flags |= ColumnInfo.NULLABLE
    if mapped.binary:
        flags |= ColumnInfo.BINARY
    return ColumnInfo(name, mapped.type_code, flags, mapped.sql_type, nullable)


def _bytes(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return base64.b64decode(text)


def _timestamp(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value


def _time(text: str) -> dt.timedelta:
    t = dt.time.fromisoformat(text)
    return dt.timedelta(hours=t.hour, minutes=t.minute, seconds=t.second, microseconds=t.microsecond)


def _plain(value: Any) -> Any:
    """JSON parsed with Decimal numbers back to what json.dumps writes as numbers."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() and "." not in str(value) else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


_KIND_BY_CODE = {
    _TINY: "bool",
    _SHORT: "int",
    _LONG: "int",
    _LONGLONG: "int",
    _FLOAT: "float",
    _DOUBLE: "float",
    _NEWDECIMAL: "decimal",
    _BLOB: "bytes",
    _DATE: "date",
    _DATETIME: "timestamp",
    _TIMESTAMP: "timestamptz",
    _DURATION: "time",
    _JSON: "json",
}


def kind_of(column: ColumnInfo) -> str:
    """The value kind of a column built by :func:`column_info` (what :func:`decode_value` takes)."""
    return _KIND_BY_CODE.get(column.type_code, "text")


def decode_value(value: Any, kind: str) -> Any:
    """A changefeed JSON value (``json.loads(..., parse_float=Decimal)``) as the core's Python value.

    TIMESTAMPTZ becomes a naive UTC datetime (as the TiKV source's TIMESTAMP),
    TIME a timedelta, JSONB its JSON text, BOOL 0/1 (MySQL's tinyint(1)).
    """
    if value is None:
        return None
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "decimal":
        return value if isinstance(value, Decimal) else Decimal(str(value))
    if kind == "bool":
        return int(bool(value))
    if kind == "bytes":
        return _bytes(str(value))
    if kind == "date":
        return dt.date.fromisoformat(str(value))
    if kind in ("timestamp", "timestamptz"):
        return _timestamp(str(value))
    if kind == "time":
        return _time(str(value))
    if kind == "json":
        return json.dumps(_plain(value), separators=(",", ":"))
    return value if isinstance(value, str) else json.dumps(value, default=str)
