"""TiDB row values: format v2 (encode and decode) and format v1 (decode).

Format v2 (TiDB ``rowcodec``; every multi-byte integer little-endian)::

    0x80                       version (128)
    flags                      0x01 large, 0x02 checksum follows the data
    uint16 N, uint16 M         not-null and null column counts
    N not-null column ids      ascending; 1 byte each, 4 if large
    M null column ids          ascending; same width
    N end offsets              of each not-null value in the data; 2 bytes each, 4 if large
    data                       the values (see :mod:`.values`), back to back
    [checksum]                 header byte (bit 3: a second checksum follows) + uint32 (+ uint32)

"Large" is set when a column id exceeds 255 or the data exceeds 65535 bytes.
A column in neither id list is *absent*: the reader fills it from the
schema (origin default, or the handle for a PK-is-handle column).
Checksums are accepted and skipped, not verified.

Format v1 (any value whose first byte is not 0x80): alternating
(column id, value) flag-prefixed datums (:mod:`.keydatum`); a lone NULL
datum is an empty row.

:func:`decode_row` returns ``{column id: raw bytes or None}``; the typed
value comes from :func:`decode_column` with the column's FieldType.
"""

from __future__ import annotations

import datetime as dt
import itertools
import struct
from collections.abc import Mapping
from typing import Any

from cdcflow.core.data.types import INT_TYPES, UINT_TYPES, TypeCode
from cdcflow.plugins.sources.tikv.tidb import jsonbin, keys, timecodec, values
from cdcflow.plugins.sources.tikv.tidb.fieldtype import STRING_TYPES, SUPPORTED_TYPES, TIME_TYPES, FieldType
from cdcflow.plugins.sources.tikv.tidb.keydatum import Datum, DatumKind, decode_datum

__all__ = [
    "CODEC_VERSION",
    "RawRow",
    "RowFormatError",
    "V1Row",
    "check_tail",
    "decode_column",
    "decode_row",
    "encode_row",
    "encode_row_raw",
    "value_from_datum",
]

CODEC_VERSION = 0x80
FLAG_LARGE = 0x01
FLAG_CHECKSUM = 0x02
_CHECKSUM_EXTRA = 0x08


class RowFormatError(ValueError):
    """A row value that is not well-formed."""


class V1Row(dict[int, Datum | None]):
    """A v1 row: column id → decoded datum (None for NULL)."""


#: What :func:`decode_row` returns: v2 raw value bytes per column id, or a V1Row.
RawRow = dict[int, bytes | None] | V1Row


# --------------------------------------------------------------------------- v2 encode


def encode_row_raw(columns: Mapping[int, bytes | None]) -> bytes:
    """A v2 row from already-encoded values (None = NULL), keyed by column id."""
    ids = sorted(columns)
    if ids and (ids[0] < 0 or ids[-1] > 0xFFFFFFFF):
        raise RowFormatError("column ids must be between 0 and 2^32-1")
    not_null = [cid for cid in ids if columns[cid] is not None]
    nulls = [cid for cid in ids if columns[cid] is None]
    parts = [columns[cid] or b"" for cid in not_null]
    data = b"".join(parts)
    large = (bool(ids) and ids[-1] > 255) or len(data) > 0xFFFF
    ends = list(itertools.accumulate(len(p) for p in parts))
    id_code, off_code = ("I", "I") if large else ("B", "H")
    header = struct.pack(
        f"<BBHH{len(ids)}{id_code}{len(ends)}{off_code}",
        CODEC_VERSION,
        FLAG_LARGE if large else 0,
        len(not_null),
        len(nulls),
        *not_null,
        *nulls,
        *ends,
    )
    return header + data


def encode_row(columns: Mapping[int, tuple[FieldType, Any]]) -> bytes:
    """A v2 row from Python values: ``{column id: (field type, value)}``, None = NULL."""
    return encode_row_raw({cid: None if v is None else values.encode_value(ft, v) for cid, (ft, v) in columns.items()})


# --------------------------------------------------------------------------- decode


def decode_row(data: bytes) -> RawRow:
    """Split a row value into its columns. Raises :class:`RowFormatError` when malformed."""
    if not data:
        raise RowFormatError("empty row value")
    if data[0] == CODEC_VERSION:
        return _decode_v2(data)
    return _decode_v1(data)


