"""Column types → Avro types, and column values → Avro values and back.

The mapping follows TiCDC's Avro protocol, column by column (MySQL type code
and flags of :class:`~cdcflow.core.data.events.ColumnInfo`):

====================================  ==============================================  ===========================
Column                                Avro type                                       Value written
====================================  ==============================================  ===========================
TINYINT, SMALLINT, MEDIUMINT (±)      int                                             the integer
INT                                   int; INT UNSIGNED: long                         the integer
BIGINT                                long                                            the integer
BIGINT UNSIGNED                       long, or string (bigint-unsigned mode string)   long: wraps above 2^63-1
FLOAT, DOUBLE                         double (FLOAT too, as TiCDC since v7.0)         the number
DECIMAL(p,s)                          bytes, logicalType decimal, precision p,        unscaled two's-complement
                                      scale s; or string (decimal mode string)        big-endian; or plain text
CHAR, VARCHAR, TEXT                   string                                          the text
BINARY, VARBINARY, BLOB               bytes                                           the bytes
BIT(n)                                bytes, ``length`` n in connect.parameters       big-endian, shortest ≥ 1
ENUM / SET                            string, ``allowed`` in connect.parameters       the member name(s), a,b
JSON                                  string                                          the JSON text
YEAR                                  int                                             the year
DATE                                  int, logicalType date                           days since 1970-01-01
DATETIME                              long, logicalType local-timestamp-micros        µs since 1970-01-01 00:00
TIMESTAMP                             long, logicalType timestamp-micros              µs since the epoch, UTC
TIME                                  long, logicalType time-micros                   signed µs (±838 h)
anything else (VECTOR, …)             string                                          its text
====================================  ==============================================  ===========================

With ``avro-time-handling-mode=string`` DATE, DATETIME, TIMESTAMP and TIME are
strings as TiDB prints them, which is what TiCDC writes. Every type object
carries ``connect.parameters`` with ``tidb_type`` (INT, INT UNSIGNED,
BIGINT, …, TEXT/BLOB for strings) like TiCDC's, so a consumer can tell the
column's type from the schema alone; the decoder relies on it.

Not guaranteed: TIME values outside 00:00–24:00 are written as their signed
microseconds, which Avro readers that turn ``time-micros`` into a time of
day reject (use the string mode for TIME columns holding durations).
MySQL's zero dates (``0000-00-00``) have no logical-type value: they become
null in nullable columns and an :class:`AvroEncodeError` otherwise.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdcflow.core.data.events import ColumnInfo
from cdcflow.core.data.types import (
    BLOB_TYPES,
    CHAR_TYPES,
    DATE_TYPES,
    DATETIME_TYPES,
    DECIMAL_TYPES,
    FLOAT_TYPES,
    TypeCode,
)
from cdcflow.plugins.codecs.avro.config import AvroConfig
from cdcflow.plugins.codecs.avro.errors import AvroEncodeError
from cdcflow.plugins.codecs.columns import elements_of, format_date_value, fsp_of

__all__ = ["ColumnCodec", "column_codec", "encode_value", "from_avro", "sanitize_name", "tidb_type"]

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_DATE = dt.date(1970, 1, 1)
_MICRO = dt.timedelta(microseconds=1)
_U64 = 1 << 64
_DECIMAL = re.compile(r"decimal\((\d+)\s*,\s*(\d+)\)", re.IGNORECASE)
_BIT = re.compile(r"bit\((\d+)\)", re.IGNORECASE)
#: MySQL's largest DECIMAL: used when a column's precision and scale are unknown, so no digit is lost.
_MAX_PRECISION, _MAX_SCALE = 65, 30
#: Exact arithmetic for every MySQL decimal (the default context rounds to 28 digits).
_EXACT = decimal.Context(prec=_MAX_PRECISION + _MAX_SCALE + 5)

_TIDB_TYPES: dict[int, str] = {
    TypeCode.TINY: "INT",
    TypeCode.SHORT: "INT",
    TypeCode.INT24: "INT",
    TypeCode.LONG: "INT",
    TypeCode.LONGLONG: "BIGINT",
    TypeCode.FLOAT: "FLOAT",
    TypeCode.DOUBLE: "DOUBLE",
    TypeCode.BIT: "BIT",
    TypeCode.DECIMAL: "DECIMAL",
    TypeCode.NEWDECIMAL: "DECIMAL",
    TypeCode.ENUM: "ENUM",
    TypeCode.SET: "SET",
    TypeCode.JSON: "JSON",
    TypeCode.DATE: "DATE",
    TypeCode.NEWDATE: "DATE",
    TypeCode.DATETIME: "DATETIME",
    TypeCode.TIMESTAMP: "TIMESTAMP",
    TypeCode.DURATION: "TIME",
    TypeCode.YEAR: "YEAR",
}


def sanitize_name(name: str) -> str:
    """An Avro name for ``name``: letters, digits and ``_``, not starting with a digit (as TiCDC)."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return "_" + out if out[:1].isdigit() else out or "_"


