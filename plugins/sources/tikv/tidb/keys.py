"""TiDB keys: comparable integers, record and index keys, memcomparable bytes.

Two forms of a key exist and must not be mixed up:

* the **raw** TiDB key, e.g. ``b"t" + encode_int(table_id) + b"_r" + handle``.
  TiKV's EventFeed reports rows under raw keys, and :class:`~cdcflow.core.data.events.Span`
  holds raw keys;
* the **memcomparable** form (:func:`encode_bytes`), in which transactional keys
  sit inside TiKV: region boundaries in PD and the ``start_key`` / ``end_key``
  of a ``ChangeDataRequest`` are in this form.

Layouts (all integers here are big-endian so that byte order = key order):

``encode_int(v)``
    8 bytes of ``v`` as uint64 with the sign bit flipped (``v ^ 1 << 63``).
record key
    ``'t' + encode_int(table_id) + '_r' + handle``; an int handle is
    ``encode_int(handle)`` (19-byte key), a common handle (clustered non-int
    primary key) is the key-encoding of the primary-key values (see
    :mod:`cdcflow.plugins.sources.tikv.tidb.keydatum`).
index key
    ``'t' + encode_int(table_id) + '_i' + encode_int(index_id) + values``.
``encode_bytes(b)``
    ``b`` in 8-byte groups, the last one zero-padded, each group followed by a
    marker byte ``0xFF - pad``; an input whose length is a multiple of 8 ends
    with an all-padding group ``00×8 F7``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "INDEX_PREFIX_SEP",
    "RECORD_PREFIX_SEP",
    "RECORD_ROW_KEY_LEN",
    "TABLE_PREFIX",
    "KeyFormatError",
    "RecordKey",
    "decode_bytes",
    "decode_int",
    "decode_record_key",
    "decode_table_id",
    "decode_uint",
    "encode_bytes",
    "encode_int",
    "encode_uint",
    "index_prefix",
    "is_index_key",
    "is_record_key",
    "record_key",
    "record_prefix",
    "table_prefix",
    "table_record_span",
]

TABLE_PREFIX = b"t"
RECORD_PREFIX_SEP = b"_r"
INDEX_PREFIX_SEP = b"_i"
#: Length of ``t{id}_r`` (the prefix before the handle).
RECORD_PREFIX_LEN = 1 + 8 + 2
#: Length of a record key with an int handle (TiDB's ``RecordRowKeyLen``).
RECORD_ROW_KEY_LEN = RECORD_PREFIX_LEN + 8

_SIGN_MASK = 1 << 63
_U64 = struct.Struct(">Q")
_GROUP = 8
_MARKER = 0xFF
_PAD = 0x00


class KeyFormatError(ValueError):
    """A byte string is not a well-formed key of the expected kind."""


# --------------------------------------------------------------- comparable ints


def encode_int(value: int) -> bytes:
    """8-byte comparable form of a signed 64-bit integer."""
    if not -(1 << 63) <= value < (1 << 63):
        raise KeyFormatError(f"{value} does not fit in a signed 64-bit integer")
    return _U64.pack((value & 0xFFFFFFFFFFFFFFFF) ^ _SIGN_MASK)


def decode_int(data: bytes, offset: int = 0) -> int:
    """The signed integer whose comparable form starts at ``data[offset]``."""
    if len(data) < offset + 8:
        raise KeyFormatError(f"need 8 bytes for a comparable int at offset {offset}, have {len(data) - offset}")
    raw: int = _U64.unpack_from(data, offset)[0]
    raw ^= _SIGN_MASK
    return raw - (1 << 64) if raw & _SIGN_MASK else raw


def encode_uint(value: int) -> bytes:
    """8-byte big-endian form of an unsigned 64-bit integer (already comparable)."""
    if not 0 <= value < (1 << 64):
        raise KeyFormatError(f"{value} does not fit in an unsigned 64-bit integer")
    return _U64.pack(value)


def decode_uint(data: bytes, offset: int = 0) -> int:
    if len(data) < offset + 8:
        raise KeyFormatError(f"need 8 bytes for a uint at offset {offset}, have {len(data) - offset}")
    value: int = _U64.unpack_from(data, offset)[0]
    return value


# --------------------------------------------------------------- memcomparable bytes


def encode_bytes(data: bytes) -> bytes:
    """Memcomparable form of ``data`` (TiDB ``codec.EncodeBytes``)."""
    out = bytearray()
    for start in range(0, len(data) + 1, _GROUP):
        group = data[start : start + _GROUP]
        pad = _GROUP - len(group)
        out += group
        out += bytes(pad)
        out.append(_MARKER - pad)
    return bytes(out)


def decode_bytes(data: bytes, offset: int = 0) -> tuple[bytes, int]:
    """Decode memcomparable bytes at ``data[offset:]``; returns (value, end offset).

    Raises :class:`KeyFormatError` on a truncated group, a bad marker or
    non-zero padding.
    """
    out = bytearray()
    pos = offset
    while True:
        if len(data) < pos + _GROUP + 1:
            raise KeyFormatError(f"truncated memcomparable group at offset {pos}")
        group = data[pos : pos + _GROUP]
        marker = data[pos + _GROUP]
        pos += _GROUP + 1
        pad = _MARKER - marker
        if pad == 0:
            out += group
            continue
        if pad > _GROUP:
            raise KeyFormatError(f"bad memcomparable marker 0x{marker:02x} at offset {pos - 1}")
        real = _GROUP - pad
        if any(group[real:]):
            raise KeyFormatError(f"non-zero memcomparable padding at offset {pos - 1 - pad}")
        out += group[:real]
        return bytes(out), pos


# --------------------------------------------------------------- table keys


def table_prefix(table_id: int) -> bytes:
    """``t{id}``: the prefix of every key of a physical table."""
    return TABLE_PREFIX + encode_int(table_id)


def record_prefix(table_id: int) -> bytes:
    """``t{id}_r``: the prefix of a physical table's row keys."""
    return table_prefix(table_id) + RECORD_PREFIX_SEP


