"""Confluent's wire format, and TiCDC's two non-Avro message kinds that share its first byte.

A Confluent-framed record is ``0x00`` (magic byte), the schema id as 4 bytes
big-endian, then the Avro binary body written with that schema. With
``avro-enable-watermark`` TiCDC also sends messages whose first byte is
``0x01`` (a DDL: JSON follows) or ``0x02`` (a resolved ts: 8 bytes big-endian
follow); no Confluent deserializer reads those.
"""

from __future__ import annotations

import struct

from cdcflow.plugins.codecs.avro.errors import AvroFormatError

__all__ = ["CHECKPOINT_BYTE", "DDL_BYTE", "MAGIC_BYTE", "frame", "frame_resolved", "resolved_ts_of", "unframe"]

MAGIC_BYTE = 0
DDL_BYTE = 1
CHECKPOINT_BYTE = 2

_HEADER = struct.Struct(">BI")
_RESOLVED = struct.Struct(">BQ")


def frame(schema_id: int, body: bytes) -> bytes:
    """``0x00`` + schema id (uint32 big-endian) + Avro body."""
    return _HEADER.pack(MAGIC_BYTE, schema_id) + body


def unframe(data: bytes) -> tuple[int, bytes]:
    """Schema id and Avro body of a Confluent-framed record; AvroFormatError otherwise."""
    if len(data) < _HEADER.size:
        raise AvroFormatError(f"a Confluent Avro record has at least 5 bytes; got {len(data)}")
    magic, schema_id = _HEADER.unpack_from(data)
    if magic != MAGIC_BYTE:
        raise AvroFormatError(f"Confluent Avro records start with magic byte 0; got {magic}")
    return schema_id, data[_HEADER.size :]


def frame_resolved(ts: int) -> bytes:
    """``0x02`` + resolved ts (uint64 big-endian)."""
    return _RESOLVED.pack(CHECKPOINT_BYTE, ts)


def resolved_ts_of(data: bytes) -> int:
    if len(data) != _RESOLVED.size or data[0] != CHECKPOINT_BYTE:
        raise AvroFormatError(f"a resolved-ts message is 0x02 + 8 bytes; got {data[:16].hex()}")
    return int(_RESOLVED.unpack(data)[1])
