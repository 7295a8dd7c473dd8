"""The ``avro`` codec: TiCDC's Avro protocol, Confluent-framed, schemas in a Confluent Schema Registry.

One message per row change:

* **key** — the handle-key columns as an Avro record (none when the table has
  no handle key), registered under subject ``{topic}-key``;
* **value** — inserts and updates: every column of the new row (plus the
  TiDB extension fields when ``enable-tidb-extension``), registered under
  ``{topic}-value``; deletes: a tombstone (empty value, which message sinks
  send as a null value), with no extension fields even when the extension
  is on — TiCDC's documented behaviour, so that Confluent sink connectors'
  ``delete.on.null`` works;
* both framed as ``0x00`` + schema id (4 bytes big-endian) + Avro binary.

``{topic}`` is the Kafka topic with ``.`` replaced by ``_`` (TiCDC's
TopicNameStrategy); a sink that has no topic (the file sink) gets subjects
named ``{schema}_{table}``. Old values are not written (updates carry the
new row only), as in TiCDC.

DDL and resolved ts: none by default — consumers see schema changes as new
schema versions in the registry (a DDL that changes the table's columns
makes the next row register a new version and carry its new id). With
``enable-tidb-extension`` *and* ``avro-enable-watermark`` the codec also
writes TiCDC's test-only messages: a DDL is ``0x01`` + JSON
``{"query","type","schema","table","commitTs"}``, a resolved ts is ``0x02`` +
the ts as 8 bytes big-endian, both without a key.

Column types map as in :mod:`cdcflow.plugins.codecs.avro.types` (table in
docs/how-to/avro-schema-registry.md).

Guarantees: the same row and schema give the same bytes (schema ids
aside); a schema is posted once per subject and version and then served from
the client's cache. Not guaranteed: that encoding never waits — the first
row of each table version waits for the registry (``schema-registry-timeout``).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import fastavro

from cdcflow.core.data.codec import Codec, EncodedMessage
from cdcflow.core.data.events import ColumnInfo, DDLEvent, OpType, RowChange, TableName, tso_physical_ms
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin import PluginConfig
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.plugins.codecs.avro.config import AvroConfig
from cdcflow.plugins.codecs.avro.layout import RecordLayout, TableLayout, table_layout
from cdcflow.plugins.codecs.avro.registry import SchemaRegistryClient
from cdcflow.plugins.codecs.avro.types import encode_value
from cdcflow.plugins.codecs.avro.wire import DDL_BYTE, frame, frame_resolved
from cdcflow.plugins.codecs.columns import columns_of
from cdcflow.plugins.codecs.gojson import go_json
from cdcflow.plugins.codecs.open_protocol import MAX_RECORD_OVERHEAD, MessageTooLargeError, row_key_text

__all__ = ["AvroCodec", "subject_prefix"]

_OPS = {OpType.INSERT: "c", OpType.UPDATE: "u"}
_LAYOUT_CACHE_LIMIT = 4096
_LENGTH = struct.Struct(">Q")


def subject_prefix(topic: str, table: TableName) -> str:
    """``{topic}`` of the ``{topic}-key`` / ``{topic}-value`` subjects (dots → ``_``, as TiCDC)."""
    return (topic or f"{table.schema}_{table.table}").replace(".", "_")


class AvroCodec(Codec[AvroConfig]):
    """Confluent-framed Avro rows, schemas in a schema registry (TiCDC's Avro protocol)."""

    type_name = "avro"
    Config = AvroConfig
    file_extension = "avro"

    def __init__(self, config: AvroConfig) -> None:
        super().__init__(config)
        self._registry: SchemaRegistryClient | None = None
        # Layouts by table schema object (rows of one version share it) or by inferred columns.
        self._layouts: dict[object, tuple[object, TableLayout]] = {}

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, AvroConfig)
        problem = _registry_problem(config.schema_registry)
        return [("schema-registry", problem)] if problem else []

    @property
    def registry(self) -> SchemaRegistryClient:
        """The schema registry client (created on first use)."""
        if self._registry is None:
            problem = _registry_problem(self.config.schema_registry)
            if problem:
                raise ConfigInvalidError(problem, detail={"field": "schema-registry"})
            self._registry = SchemaRegistryClient(
                self.config.schema_registry, timeout=self.config.schema_registry_timeout
            )
        return self._registry

    # -- rows ---------------------------------------------------------------------------

    def encode_rows(self, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        return self.encode_rows_for_topic("", rows)

    def encode_rows_for_topic(self, topic: str, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        return [self._encode_row(topic, row) for row in rows]

    def _encode_row(self, topic: str, row: RowChange) -> EncodedMessage:
        layout = self.layout_of(row)
        prefix = subject_prefix(topic, row.table)
        where = f"table {row.table} (commit ts {row.commit_ts})"
        key = None
        if layout.key is not None:
            key = self._record(prefix + "-key", layout.key, row.image(), where)
        value = b""  # a delete is a tombstone
        if row.op is not OpType.DELETE:
            extra: dict[str, Any] = {}
            if self.config.enable_tidb_extension:
                extra = {
                    "_tidb_op": _OPS[row.op],
                    "_tidb_commit_ts": row.commit_ts,
                    "_tidb_commit_physical_time": tso_physical_ms(row.commit_ts),
                }
            value = self._record(prefix + "-value", layout.value, row.after or {}, where, extra)
        size = len(key or b"") + len(value) + MAX_RECORD_OVERHEAD
        if size > self.config.max_message_bytes:
            # TiCDC's Avro fails here too: a row is one message and cannot be split.
            raise MessageTooLargeError(
                f"row of {row.table} ({row_key_text(row)}) at commit ts {row.commit_ts} encodes to {size} bytes, "
                f"over max-message-bytes={self.config.max_message_bytes}",
                detail={"table": str(row.table), "row": row_key_text(row), "commit_ts": row.commit_ts, "bytes": size},
            )
        return EncodedMessage(key, value, row.table, 1, row.commit_ts)

    def _record(
        self,
        subject: str,
        layout: RecordLayout,
        image: Mapping[str, Any],
        where: str,
        extra: Mapping[str, Any] | None = None,
    ) -> bytes:
        record = {name: encode_value(codec, image.get(column), where) for name, column, codec in layout.fields}
        if extra:
            record.update(extra)
        schema_id = self.registry.register(subject, layout.text)
        out = io.BytesIO()
        fastavro.schemaless_writer(out, layout.parsed, record)
        return frame(schema_id, out.getvalue())

    def layout_of(self, row: RowChange) -> TableLayout:
        """Key and value schemas of ``row``'s table version (cached)."""
        schema = row.schema
        if schema is not None:
            hit = self._layouts.get(id(schema))
            if hit is not None and hit[0] is schema:
                return hit[1]
            columns: tuple[ColumnInfo, ...] = schema.columns
            cache_key: object = id(schema)
            owner: object = schema
        else:
            columns = tuple(columns_of(row).values())
            cache_key = owner = (row.table.schema, row.table.table, columns)
            hit = self._layouts.get(cache_key)
            if hit is not None:
                return hit[1]
        if len(self._layouts) >= _LAYOUT_CACHE_LIMIT:
            self._layouts.clear()
        layout = table_layout(row.table, columns, self.config)
        self._layouts[cache_key] = (owner, layout)
        return layout

    # -- DDL and resolved ts ------------------------------------------------------------

    @property
    def _watermarks(self) -> bool:
        return self.config.enable_tidb_extension and self.config.avro_enable_watermark

    def encode_ddl(self, ddl: DDLEvent) -> EncodedMessage | None:
        """None, unless enable-tidb-extension and avro-enable-watermark: then ``0x01`` + the DDL as JSON."""
        if not self._watermarks:
            return None
        table = ddl.table
        doc = {
            "query": ddl.query,
            "type": ddl.action_type,
            "schema": table.schema if table else "",
            "table": table.table if table else "",
            "commitTs": ddl.commit_ts,
        }
        return EncodedMessage(None, bytes([DDL_BYTE]) + go_json(doc), table, 0, ddl.commit_ts)

    def encode_resolved(self, ts: int) -> EncodedMessage | None:
        """None, unless enable-tidb-extension and avro-enable-watermark: then ``0x02`` + ts (8 bytes BE)."""
        if not self._watermarks:
            return None
        return EncodedMessage(None, frame_resolved(ts), None, 0, ts)

    def file_bytes(self, messages: Sequence[EncodedMessage]) -> bytes:
        """Records of ``LEN + key`` then ``LEN + value`` (8-byte big-endian lengths), as open-protocol files."""
        out = bytearray()
        for message in messages:
            key = message.key or b""
            out += _LENGTH.pack(len(key)) + key + _LENGTH.pack(len(message.value)) + message.value
        return bytes(out)


def _registry_problem(url: str) -> str:
    """What is wrong with a schema-registry URL, or "" when it is usable."""
    if not url:
        return "protocol=avro needs schema-registry=http://host:port (the Confluent Schema Registry's URL)"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"schema-registry must be an http(s)://[user:password@]host:port URL, got {url!r}"
    try:
        _ = parts.port
    except ValueError:
        return f"schema-registry has an invalid port: {url!r}"
    return ""