def index_prefix(table_id: int, index_id: int) -> bytes:
    """``t{id}_i{index_id}``: the prefix of one index's keys."""
    return table_prefix(table_id) + INDEX_PREFIX_SEP + encode_int(index_id)


def record_key(table_id: int, handle: int | bytes) -> bytes:
    """The raw row key of ``handle``: an int handle, or an encoded common handle."""
    if isinstance(handle, int):
        return record_prefix(table_id) + encode_int(handle)
    if not handle:
        raise KeyFormatError("a common handle must not be empty")
    return record_prefix(table_id) + handle


def table_record_span(table_id: int) -> tuple[bytes, bytes]:
    """Raw ``[t{id}_r, t{id}_s)``: every row key of the table and no index key."""
    prefix = table_prefix(table_id)
    return prefix + RECORD_PREFIX_SEP, prefix + b"_s"


@dataclass(frozen=True, slots=True)
class RecordKey:
    """A decoded row key. ``handle`` is an int, or the encoded common-handle bytes."""

    table_id: int
    handle: int | bytes

    @property
    def is_int_handle(self) -> bool:
        return isinstance(self.handle, int)


def decode_table_id(key: bytes) -> int:
    """The table id of any ``t{id}...`` key."""
    if len(key) < 9 or key[:1] != TABLE_PREFIX:
        raise KeyFormatError(f"not a table key: {key.hex()}")
    return decode_int(key, 1)


def is_record_key(key: bytes) -> bool:
    return len(key) > RECORD_PREFIX_LEN and key[:1] == TABLE_PREFIX and key[9:11] == RECORD_PREFIX_SEP


def is_index_key(key: bytes) -> bool:
    return len(key) >= 19 and key[:1] == TABLE_PREFIX and key[9:11] == INDEX_PREFIX_SEP


def decode_record_key(key: bytes) -> RecordKey:
    """Split a raw row key into table id and handle.

    A key of exactly 19 bytes has an int handle (as TiDB's ``DecodeRowKey``
    decides); a longer one a common handle, returned still encoded.
    """
    if not is_record_key(key):
        raise KeyFormatError(f"not a record key: {key.hex()}")
    table_id = decode_int(key, 1)
    if len(key) == RECORD_ROW_KEY_LEN:
        return RecordKey(table_id, decode_int(key, RECORD_PREFIX_LEN))
    return RecordKey(table_id, key[RECORD_PREFIX_LEN:])
