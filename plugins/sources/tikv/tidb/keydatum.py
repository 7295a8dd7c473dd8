"""Flag-prefixed datums: TiDB's ``codec.EncodeKey`` / ``EncodeValue`` formats.

Used inside keys (common handles, index values) and in row format v1. Each
datum is one flag byte and a body:

====  ==============  ==========================================================
flag  kind            body
====  ==============  ==========================================================
0     NULL            none
1     bytes           memcomparable bytes (:func:`.keys.encode_bytes`)
2     compact bytes   zig-zag varint length + bytes
3     int             8-byte comparable int (:func:`.keys.encode_int`)
4     uint            8 bytes big-endian (also packed times, ENUM/SET/BIT)
5     float           8-byte comparable float
6     decimal         precision byte, scale byte, MySQL binary decimal
7     duration        8-byte comparable int (nanoseconds)
8     varint          zig-zag varint (Go ``binary.PutVarint``)
9     uvarint         varint
10    JSON            type code + binary JSON
====  ==============  ==========================================================
"""

from __future__ import annotations

import decimal
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdcflow.plugins.sources.tikv.tidb import jsonbin, keys, mydecimal
from cdcflow.plugins.sources.tikv.tidb.values import decode_comparable_float, encode_comparable_float

__all__ = ["Datum", "DatumKind", "decode_datum", "decode_datums", "encode_key_datum", "encode_key_datums"]


class DatumKind(enum.IntEnum):
    NULL = 0
    BYTES = 1
    COMPACT_BYTES = 2
    INT = 3
    UINT = 4
    FLOAT = 5
    DECIMAL = 6
    DURATION = 7
    VARINT = 8
    UVARINT = 9
    JSON = 10


@dataclass(frozen=True, slots=True)
class Datum:
    """One decoded datum. ``value`` is None, int, float, bytes, Decimal, or (JSON) the type-prefixed bytes."""

    kind: DatumKind
    value: Any


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """A Go ``binary.Uvarint`` at ``data[pos:]``: at most 10 bytes and 64 bits, else an error."""
    result = shift = 0
    start = pos
    while True:
        if pos >= len(data):
            raise keys.KeyFormatError(f"truncated varint at offset {start}")
        b = data[pos]
        pos += 1
        if shift == 63 and b > 1:
            raise keys.KeyFormatError(f"varint at offset {start} overflows 64 bits")
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    u, pos = _uvarint(data, pos)
    return (u >> 1) ^ -(u & 1), pos


def decode_datum(data: bytes, pos: int = 0) -> tuple[Datum, int]:
    """Decode the datum at ``data[pos:]``; returns (datum, end offset)."""
    if pos >= len(data):
        raise keys.KeyFormatError(f"no datum at offset {pos}")
    flag, pos = data[pos], pos + 1
    try:
        kind = DatumKind(flag)
    except ValueError:
        raise keys.KeyFormatError(f"unknown datum flag {flag} at offset {pos - 1}") from None
    try:
        value, pos = _BODY_DECODERS[kind](data, pos)
    except (mydecimal.DecimalFormatError, jsonbin.JSONFormatError) as e:
        raise keys.KeyFormatError(str(e)) from None
    return Datum(kind, value), pos


def _fixed(decode: Callable[[bytes, int], Any]) -> Callable[[bytes, int], tuple[Any, int]]:
    def body(data: bytes, pos: int) -> tuple[Any, int]:
        if pos + 8 > len(data):
            raise keys.KeyFormatError(f"truncated 8-byte datum at offset {pos}")
        return decode(data, pos), pos + 8

    return body


def _compact_bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _varint(data, pos)
    if n < 0 or pos + n > len(data):
        raise keys.KeyFormatError(f"compact bytes of length {n} overrun the data at offset {pos}")
    return data[pos : pos + n], pos + n


def _json(data: bytes, pos: int) -> tuple[bytes, int]:
    size = jsonbin.json_size(data, pos)
    if pos + size > len(data):
        raise keys.KeyFormatError(f"truncated JSON datum at offset {pos}")
    return data[pos : pos + size], pos + size


_BODY_DECODERS: dict[DatumKind, Callable[[bytes, int], tuple[Any, int]]] = {
    DatumKind.NULL: lambda data, pos: (None, pos),
    DatumKind.BYTES: keys.decode_bytes,
    DatumKind.COMPACT_BYTES: _compact_bytes,
    DatumKind.INT: _fixed(keys.decode_int),
    DatumKind.DURATION: _fixed(keys.decode_int),
    DatumKind.UINT: _fixed(keys.decode_uint),
    DatumKind.FLOAT: _fixed(lambda data, pos: decode_comparable_float(data[pos : pos + 8])),
    DatumKind.DECIMAL: mydecimal.decode_row_decimal,
    DatumKind.VARINT: _varint,
    DatumKind.UVARINT: _uvarint,
    DatumKind.JSON: _json,
}


def decode_datums(data: bytes) -> list[Datum]:
    """Every datum of ``data`` (e.g. a common handle)."""
    out: list[Datum] = []
    pos = 0
    while pos < len(data):
        datum, pos = decode_datum(data, pos)
        out.append(datum)
    return out


def encode_key_datum(value: Any, *, unsigned: bool = False, decimal_scale: int | None = None) -> bytes:
    """Comparable (key) form of one value: None, int, float, str/bytes, Decimal.

    ``unsigned`` selects the uint form for ints; DECIMALs use ``decimal_scale``
    (default: the value's own exponent) and the smallest precision that fits.
    """
    if value is None:
        return bytes([DatumKind.NULL])
    if isinstance(value, bool | int):
        if unsigned:
            return bytes([DatumKind.UINT]) + keys.encode_uint(int(value))
        return bytes([DatumKind.INT]) + keys.encode_int(int(value))
    if isinstance(value, float):
        return bytes([DatumKind.FLOAT]) + encode_comparable_float(value)
    if isinstance(value, str):
        value = value.encode("utf-8")
    if isinstance(value, bytes | bytearray):
        return bytes([DatumKind.BYTES]) + keys.encode_bytes(bytes(value))
    if isinstance(value, decimal.Decimal):
        exponent = int(value.as_tuple().exponent)
        frac = decimal_scale if decimal_scale is not None else max(0, -exponent)
        precision = max(max(len(value.as_tuple().digits) + exponent, 0) + frac, 1)
        return bytes([DatumKind.DECIMAL]) + mydecimal.encode_row_decimal(value, precision, frac)
    raise keys.KeyFormatError(f"cannot key-encode a {type(value).__name__}")


def encode_key_datums(values: list[Any]) -> bytes:
    """A common handle: the key forms of the primary-key values, concatenated."""
    return b"".join(encode_key_datum(v) for v in values)