def _decode_v2(data: bytes) -> dict[int, bytes | None]:
    if len(data) < 6:
        raise RowFormatError(f"v2 row header needs 6 bytes, have {len(data)}")
    flags = data[1]
    n_not_null, n_null = struct.unpack_from("<HH", data, 2)
    large = bool(flags & FLAG_LARGE)
    id_size, off_size = (4, 4) if large else (1, 2)
    ids_end = 6 + (n_not_null + n_null) * id_size
    offs_end = ids_end + n_not_null * off_size
    if len(data) < offs_end:
        raise RowFormatError(f"v2 row of {len(data)} bytes is shorter than its {n_not_null + n_null} column headers")
    n = n_not_null + n_null
    ids = struct.unpack_from(f"<{n}{'I' if large else 'B'}", data, 6)
    ends = struct.unpack_from(f"<{n_not_null}{'I' if large else 'H'}", data, ids_end)
    if not (_ascending(ids[:n_not_null]) and _ascending(ids[n_not_null:])):
        raise RowFormatError("v2 row column ids are not strictly ascending")
    row: dict[int, bytes | None] = {}
    start = 0
    payload = data[offs_end:]
    for cid, end in zip(ids[:n_not_null], ends, strict=True):
        if end < start or end > len(payload):
            raise RowFormatError(f"v2 row offset {end} of column {cid} is out of order or past the data")
        row[cid] = payload[start:end]
        start = end
    for cid in ids[n_not_null:]:
        if cid in row:
            raise RowFormatError(f"v2 row lists column {cid} as both null and not null")
        row[cid] = None
    check_tail(flags, payload[start:])
    return row


def _ascending(ids: tuple[int, ...]) -> bool:
    return all(a < b for a, b in itertools.pairwise(ids))


def check_tail(flags: int, tail: bytes) -> None:
    """Check what follows the last value of a v2 row: nothing, or exactly its checksum."""
    if not flags & FLAG_CHECKSUM:
        if tail:
            raise RowFormatError(f"{len(tail)} stray bytes after the v2 row data")
        return
    expected = 1 + 4 + (4 if tail and tail[0] & _CHECKSUM_EXTRA else 0)
    if len(tail) != expected:
        raise RowFormatError(f"v2 row checksum should be {expected} bytes, found {len(tail)}")


def _decode_v1(data: bytes) -> V1Row:
    row = V1Row()
    try:
        first, pos = decode_datum(data, 0)
        if first.kind == DatumKind.NULL and pos == len(data):
            return row
        pos = 0
        while pos < len(data):
            cid, pos = decode_datum(data, pos)
            if cid.kind not in (DatumKind.INT, DatumKind.VARINT, DatumKind.UINT, DatumKind.UVARINT):
                raise RowFormatError(f"v1 row column id is a {cid.kind.name} datum")
            value, pos = decode_datum(data, pos)
            row[int(cid.value)] = None if value.kind == DatumKind.NULL else value
    except keys.KeyFormatError as e:
        raise RowFormatError(f"v1 row: {e}") from None
    return row


def decode_column(ft: FieldType, raw: bytes | Datum | None) -> Any:
    """The Python value of one column as :func:`decode_row` returned it."""
    if raw is None:
        return None
    if isinstance(raw, Datum):
        return value_from_datum(ft, raw)
    return values.decode_value(ft, raw)


def value_from_datum(ft: FieldType, datum: Datum) -> Any:
    """The Python value of a flag-prefixed datum (v1 rows, common handles) for a column of type ``ft``."""
    kind, v = datum.kind, datum.value
    tp = ft.tp
    if kind == DatumKind.NULL:
        return None
    if tp in TIME_TYPES and isinstance(v, int):
        return timecodec.unpack_time(v, date_only=tp in (TypeCode.DATE, TypeCode.NEWDATE), utc=tp == TypeCode.TIMESTAMP)
    if tp == TypeCode.DURATION and isinstance(v, int):
        return dt.timedelta(microseconds=v // 1000)
    if tp == TypeCode.BIT and isinstance(v, bytes):
        return int.from_bytes(v, "big")  # v1 rows keep BIT as its bytes
    if tp in INT_TYPES or tp in UINT_TYPES:
        if not isinstance(v, int):
            raise values.ValueFormatError(f"a {kind.name} datum in an integer column")
        return v & 0xFFFFFFFFFFFFFFFF if ft.unsigned and v < 0 else v
    if tp in STRING_TYPES and isinstance(v, bytes):
        return values.decode_value(ft, v)
    if tp == TypeCode.JSON and kind == DatumKind.JSON:
        return jsonbin.decode_json(v)
    if tp in (TypeCode.FLOAT, TypeCode.DOUBLE) and isinstance(v, float):
        return v
    if tp == TypeCode.NEWDECIMAL and kind == DatumKind.DECIMAL:
        return v
    if tp not in SUPPORTED_TYPES:
        raise values.UnsupportedColumnType(f"column type {tp} is not supported")
    raise values.ValueFormatError(f"a {kind.name} datum does not fit a column of type {tp}")