def tidb_type(column: ColumnInfo) -> str:
    """TiCDC's ``tidb_type`` parameter of a column."""
    code, flags = column.type_code, column.flags
    name = _TIDB_TYPES.get(code)
    if name is None:
        if code in CHAR_TYPES or code in BLOB_TYPES:
            return "BLOB" if flags & ColumnInfo.BINARY else "TEXT"
        return "TEXT"
    if name in ("INT", "BIGINT") and flags & ColumnInfo.UNSIGNED:
        return name + " UNSIGNED"
    return name


@dataclass(frozen=True, slots=True)
class ColumnCodec:
    """How one column is typed and converted: ``to_avro(value)`` gives what fastavro writes."""

    column: ColumnInfo
    #: The Avro type of a non-null value (with connect.parameters).
    avro_type: dict[str, Any]
    to_avro: Callable[[Any], Any]

    @property
    def nullable(self) -> bool:
        return bool(self.column.flags & ColumnInfo.NULLABLE)


def column_codec(column: ColumnInfo, config: AvroConfig) -> ColumnCodec:
    """The Avro type and value conversion of ``column`` under ``config``'s handling modes."""
    params: dict[str, str] = {"tidb_type": tidb_type(column)}
    code = column.type_code
    plan = _numeric(column, config)
    if plan is None and code in (*DATE_TYPES, *DATETIME_TYPES, TypeCode.DURATION):
        if config.avro_time_handling_mode == "logical":
            plan = _temporal(code)
        else:
            fsp = fsp_of(column)
            plan = {"type": "string"}, lambda v: format_date_value(code, v, fsp)
    if plan is None:
        plan = _textual(column, params)
    avro, convert = plan
    avro["connect.parameters"] = params
    return ColumnCodec(column, avro, convert)


_Plan = tuple[dict[str, Any], Callable[[Any], Any]]


def _numeric(column: ColumnInfo, config: AvroConfig) -> _Plan | None:
    code, unsigned = column.type_code, bool(column.flags & ColumnInfo.UNSIGNED)
    if code in (TypeCode.TINY, TypeCode.SHORT, TypeCode.INT24, TypeCode.YEAR) or (
        code == TypeCode.LONG and not unsigned
    ):
        return {"type": "int"}, _integer
    if code == TypeCode.LONG or (code == TypeCode.LONGLONG and not unsigned):
        return {"type": "long"}, _integer
    if code == TypeCode.LONGLONG:
        if config.avro_bigint_unsigned_handling_mode == "string":
            return {"type": "string"}, lambda v: str(_integer(v))
        return {"type": "long"}, _wrapped_u64
    if code in FLOAT_TYPES:
        return {"type": "double"}, float
    if code in DECIMAL_TYPES:
        if config.avro_decimal_handling_mode == "string":
            return {"type": "string"}, _decimal_text
        precision, scale = _decimal_params(column.sql_type)
        avro = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
        return avro, _unscaled_bytes(scale)
    return None


