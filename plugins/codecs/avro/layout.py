"""A table's key and value Avro schemas, built once per table schema version.

Both records are named after the table, in namespace ``default.{schema}``
(TiCDC's changefeed namespace is ``default``), names sanitized to Avro's
alphabet. The key record has the handle-key columns; the value record has
every column and, with ``enable-tidb-extension``, ``_tidb_op`` (string),
``_tidb_commit_ts`` and ``_tidb_commit_physical_time`` (long), each with a
default so that turning the extension on is a compatible change. Nullable
columns are ``["null", T]`` unions with default null; NOT NULL columns are
plain ``T`` without a default, so adding a NOT NULL column is a change that a
registry with BACKWARD compatibility refuses, as TiCDC's users see it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fastavro

from cdcflow.core.data.events import ColumnInfo, TableName
from cdcflow.plugins.codecs.avro.config import AvroConfig
from cdcflow.plugins.codecs.avro.errors import AvroEncodeError
from cdcflow.plugins.codecs.avro.registry import schema_text
from cdcflow.plugins.codecs.avro.types import ColumnCodec, column_codec, sanitize_name

__all__ = ["EXTENSION_FIELDS", "NAMESPACE", "RecordLayout", "TableLayout", "table_layout"]

NAMESPACE = "default"
EXTENSION_FIELDS: tuple[dict[str, Any], ...] = (
    {"name": "_tidb_op", "type": "string", "default": ""},
    {"name": "_tidb_commit_ts", "type": "long", "default": 0},
    {"name": "_tidb_commit_physical_time", "type": "long", "default": 0},
)


@dataclass(frozen=True, slots=True)
class RecordLayout:
    """One record schema: its fields (Avro name, column name, codec), JSON text and parsed form."""

    fields: tuple[tuple[str, str, ColumnCodec], ...]
    schema: dict[str, Any]
    text: str
    parsed: Any


@dataclass(frozen=True, slots=True)
class TableLayout:
    key: RecordLayout | None
    value: RecordLayout


def _field(name: str, codec: ColumnCodec) -> dict[str, Any]:
    if codec.nullable:
        return {"name": name, "type": ["null", codec.avro_type], "default": None}
    return {"name": name, "type": codec.avro_type}


def _record(table: TableName, columns: Sequence[ColumnInfo], config: AvroConfig, extension: bool) -> RecordLayout:
    fields = tuple((sanitize_name(c.name), c.name, column_codec(c, config)) for c in columns)
    schema: dict[str, Any] = {
        "type": "record",
        "name": sanitize_name(table.table),
        "namespace": f"{NAMESPACE}.{sanitize_name(table.schema)}",
        "fields": [_field(name, codec) for name, _, codec in fields] + (list(EXTENSION_FIELDS) if extension else []),
    }
    try:
        parsed = fastavro.parse_schema(schema)
    except (fastavro.schema.SchemaParseException, ValueError) as exc:
        names = [name for name, _, _ in fields]
        raise AvroEncodeError(
            f"{table}: its columns make no valid Avro record ({exc}); Avro field names {names} must be unique",
        ) from exc
    return RecordLayout(fields, schema, schema_text(schema), parsed)


def table_layout(table: TableName, columns: Sequence[ColumnInfo], config: AvroConfig) -> TableLayout:
    """Key and value records of ``table`` with ``columns``; no key record when no column is a handle key."""
    keys = [c for c in columns if c.is_handle_key]
    key = _record(table, keys, config, extension=False) if keys else None
    return TableLayout(key, _record(table, columns, config, extension=config.enable_tidb_extension))
