"""One column value in a row value (format v2) ↔ a Python value, by column type.

========================  ===============================================  =====================
Column type               Bytes in a v2 row value                          Python value
========================  ===============================================  =====================
TINYINT…BIGINT, YEAR      1/2/4/8 bytes little-endian, signed or unsigned  int
                          (UnsignedFlag), shortest width that fits
FLOAT, DOUBLE             8 bytes: IEEE-754 double, big-endian, sign bit   float (FLOAT rounded
                          set if ≥ 0, all bits inverted if < 0             to single precision)
DECIMAL                   [precision][scale][MySQL binary decimal]         decimal.Decimal
CHAR, VARCHAR, *TEXT      raw bytes                                        str (UTF-8), or bytes
BINARY, VARBINARY, *BLOB                                                   when charset binary
DATE, DATETIME            packed time as unsigned int (1/2/4/8 bytes LE)   date / naive datetime
TIMESTAMP                 packed time **in UTC**                           datetime, tz = UTC
TIME                      nanoseconds as signed int (1/2/4/8 bytes LE)     timedelta
ENUM, SET, BIT            unsigned int (1/2/4/8 bytes LE)                  int (ENUM: 1-based
                                                                           index; SET: bitmask)
JSON                      [type code][TiDB binary JSON]                    str (JSON text)
========================  ===============================================  =====================

Zero dates decode to their MySQL text (see :mod:`.timecodec`). Any other type
(GEOMETRY, VECTOR, …) raises :class:`UnsupportedColumnType`; bytes that do
not fit the type raise :class:`ValueFormatError`. Neither is ever turned
into NULL.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import struct
from collections.abc import Callable
from typing import Any

from cdcflow.core.data.types import INT_TYPES, UINT_TYPES, TypeCode
from cdcflow.plugins.sources.tikv.tidb import jsonbin, mydecimal, timecodec
from cdcflow.plugins.sources.tikv.tidb.fieldtype import STRING_TYPES, TIME_TYPES, FieldType

__all__ = [
    "UnsupportedColumnType",
    "ValueFormatError",
    "decode_comparable_float",
    "decode_value",
    "encode_comparable_float",
    "encode_int",
    "encode_uint",
    "encode_value",
    "value_decoder",
]

_SIGN = 1 << 63
_MASK64 = (1 << 64) - 1
_INT_FORMATS = {1: "<b", 2: "<h", 4: "<i", 8: "<q"}
_UINT_FORMATS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


class ValueFormatError(ValueError):
    """Bytes that are not a value of the column's type."""


class UnsupportedColumnType(ValueError):
    """A column type cdcflow does not decode."""


# --------------------------------------------------------------------------- primitives


def encode_int(value: int) -> bytes:
    for size, fmt in _INT_FORMATS.items():
        if -(1 << (size * 8 - 1)) <= value < (1 << (size * 8 - 1)):
            return struct.pack(fmt, value)
    raise ValueFormatError(f"{value} does not fit in a signed 64-bit integer")


def encode_uint(value: int) -> bytes:
    for size, fmt in _UINT_FORMATS.items():
        if 0 <= value < (1 << (size * 8)):
            return struct.pack(fmt, value)
    raise ValueFormatError(f"{value} does not fit in an unsigned 64-bit integer")


def _decode_int(data: bytes, unsigned: bool) -> int:
    fmt = (_UINT_FORMATS if unsigned else _INT_FORMATS).get(len(data))
    if fmt is None:
        raise ValueFormatError(f"an integer value must be 1, 2, 4 or 8 bytes, got {len(data)}")
    value: int = struct.unpack(fmt, data)[0]
    return value


def encode_comparable_float(value: float) -> bytes:
    bits: int = struct.unpack(">Q", struct.pack(">d", value))[0]
    bits = bits | _SIGN if value >= 0 else ~bits & _MASK64
    return struct.pack(">Q", bits)