def _textual(column: ColumnInfo, params: dict[str, str]) -> _Plan:
    """BIT, ENUM, SET, JSON and string types (params gains BIT's length, ENUM/SET's members)."""
    code = column.type_code
    if code == TypeCode.BIT:
        match = _BIT.search(column.sql_type)
        params["length"] = match.group(1) if match else "64"
        return {"type": "bytes"}, _bit_bytes
    if code in (TypeCode.ENUM, TypeCode.SET):
        elements = tuple(elements_of(column))
        params["allowed"] = ",".join(e.replace(",", "\\,") for e in elements)
        return {"type": "string"}, _enum_name(elements) if code == TypeCode.ENUM else _set_names(elements)
    if code == TypeCode.JSON:
        return {"type": "string"}, _json_text
    if (code in CHAR_TYPES or code in BLOB_TYPES) and column.flags & ColumnInfo.BINARY:
        return {"type": "bytes"}, _binary
    return {"type": "string"}, _text


# --------------------------------------------------------------------------- to Avro


def _integer(value: Any) -> int:
    if isinstance(value, bytes):
        return int.from_bytes(value, "big")
    return int(value)


def _wrapped_u64(value: Any) -> int:
    """BIGINT UNSIGNED as a signed long: values above 2^63-1 wrap to negative (TiCDC's long mode)."""
    n = _integer(value)
    return n - _U64 if n >= 1 << 63 else n


def _decimal_params(sql_type: str) -> tuple[int, int]:
    match = _DECIMAL.search(sql_type)
    if match is None:
        return _MAX_PRECISION, _MAX_SCALE
    return int(match.group(1)), int(match.group(2))


def _decimal_text(value: Any) -> str:
    return format(value, "f") if isinstance(value, decimal.Decimal) else str(value)


