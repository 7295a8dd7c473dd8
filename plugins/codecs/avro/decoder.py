"""Reading avro-protocol messages back: for tools, consumers written in Python, and tests.

:meth:`AvroDecoder.decode` takes a Kafka message's key and value and tells
what it is:

* a row: key record and value record (column values as Python values, see
  :func:`~cdcflow.plugins.codecs.avro.types.from_avro`), ``op`` ``"c"`` /
  ``"u"`` from ``_tidb_op`` when the TiDB extension is on, else None (an
  insert or an update — TiCDC's protocol cannot tell them apart);
* a delete: a key and an empty or null value (a tombstone), ``op`` ``"d"``;
* with ``avro-enable-watermark``: a DDL (``0x01`` + JSON) or a resolved ts
  (``0x02`` + 8 bytes).

Schemas are fetched from the registry by the id in each record and cached.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any, Literal

import fastavro

from cdcflow.plugins.codecs.avro.errors import AvroFormatError
from cdcflow.plugins.codecs.avro.registry import SchemaRegistryClient
from cdcflow.plugins.codecs.avro.types import from_avro
from cdcflow.plugins.codecs.avro.wire import CHECKPOINT_BYTE, DDL_BYTE, resolved_ts_of, unframe

__all__ = ["AvroDecoder", "AvroMessage", "AvroRecord"]

_EXTENSION = ("_tidb_op", "_tidb_commit_ts", "_tidb_commit_physical_time")


@dataclass(frozen=True, slots=True)
class AvroRecord:
    """One decoded Confluent-framed record."""

    schema_id: int
    schema: dict[str, Any]
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AvroMessage:
    """What one message of the avro protocol says."""

    kind: Literal["row", "ddl", "resolved"]
    #: "c" / "u" (TiDB extension on), "d" (tombstone), or None (insert or update, extension off).
    op: str | None = None
    key: AvroRecord | None = None
    #: The value record's column fields (extension fields removed); None for deletes.
    value: AvroRecord | None = None
    commit_ts: int | None = None
    #: DDL messages: ``{"query", "type", "schema", "table", "commitTs"}``.
    ddl: dict[str, Any] = field(default_factory=dict)
    resolved_ts: int | None = None


class AvroDecoder:
    """Decodes avro-protocol messages, fetching writer schemas from the registry by id."""

    def __init__(self, registry: SchemaRegistryClient) -> None:
        self.registry = registry
        self._parsed: dict[int, tuple[dict[str, Any], Any]] = {}

    def record(self, data: bytes) -> AvroRecord:
        """The record in a Confluent-framed message (``0x00`` + id + Avro body)."""
        schema_id, body = unframe(data)
        schema, parsed = self._schema(schema_id)
        buffer = io.BytesIO(body)
        try:
            raw = fastavro.schemaless_reader(buffer, parsed, None)
        except (EOFError, ValueError, IndexError, UnicodeDecodeError) as exc:
            raise AvroFormatError(f"Avro body does not match schema {schema_id}: {exc}") from exc
        if buffer.tell() != len(body):
            raise AvroFormatError(f"{len(body) - buffer.tell()} bytes left after a record of schema {schema_id}")
        assert isinstance(raw, dict)
        types = {f["name"]: f["type"] for f in schema.get("fields", [])}
        return AvroRecord(schema_id, schema, {name: from_avro(types.get(name), v) for name, v in raw.items()})

    def decode(self, key: bytes | None, value: bytes | None) -> AvroMessage:
        """What the message with ``key`` and ``value`` carries."""
        if value and value[0] == DDL_BYTE:
            try:
                doc = json.loads(value[1:])
            except ValueError as exc:
                raise AvroFormatError(f"DDL message is not JSON: {exc}") from exc
            return AvroMessage("ddl", ddl=doc, commit_ts=doc.get("commitTs"))
        if value and value[0] == CHECKPOINT_BYTE:
            ts = resolved_ts_of(value)
            return AvroMessage("resolved", resolved_ts=ts, commit_ts=ts)
        key_record = self.record(key) if key else None
        if not value:
            if key_record is None:
                raise AvroFormatError("a message with neither key nor value")
            return AvroMessage("row", op="d", key=key_record)
        full = self.record(value)
        columns = {k: v for k, v in full.fields.items() if k not in _EXTENSION}
        op = full.fields.get("_tidb_op") or None
        commit_ts = full.fields.get("_tidb_commit_ts")
        value_record = AvroRecord(full.schema_id, full.schema, columns)
        return AvroMessage("row", op=op, key=key_record, value=value_record, commit_ts=commit_ts)

    def _schema(self, schema_id: int) -> tuple[dict[str, Any], Any]:
        hit = self._parsed.get(schema_id)
        if hit is None:
            schema = self.registry.schema_by_id(schema_id)
            # Read logical types as their raw values; from_avro converts them
            # (TIME values past 24 h would break fastavro's time-micros reader).
            hit = self._parsed[schema_id] = (schema, fastavro.parse_schema(_raw(schema)))
        return hit


def _raw(schema: Any) -> Any:
    """``schema`` without logicalType annotations."""
    if isinstance(schema, list):
        return [_raw(s) for s in schema]
    if isinstance(schema, dict):
        return {k: _raw(v) for k, v in schema.items() if k != "logicalType"}
    return schema
