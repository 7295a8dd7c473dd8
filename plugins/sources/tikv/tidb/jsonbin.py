"""TiDB's binary JSON, as stored in JSON columns: ``[type code][value]``.

Type codes: 0x01 object, 0x03 array, 0x04 literal (value byte 0x00 null,
0x01 true, 0x02 false), 0x09 int64, 0x0A uint64, 0x0B float64 (all three
8 bytes little-endian), 0x0C string (uvarint length + UTF-8), 0x0D opaque
(MySQL type byte + uvarint length + bytes), 0x0E date, 0x0F datetime,
0x10 timestamp (8-byte little-endian packed time), 0x11 duration (int64 ns +
uint32 fsp).

Objects and arrays: ``uint32 count, uint32 total size`` then, for objects,
``count`` key entries ``(uint32 key offset, uint16 key length)``, then
``count`` value entries ``(type byte, uint32 offset-or-inline)``, then the
keys and the values; offsets count from the first byte of the
object/array. Literals are inlined in the value entry. Object keys are
sorted by their bytes.

Decoding yields the JSON text TiDB would print (``{"a": 1, "b": [true]}``);
opaque values print as MySQL does (``"base64:type15:..."``).
"""

from __future__ import annotations

import base64
import json
import json.encoder
import struct
from collections.abc import Callable
from typing import Any

from cdcflow.plugins.sources.tikv.tidb import timecodec

__all__ = ["JSONFormatError", "decode_json", "encode_json", "json_size"]

OBJECT, ARRAY, LITERAL, INT64, UINT64, FLOAT64, STRING, OPAQUE = 0x01, 0x03, 0x04, 0x09, 0x0A, 0x0B, 0x0C, 0x0D
DATE, DATETIME, TIMESTAMP, DURATION = 0x0E, 0x0F, 0x10, 0x11
_NULL, _TRUE, _FALSE = 0x00, 0x01, 0x02
#: How deep containers may nest (TiDB's ``maxJSONDepth``).
MAX_DEPTH = 100
_HEADER = struct.Struct("<II")
_KEY_ENTRY = struct.Struct("<IH")
_VALUE_ENTRY = struct.Struct("<BI")


class JSONFormatError(ValueError):
    """Bytes that are not TiDB binary JSON."""


# --------------------------------------------------------------------------- decoding


def decode_json(data: bytes) -> str:
    """JSON text of a JSON column value (type byte + binary).

    Containers nest at most :data:`MAX_DEPTH` levels (TiDB's own limit), and
    the values a document decodes to must not overlap: their bytes add up to
    at most the document's length. Both are refused with
    :class:`JSONFormatError`, so hostile offsets (a container pointing at
    itself, entries sharing one value) cannot recurse without end or blow a
    small value up into an exponentially large text.
    """
    if not data:
        raise JSONFormatError("empty JSON value")
    size = json_size(data)
    if size != len(data):
        raise JSONFormatError(f"JSON value says it is {size} bytes long but the column holds {len(data)}")
    buf = memoryview(data)[1:]
    return _Decoder(buf).decode(data[0], 0, 1)


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise JSONFormatError("truncated or overlong varint in JSON value")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _need(buf: memoryview, pos: int, n: int) -> None:
    if pos < 0 or pos + n > len(buf):
        raise JSONFormatError(f"JSON value truncated: need {n} bytes at {pos}, have {len(buf) - pos}")


#: Literal value byte → its JSON text.
_LITERALS = {_NULL: "null", _TRUE: "true", _FALSE: "false"}


def _literal(b: int) -> str:
    text = _LITERALS.get(b)
    if text is None:
        raise JSONFormatError(f"unknown JSON literal 0x{b:02x}")
    return text


_INT64 = struct.Struct("<q")
_UINT64 = struct.Struct("<Q")
_FLOAT64 = struct.Struct("<d")

