"""Decoding TiCDC Open Protocol messages back into cdcflow events.

Used by the file sink's readers and by tools; it accepts what TiCDC itself
writes too (a resolved value of 8 zero bytes or none at all, ``rid``,
``ccl``). Row values come back as Python values by column type: ints,
floats, :class:`~decimal.Decimal`, dates/datetimes/timedeltas, ``bytes`` for
binary strings and BLOBs, ``str`` for text. Unknown key versions are refused.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cdcflow.core.data.events import ColumnInfo, DDLEvent, OpType, RowChange, TableName, TableSchema
from cdcflow.core.data.types import (
    BLOB_TYPES,
    CHAR_TYPES,
    DATE_TYPES,
    DATETIME_TYPES,
    DECIMAL_TYPES,
    FLOAT_TYPES,
    INT_TYPES,
    UINT_TYPES,
    TypeCode,
)
from cdcflow.core.errors import UnsupportedProtocolError
from cdcflow.plugins.codecs.gojson import go_unquote
from cdcflow.plugins.codecs.open_protocol import BATCH_VERSION, MessageType

__all__ = ["DecodedResolved", "decode_column_value", "decode_file", "decode_message", "split_frames"]


@dataclass(frozen=True, slots=True)
class DecodedResolved:
    """A resolved event: every change with commit ts ≤ ``ts`` in this partition was sent."""

    ts: int


DecodedEvent = RowChange | DDLEvent | DecodedResolved


def split_frames(data: bytes, *, where: str) -> list[bytes]:
    """The length-prefixed items of ``data`` (8-byte big-endian lengths)."""
    out = []
    pos = 0
    while pos < len(data):
        if pos + 8 > len(data):
            raise UnsupportedProtocolError(f"{where}: truncated length at byte {pos}")
        (length,) = struct.unpack_from(">Q", data, pos)
        pos += 8
        if pos + length > len(data):
            raise UnsupportedProtocolError(f"{where}: item of {length} bytes at byte {pos} runs past the end")
        out.append(data[pos : pos + length])
        pos += length
    return out


def decode_message(key: bytes, value: bytes | None) -> Iterator[DecodedEvent]:
    """Events of one message, in order.

    Anything that is not a message the encoder writes raises
    :class:`UnsupportedProtocolError` naming the key or value item (and the
    column) that is wrong: bad framing, bytes that are not JSON, JSON of the
    wrong shape, a value its column type cannot hold.
    """
    if len(key) < 8:
        raise UnsupportedProtocolError("open-protocol key shorter than its 8-byte version")
    (version,) = struct.unpack_from(">Q", key, 0)
    if version != BATCH_VERSION:
        raise UnsupportedProtocolError(f"open-protocol key version {version}; only version {BATCH_VERSION} exists")
    keys = split_frames(key[8:], where="open-protocol key")
    values = split_frames(value or b"", where="open-protocol value")
    for i, key_json in enumerate(keys):
        where = f"open-protocol key item {i}"
        head = _json_object(key_json, where)
        kind = head.get("t")
        ts = _int_field(head, "ts", where)
        if kind == MessageType.RESOLVED:
            yield DecodedResolved(ts)
            continue
        if kind not in (MessageType.DDL, MessageType.ROW):
            raise UnsupportedProtocolError(f"{where}: unknown type {kind!r}")
        if i >= len(values):
            raise UnsupportedProtocolError(f"open-protocol message has {len(keys)} keys but {len(values)} values")
        where = f"open-protocol value item {i}"
        body = _json_object(values[i], where)
        schema, name, partition = head.get("scm", ""), head.get("tbl", ""), head.get("ptn")
        if not isinstance(schema, str) or not isinstance(name, str) or not isinstance(partition, int | None):
            raise UnsupportedProtocolError(f"open-protocol key item {i}: scm and tbl must be strings, ptn an integer")
        table = TableName(schema, name, partition_id=partition)
        if kind == MessageType.DDL:
            query = body.get("q", "")
            if not isinstance(query, str):
                raise UnsupportedProtocolError(f"{where}: the DDL query q is not a string")
            yield DDLEvent(ts, query, table, _int_field(body, "t", where, default=0))
        else:
            yield _row(table, ts, body, where)


def _json_object(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data, parse_float=decimal.Decimal)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError; nesting past the stack
        raise UnsupportedProtocolError(f"{where} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise UnsupportedProtocolError(f"{where} is a JSON {type(doc).__name__}, not an object")
    return doc


def _int_field(doc: Mapping[str, Any], field: str, where: str, *, default: int | None = None) -> int:
    raw = doc.get(field, default)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise UnsupportedProtocolError(f"{where}: {field!r} must be an integer, found {raw!r:.40}")
    return raw


def decode_file(data: bytes) -> Iterator[DecodedEvent]:
    """Events of an open-protocol file written by the file sink (records of key then value)."""
    items = split_frames(data, where="open-protocol file")
    if len(items) % 2:
        raise UnsupportedProtocolError("open-protocol file ends with a key and no value")
    for i in range(0, len(items), 2):
        yield from decode_message(items[i], items[i + 1])


#: What a column value that its type cannot hold raises while being converted.
_VALUE_ERRORS = (ValueError, TypeError, ArithmeticError)


def _row(table: TableName, ts: int, body: Mapping[str, Any], where: str) -> RowChange:
    columns: dict[str, ColumnInfo] = {}

    def image(part_name: str) -> dict[str, Any] | None:
        part = body.get(part_name)
        if part is None:
            return None
        if not isinstance(part, dict):
            raise UnsupportedProtocolError(f"{where}: {part_name!r} is not an object of columns")
        out = {}
        for name, col in part.items():
            at = f"{where}: column {name!r} of {part_name!r}"
            if not isinstance(col, dict):
                raise UnsupportedProtocolError(f"{at} is not an object")
            info = ColumnInfo(name, _int_field(col, "t", at), _int_field(col, "f", at, default=0))
            columns.setdefault(name, info)
            try:
                out[name] = decode_column_value(info, col.get("v"))
            except _VALUE_ERRORS as e:
                raise UnsupportedProtocolError(
                    f"{at}: value {col.get('v')!r:.60} is not a type {info.type_code}: {e}"
                ) from None
        return out

    after, before, deleted = image("u"), image("p"), image("d")
    if deleted is not None:
        op, after, before = OpType.DELETE, None, deleted
    else:
        op = OpType.UPDATE if before is not None else OpType.INSERT
    schema = TableSchema(table, tuple(columns[n] for n in sorted(columns)))
    return RowChange(table, op, ts, 0, after, before, schema)


def decode_column_value(column: ColumnInfo, raw: Any) -> Any:
    """The Python value of a column's ``v`` (inverse of the encoder's value table)."""
    code = column.type_code
    binary = bool(column.flags & ColumnInfo.BINARY)
    if raw is None:
        return None
    if code in INT_TYPES or code in UINT_TYPES:
        return int(raw) if isinstance(raw, int | decimal.Decimal) else raw
    if code in FLOAT_TYPES:
        return float(raw)
    if code in DECIMAL_TYPES:
        return decimal.Decimal(str(raw))
    if code in DATE_TYPES:
        return _parse(raw, dt.date.fromisoformat)
    if code == TypeCode.TIMESTAMP:  # written in UTC, as the TiKV source gives it
        return _parse(raw, lambda s: dt.datetime.fromisoformat(s).replace(tzinfo=dt.UTC))
    if code in DATETIME_TYPES:
        return _parse(raw, dt.datetime.fromisoformat)
    if code == TypeCode.DURATION:
        return _parse(raw, _duration)
    if code in BLOB_TYPES:
        data = base64.b64decode(raw, validate=True)
        return data if binary else data.decode("utf-8")
    if code in CHAR_TYPES:
        return go_unquote(raw) if binary else raw
    return raw


def _parse(text: str, parse: Any) -> Any:
    if not isinstance(text, str):
        raise TypeError(f"a {type(text).__name__} where a date or time text belongs")
    try:
        return parse(text)
    except (ValueError, OverflowError):
        return text  # zero dates and other values Python cannot hold stay strings


def _duration(text: str) -> dt.timedelta:
    sign = -1 if text.startswith("-") else 1
    hours, minutes, seconds = text.lstrip("-").split(":")
    whole, _, frac = seconds.partition(".")
    micros = int((frac + "000000")[:6]) if frac else 0
    delta = dt.timedelta(hours=int(hours), minutes=int(minutes), seconds=int(whole), microseconds=micros)
    return delta * sign


def _event_json(event: DecodedEvent) -> dict[str, Any]:
    def plain(image: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if image is None:
            return None
        return {
            k: v.hex() if isinstance(v, bytes) else v if isinstance(v, int | float | None) else str(v)
            for k, v in image.items()
        }

    if isinstance(event, DecodedResolved):
        return {"type": "resolved", "ts": event.ts}
    if isinstance(event, DDLEvent):
        table = event.table or TableName("", "")
        return {
            "type": "ddl",
            "ts": event.commit_ts,
            "schema": table.schema,
            "table": table.table,
            "query": event.query,
        }
    return {
        "type": event.op.value,
        "ts": event.commit_ts,
        "schema": event.table.schema,
        "table": event.table.table,
        "after": plain(event.after),
        "before": plain(event.before),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the events of open-protocol files (written by the file sink) as JSON lines."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m cdcflow.plugins.codecs.open_protocol_decode", description=main.__doc__
    )
    parser.add_argument("files", nargs="+", help="*.op files")
    args = parser.parse_args(argv)
    for name in args.files:
        with open(name, "rb") as fh:
            for event in decode_file(fh.read()):
                sys.stdout.write(json.dumps(_event_json(event), ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