def _unscaled_bytes(scale: int) -> Callable[[Any], bytes]:
    def convert(value: Any) -> bytes:
        number = decimal.Decimal(value) if not isinstance(value, decimal.Decimal) else value
        unscaled = number.scaleb(scale, _EXACT)
        if unscaled != unscaled.to_integral_value():
            raise ValueError(f"{number} has more than {scale} decimal places")
        n = int(unscaled)
        return n.to_bytes((n + (n < 0)).bit_length() // 8 + 1, "big", signed=True)

    return convert


def _bit_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    n = int(value)
    return n.to_bytes(max(1, (n.bit_length() + 7) // 8), "big")


def _enum_name(elements: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if isinstance(value, str):
            return value
        index = int(value)
        if index == 0:
            return ""  # MySQL's "invalid value" member of every ENUM
        if index > len(elements):
            raise ValueError(f"ENUM index {index} but the column has {len(elements)} members")
        return elements[index - 1]

    return convert


def _set_names(elements: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if isinstance(value, str):
            return value
        mask = int(value)
        if mask >> len(elements):
            raise ValueError(f"SET bitmask {mask:#x} but the column has {len(elements)} members")
        return ",".join(e for i, e in enumerate(elements) if mask >> i & 1)

    return convert


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _binary(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    return str(value)


def _temporal(code: int) -> _Plan:
    if code in DATE_TYPES:
        return {"type": "int", "logicalType": "date"}, _days
    if code == TypeCode.DATETIME:
        return {"type": "long", "logicalType": "local-timestamp-micros"}, _local_micros
    if code == TypeCode.TIMESTAMP:
        return {"type": "long", "logicalType": "timestamp-micros"}, _utc_micros
    return {"type": "long", "logicalType": "time-micros"}, _time_micros


class ZeroDate(ValueError):
    """A MySQL zero date (``0000-00-00``), which no logical type can hold."""


def _parse_text(value: str) -> dt.datetime:
    if value.startswith("0000-00-00") or "-00" in value[:10]:
        raise ZeroDate(value)
    return dt.datetime.fromisoformat(value)


def _days(value: Any) -> int:
    if isinstance(value, str):
        value = _parse_text(value).date()
    if isinstance(value, dt.datetime):
        value = value.date()
    return (value - _EPOCH_DATE).days  # type: ignore[no-any-return]


def _local_micros(value: Any) -> int:
    if isinstance(value, str):
        value = _parse_text(value)
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return (value - _EPOCH) // _MICRO  # type: ignore[no-any-return]


def _utc_micros(value: Any) -> int:
    """TIMESTAMP values are instants; a naive one is taken as UTC (TiDB stores TIMESTAMP in UTC)."""
    if isinstance(value, str):
        value = _parse_text(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return (value - _EPOCH_UTC) // _MICRO  # type: ignore[no-any-return]


def _time_micros(value: Any) -> int:
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    if isinstance(value, str):
        sign = -1 if value.startswith("-") else 1
        hours, minutes, seconds = value.lstrip("-").split(":")
        whole, _, frac = seconds.partition(".")
        total = (int(hours) * 60 + int(minutes)) * 60 + int(whole)
        return sign * (total * 1_000_000 + int((frac + "000000")[:6]))
    return value // _MICRO  # type: ignore[no-any-return]


def encode_value(codec: ColumnCodec, value: Any, where: str) -> Any:
    """``value`` as fastavro writes it for ``codec``'s column; errors name ``where`` (table) and the column."""
    if value is None:
        if not codec.nullable:
            raise AvroEncodeError(f"{where}: column {codec.column.name!r} is NOT NULL but the row holds NULL")
        return None
    try:
        return codec.to_avro(value)
    except ZeroDate:
        if codec.nullable:
            return None
        raise AvroEncodeError(
            f"{where}: column {codec.column.name!r} holds the zero date {value!r}, which the Avro logical type "
            "cannot hold; set avro-time-handling-mode=string to replicate zero dates as text",
        ) from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise AvroEncodeError(
            f"{where}: column {codec.column.name!r} ({codec.column.sql_type or codec.avro_type['type']}) "
            f"cannot be written as Avro {codec.avro_type['type']}: {value!r} ({exc})",
            detail={"column": codec.column.name, "value": repr(value)[:200]},
        ) from exc


# --------------------------------------------------------------------------- from Avro


def from_avro(avro_type: Any, value: Any) -> Any:
    """The Python value of an Avro value written with ``avro_type`` (a field's type, unions included).

    Logical types come back as :class:`decimal.Decimal`, :class:`datetime.date`,
    naive :class:`datetime.datetime` (DATETIME), UTC-aware datetime
    (TIMESTAMP) and :class:`datetime.timedelta` (TIME); BIGINT UNSIGNED longs
    are unwrapped back to the unsigned value.
    """
    if value is None:
        return None
    if isinstance(avro_type, list):
        branches = [t for t in avro_type if t != "null"]
        return from_avro(branches[0], value) if branches else None
    if not isinstance(avro_type, dict):
        return value
    logical = avro_type.get("logicalType")
    if logical == "decimal":
        unscaled = int.from_bytes(value, "big", signed=True)
        return decimal.Decimal(unscaled).scaleb(-int(avro_type.get("scale", 0)), _EXACT)
    if logical == "date":
        return _EPOCH_DATE + dt.timedelta(days=value)
    if logical == "local-timestamp-micros":
        return _EPOCH + value * _MICRO
    if logical == "timestamp-micros":
        return _EPOCH_UTC + value * _MICRO
    if logical == "time-micros":
        return value * _MICRO
    params = avro_type.get("connect.parameters") or {}
    if params.get("tidb_type") == "BIGINT UNSIGNED" and avro_type.get("type") == "long" and value < 0:
        return value + _U64
    return value