#: JSON string literal of a str, exactly as ``json.dumps(s, ensure_ascii=False)`` spells it.
_quote: Callable[[str], str] = json.encoder.encode_basestring


class _Decoder:
    """One document's decoding into JSON text: its bytes, and how many of them values have not claimed yet.

    Values are written as text as they are decoded (one pass): containers as
    ``{"k": v, …}`` / ``[v, …]``, strings quoted as ``json.dumps`` quotes them,
    numbers and literals as ``json.dumps`` writes them.
    """

    __slots__ = ("buf", "left")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.left = len(buf)

    def _claim(self, n: int) -> None:
        """Account ``n`` bytes to the value being decoded; more than the document holds means overlap."""
        self.left -= n
        if self.left < 0:
            raise JSONFormatError(
                f"JSON values overlap: the document of {len(self.buf)} bytes decodes to more values than it holds"
            )

    def decode(self, tp: int, pos: int, depth: int) -> str:
        buf = self.buf
        if tp in (OBJECT, ARRAY):
            if depth > MAX_DEPTH:
                raise JSONFormatError(f"JSON value nested deeper than {MAX_DEPTH} levels")
            return self._container(tp, pos, depth)
        if tp == STRING:
            n, end = _uvarint(buf, pos)
            _need(buf, end, n)
            self._claim(end - pos + n)
            try:
                return _quote(bytes(buf[end : end + n]).decode("utf-8"))
            except UnicodeDecodeError as e:
                raise JSONFormatError(f"JSON string is not UTF-8: {e}") from None
        if tp in (INT64, UINT64):
            _need(buf, pos, 8)
            self._claim(8)
            number: int = (_INT64 if tp == INT64 else _UINT64).unpack_from(buf, pos)[0]
            return int.__repr__(number)
        if tp == LITERAL:
            _need(buf, pos, 1)
            self._claim(1)
            return _literal(buf[pos])
        if tp == FLOAT64:
            _need(buf, pos, 8)
            self._claim(8)
            return json.dumps(_FLOAT64.unpack_from(buf, pos)[0])  # NaN and ±Infinity as json spells them
        if tp == OPAQUE:
            _need(buf, pos, 1)
            mysql_type = buf[pos]
            n, end = _uvarint(buf, pos + 1)
            _need(buf, end, n)
            self._claim(end - pos + n)
            return json.dumps(f"base64:type{mysql_type}:" + base64.b64encode(buf[end : end + n]).decode())
        if tp in (DATE, DATETIME, TIMESTAMP):
            _need(buf, pos, 8)
            self._claim(8)
            packed = struct.unpack_from("<Q", buf, pos)[0]
            return json.dumps(timecodec.packed_text(packed, date_only=tp == DATE))
        if tp == DURATION:
            _need(buf, pos, 12)
            self._claim(12)
            ns, fsp = struct.unpack_from("<qI", buf, pos)
            return json.dumps(timecodec.duration_text(ns, fsp))
        raise JSONFormatError(f"unknown JSON type code 0x{tp:02x}")

    def _container(self, tp: int, base: int, depth: int) -> str:
        buf = self.buf
        _need(buf, base, 8)
        count, size = _HEADER.unpack_from(buf, base)
        _need(buf, base, size)
        key_entries = base + 8
        value_entries = key_entries + (count * _KEY_ENTRY.size if tp == OBJECT else 0)
        _need(buf, value_entries, count * _VALUE_ENTRY.size)
        self._claim(value_entries + count * _VALUE_ENTRY.size - base)
        values = []
        for i in range(count):
            vtp, off = _VALUE_ENTRY.unpack_from(buf, value_entries + i * _VALUE_ENTRY.size)
            if vtp == LITERAL:
                values.append(_literal(off & 0xFF))
            else:
                if off >= size:
                    raise JSONFormatError(f"JSON value offset {off} outside its container of {size} bytes")
                values.append(self.decode(vtp, base + off, depth + 1))
        if tp == ARRAY:
            return "[" + ", ".join(values) + "]"
        items: dict[str, str] = {}  # a repeated key keeps its first place and its last value
        for i in range(count):
            koff, klen = _KEY_ENTRY.unpack_from(buf, key_entries + i * _KEY_ENTRY.size)
            _need(buf, base + koff, klen)
            self._claim(klen)
            try:
                key = bytes(buf[base + koff : base + koff + klen]).decode("utf-8")
            except UnicodeDecodeError as e:
                raise JSONFormatError(f"JSON key is not UTF-8: {e}") from None
            items[key] = values[i]
        return "{" + ", ".join([_quote(key) + ": " + text for key, text in items.items()]) + "}"