def decode_comparable_float(data: bytes) -> float:
    if len(data) != 8:
        raise ValueFormatError(f"a float value must be 8 bytes, got {len(data)}")
    bits: int = struct.unpack(">Q", data)[0]
    bits = bits & ~_SIGN if bits & _SIGN else ~bits & _MASK64
    value: float = struct.unpack(">d", struct.pack(">Q", bits))[0]
    return value


def _to_float32(value: float) -> float:
    try:
        result: float = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        raise ValueFormatError(f"{value} does not fit a FLOAT column") from None
    return result


# --------------------------------------------------------------------------- decoding


def decode_value(ft: FieldType, data: bytes) -> Any:
    """The Python value of one not-null column value of type ``ft``."""
    tp = ft.tp
    if tp in INT_TYPES:
        return _decode_int(data, ft.unsigned)
    if tp in UINT_TYPES:
        return _decode_int(data, True)
    if tp in STRING_TYPES:
        return _decode_string(ft, data)
    if tp in TIME_TYPES:
        return _decode_time(tp, data)
    decoder = _DECODERS.get(tp)
    if decoder is None:
        raise UnsupportedColumnType(f"column type {_type_name(tp)} is not supported")
    return decoder(data)


def value_decoder(ft: FieldType) -> Callable[[bytes], Any]:
    """:func:`decode_value` for one column type, with the type dispatch done once.

    The returned function gives the same values and raises the same errors as
    ``decode_value(ft, data)``; an unsupported type raises only when a value
    is decoded (as :func:`decode_value` does), not when the decoder is built.
    """
    tp = ft.tp
    if tp in INT_TYPES or tp in UINT_TYPES:
        formats = _UINT_FORMATS if _unsigned(ft) else _INT_FORMATS
        unpackers = {size: struct.Struct(fmt).unpack for size, fmt in formats.items()}

        def decode_int(data: bytes) -> int:
            unpack = unpackers.get(len(data))
            if unpack is None:
                raise ValueFormatError(f"an integer value must be 1, 2, 4 or 8 bytes, got {len(data)}")
            value: int = unpack(data)[0]
            return value

        return decode_int
    if tp in STRING_TYPES:
        return bytes if ft.is_binary else _decode_utf8
    if tp in TIME_TYPES:
        date_only = tp in (TypeCode.DATE, TypeCode.NEWDATE)
        utc = tp == TypeCode.TIMESTAMP
        packed_unpackers = {size: struct.Struct(fmt).unpack for size, fmt in _UINT_FORMATS.items()}
        unpack_time = timecodec.unpack_time

        def decode_time(data: bytes) -> dt.date | dt.datetime | str:
            unpack = packed_unpackers.get(len(data))
            if unpack is None:
                raise ValueFormatError(f"an integer value must be 1, 2, 4 or 8 bytes, got {len(data)}")
            try:
                return unpack_time(unpack(data)[0], date_only=date_only, utc=utc)
            except timecodec.TimeFormatError as e:
                raise ValueFormatError(str(e)) from None

        return decode_time
    decoder = _DECODERS.get(tp)
    if decoder is not None:
        return decoder
    return lambda data: decode_value(ft, data)  # raises UnsupportedColumnType, as decode_value does


def _unsigned(ft: FieldType) -> bool:
    """Whether an integer-stored type's values are unsigned: its UNSIGNED flag for the
    integer types, always for the others (BIT, ENUM, SET)."""
    return ft.unsigned if ft.tp in INT_TYPES else True


def native_kind(ft: FieldType) -> tuple[str, Any]:
    """How the native row decoder (:mod:`._rowfast`) decodes a value of type ``ft``, as
    :func:`value_decoder` does: the name of one of its kinds and that kind's argument
    (``("CALL", value_decoder(ft))`` for the types it leaves to Python)."""
    tp = ft.tp
    if tp in INT_TYPES or tp in UINT_TYPES:
        return ("UINT" if _unsigned(ft) else "INT"), None
    if tp in STRING_TYPES:
        return ("BYTES" if ft.is_binary else "UTF8"), None
    if tp in TIME_TYPES:
        if tp in (TypeCode.DATE, TypeCode.NEWDATE):
            return "DATE", None
        return ("TIMESTAMP" if tp == TypeCode.TIMESTAMP else "DATETIME"), None
    if tp == TypeCode.DOUBLE:
        return "DOUBLE", None
    if tp == TypeCode.NEWDECIMAL:
        return "DECIMAL", decimal.Decimal
    if tp == TypeCode.JSON:
        return "JSON", None
    if tp == TypeCode.DURATION:
        return "DURATION", None
    return "CALL", value_decoder(ft)