_FIXED_SIZES = {LITERAL: 1, INT64: 8, UINT64: 8, FLOAT64: 8, DATE: 8, DATETIME: 8, TIMESTAMP: 8, DURATION: 12}


def json_size(data: bytes, offset: int = 0) -> int:
    """Byte length of the type-prefixed JSON value at ``data[offset:]`` (for the v1 datum codec)."""
    buf = memoryview(data)
    _need(buf, offset, 1)
    tp, pos = data[offset], offset + 1
    if tp in (OBJECT, ARRAY):
        _need(buf, pos, 8)
        return 1 + int(_HEADER.unpack_from(buf, pos)[1])
    fixed = _FIXED_SIZES.get(tp)
    if fixed is not None:
        return 1 + fixed
    if tp == OPAQUE:
        pos += 1
    elif tp != STRING:
        raise JSONFormatError(f"unknown JSON type code 0x{tp:02x}")
    n, end = _uvarint(buf, pos)
    return end + n - offset


# --------------------------------------------------------------------------- encoding


def encode_json(value: Any) -> bytes:
    """Binary form (type byte + value) of a parsed JSON value (dict, list, str, int, float, bool, None)."""
    tp, body = _encode(value)
    return bytes([tp]) + body


def _encode(value: Any) -> tuple[int, bytes]:
    if value is None or isinstance(value, bool):
        return LITERAL, bytes([_NULL if value is None else _TRUE if value else _FALSE])
    if isinstance(value, int):
        if -(1 << 63) <= value < (1 << 63):
            return INT64, struct.pack("<q", value)
        if 0 <= value < (1 << 64):
            return UINT64, struct.pack("<Q", value)
        raise JSONFormatError(f"JSON integer {value} out of 64-bit range")
    if isinstance(value, float):
        return FLOAT64, struct.pack("<d", value)
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return STRING, _put_uvarint(len(raw)) + raw
    if isinstance(value, list):
        return ARRAY, _encode_container([], list(value))
    if isinstance(value, dict):
        items = sorted((str(k).encode("utf-8"), v) for k, v in value.items())
        return OBJECT, _encode_container([k for k, _ in items], [v for _, v in items])
    raise JSONFormatError(f"cannot store {type(value).__name__} in a JSON column")


def _encode_container(keys: list[bytes], values: list[Any]) -> bytes:
    count = len(values)
    head = 8 + len(keys) * _KEY_ENTRY.size + count * _VALUE_ENTRY.size
    key_bytes = bytearray()
    key_entries = bytearray()
    for k in keys:
        key_entries += _KEY_ENTRY.pack(head + len(key_bytes), len(k))
        key_bytes += k
    value_entries = bytearray()
    value_bytes = bytearray()
    start = head + len(key_bytes)
    for v in values:
        tp, body = _encode(v)
        if tp == LITERAL:
            value_entries += _VALUE_ENTRY.pack(tp, body[0])
        else:
            value_entries += _VALUE_ENTRY.pack(tp, start + len(value_bytes))
            value_bytes += body
    total = start + len(value_bytes)
    return _HEADER.pack(count, total) + key_entries + value_entries + key_bytes + value_bytes


def _put_uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