def _decode_utf8(data: bytes) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueFormatError(f"string value is not valid UTF-8 ({e})") from None


def _decode_string(ft: FieldType, data: bytes) -> str | bytes:
    if ft.is_binary:
        return bytes(data)
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueFormatError(f"string value is not valid UTF-8 ({e})") from None


def _decode_time(tp: int, data: bytes) -> dt.date | dt.datetime | str:
    try:
        return timecodec.unpack_time(
            _decode_int(data, True),
            date_only=tp in (TypeCode.DATE, TypeCode.NEWDATE),
            utc=tp == TypeCode.TIMESTAMP,
        )
    except timecodec.TimeFormatError as e:
        raise ValueFormatError(str(e)) from None


def _decode_decimal(data: bytes) -> decimal.Decimal:
    try:
        return mydecimal.decode_row_value(data)
    except mydecimal.DecimalFormatError as e:
        raise ValueFormatError(str(e)) from None


def _decode_json(data: bytes) -> str:
    try:
        return jsonbin.decode_json(bytes(data))
    except jsonbin.JSONFormatError as e:
        raise ValueFormatError(str(e)) from None


_DECODERS: dict[int, Callable[[bytes], Any]] = {
    TypeCode.FLOAT: lambda data: _to_float32(decode_comparable_float(data)),
    TypeCode.DOUBLE: decode_comparable_float,
    TypeCode.NEWDECIMAL: _decode_decimal,
    TypeCode.DURATION: lambda data: dt.timedelta(microseconds=_decode_int(data, False) // 1000),
    TypeCode.JSON: _decode_json,
}


def _type_name(tp: int) -> str:
    try:
        return f"{TypeCode(tp).name} ({tp})"
    except ValueError:
        return f"unknown ({tp})"


# --------------------------------------------------------------------------- encoding


def encode_value(ft: FieldType, value: Any) -> bytes:
    """The bytes TiDB writes for a not-null ``value`` of type ``ft`` in a v2 row.

    Accepts the Python types :func:`decode_value` returns; in addition a JSON
    column takes a dict/list/number/bool as well as JSON text, and an ENUM
    column takes a member name.
    """
    tp = ft.tp
    if tp in INT_TYPES:
        return encode_uint(value) if ft.unsigned else encode_int(value)
    if tp in STRING_TYPES:
        return value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if tp in (TypeCode.FLOAT, TypeCode.DOUBLE):
        value = float(value)
        return encode_comparable_float(_to_float32(value) if tp == TypeCode.FLOAT else value)
    if tp == TypeCode.NEWDECIMAL:
        dec = decimal.Decimal(value)
        frac = ft.decimal if ft.decimal >= 0 else max(0, -int(dec.as_tuple().exponent))
        precision = ft.flen if ft.flen > 0 else max(len(dec.as_tuple().digits), frac, 1)
        try:
            return mydecimal.encode_row_decimal(dec, precision, frac)
        except mydecimal.DecimalFormatError as e:
            raise ValueFormatError(str(e)) from None
    if tp in TIME_TYPES:
        return encode_uint(timecodec.pack_time(value))
    if tp == TypeCode.DURATION:
        delta: dt.timedelta = value
        return encode_int((delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000)
    if tp in UINT_TYPES:
        if tp == TypeCode.ENUM and isinstance(value, str):
            value = ft.elems.index(value) + 1
        return encode_uint(value)
    if tp == TypeCode.JSON:
        parsed = json.loads(value) if isinstance(value, str) else value
        return jsonbin.encode_json(parsed)
    raise UnsupportedColumnType(f"column type {_type_name(tp)} is not supported")
