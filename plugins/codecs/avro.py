"""The ``avro`` codec: Confluent-framed Avro with a schema registry (TiCDC's Avro shape).

Each row change becomes a message whose key is the row's handle-key columns
and whose value is the whole row, both as Avro records in Confluent's wire
format: magic byte ``0``, the schema id (4 bytes big-endian) from the
registry, then Avro binary. Schemas are registered over the Confluent Schema
Registry REST API (``POST /subjects/{subject}/versions``) and cached.

Shape, as TiCDC writes it: the value record is named after the table in
namespace ``default.{schema}``, one field per column (nullable columns as
``["null", T]`` with default null); inserts and updates carry the new row; a
delete is a tombstone (null value) unless ``enable-tidb-extension`` is set,
in which case it carries the old row, and every value has ``_tidb_op``
(``c``/``u``/``d``), ``_tidb_commit_ts`` and ``_tidb_commit_physical_time``.
Types: integers → int/long (unsigned INT → long; unsigned BIGINT → long or
string per ``avro-bigint-unsigned-handling-mode``), FLOAT → float, DOUBLE →
double, DECIMAL → ``bytes`` with logical type decimal when the column's
``sql_type`` gives precision and scale and ``avro-decimal-handling-mode`` is
``precise`` (else string), dates and times → string, BIT and binary strings
→ bytes, other strings, ENUM, SET and JSON → string.

Differences from TiCDC: subjects use the record-name strategy
(``default.{schema}.{table}-key`` / ``-value``), because a codec does not
know the topic a message goes to; DDL and resolved events are not sent (a
DDL message is empty, resolved events are none), as TiCDC does without
``avro-enable-watermark``.
"""

from __future__ import annotations

import decimal
import io
import json
import re
import struct
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from cdcflow.core.codec import Codec, EncodedMessage
from cdcflow.core.errors import ConfigInvalidError, DownstreamUnavailableError
from cdcflow.core.events import ColumnInfo, DDLEvent, OpType, RowChange, tso_physical_ms
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.plugins.codecs.columns import TypeCode, columns_of, format_date_value

__all__ = ["AvroCodec", "AvroConfig", "SchemaRegistry", "avro_field_type"]

_NAME = re.compile(r"[^A-Za-z0-9_]")
_DECIMAL = re.compile(r"decimal\((\d+)\s*,\s*(\d+)\)", re.IGNORECASE)


class AvroConfig(PluginConfig):
    """Options of the avro codec (the Kafka sink passes its own values)."""

    schema_registry: str = Field("", description="Confluent Schema Registry URL, e.g. http://127.0.0.1:8081.")
    enable_tidb_extension: bool = Field(
        False, description="Add _tidb_op/_tidb_commit_ts fields; deletes carry the row."
    )
    avro_decimal_handling_mode: Literal["precise", "string"] = Field(
        "precise", description="DECIMAL as Avro decimal bytes (precise) or as string."
    )
    avro_bigint_unsigned_handling_mode: Literal["long", "string"] = Field(
        "long", description="BIGINT UNSIGNED as long (wraps above 2^63-1) or as string."
    )


class SchemaRegistry:
    """A minimal Confluent Schema Registry client: register a schema, get its id (cached)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        if not url:
            raise ConfigInvalidError("the avro protocol needs schema-registry=http://host:port")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._ids: dict[tuple[str, str], int] = {}

    def register(self, subject: str, schema: Mapping[str, Any]) -> int:
        text = json.dumps(schema, separators=(",", ":"), sort_keys=True)
        cached = self._ids.get((subject, text))
        if cached is not None:
            return cached
        body = json.dumps({"schema": text}).encode()
        request = urllib.request.Request(
            f"{self.url}/subjects/{subject}/versions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                schema_id = int(json.loads(response.read())["id"])
        except (OSError, ValueError, KeyError) as exc:
            raise DownstreamUnavailableError(
                f"schema registry {self.url}: cannot register subject {subject!r}: {exc}"
            ) from exc
        self._ids[(subject, text)] = schema_id
        return schema_id


def _decimal_params(column: ColumnInfo) -> tuple[int, int] | None:
    match = _DECIMAL.search(column.sql_type)
    return (int(match.group(1)), int(match.group(2))) if match else None


def avro_field_type(column: ColumnInfo, config: AvroConfig) -> Any:
    """The Avro type of ``column`` (without the null union)."""
    code, unsigned = column.type_code, bool(column.flags & ColumnInfo.UNSIGNED)
    if code in (TypeCode.TINY, TypeCode.SHORT, TypeCode.INT24, TypeCode.YEAR):
        return "int"
    if code == TypeCode.LONG:
        return "long" if unsigned else "int"
    if code == TypeCode.LONGLONG:
        return "string" if unsigned and config.avro_bigint_unsigned_handling_mode == "string" else "long"
    if code == TypeCode.FLOAT:
        return "float"
    if code == TypeCode.DOUBLE:
        return "double"
    if code in TypeCode.DECIMALS:
        params = _decimal_params(column)
        if params and config.avro_decimal_handling_mode == "precise":
            return {"type": "bytes", "logicalType": "decimal", "precision": params[0], "scale": params[1]}
        return "string"
    if code == TypeCode.BIT or (
        column.flags & ColumnInfo.BINARY and (code in TypeCode.STRINGS or code in TypeCode.BLOBS)
    ):
        return "bytes"
    return "string"


def _avro_value(column: ColumnInfo, avro_type: Any, value: Any) -> Any:
    if value is None:
        return None
    if avro_type in ("int", "long"):
        return int.from_bytes(value, "big") if isinstance(value, bytes) else int(value)
    if avro_type in ("float", "double"):
        return float(value)
    if isinstance(avro_type, dict):
        scale = avro_type["scale"]
        return decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-scale))
    if avro_type == "bytes":
        return bytes(value) if not isinstance(value, int) else value.to_bytes((value.bit_length() + 7) // 8 or 1, "big")
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, str | int | float):
        return str(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return format_date_value(column.type_code, value)


class AvroCodec(Codec[AvroConfig]):
    """Confluent-framed Avro rows with schemas in a schema registry (TiCDC's Avro protocol)."""

    type_name = "avro"
    Config = AvroConfig
    file_extension = "avro"

    def __init__(self, config: AvroConfig) -> None:
        super().__init__(config)
        self._registry: SchemaRegistry | None = None
        self._parsed: dict[str, Any] = {}

    @property
    def registry(self) -> SchemaRegistry:
        if self._registry is None:
            self._registry = SchemaRegistry(self.config.schema_registry)
        return self._registry

    def schemas(self, row: RowChange) -> tuple[dict[str, Any], dict[str, Any], dict[str, ColumnInfo]]:
        """Key schema, value schema and the columns they were built from."""
        columns = dict(columns_of(row))
        if row.schema is not None:
            columns = {c.name: c for c in row.schema.columns} | columns
        namespace = "default." + _NAME.sub("_", row.table.schema)
        name = _NAME.sub("_", row.table.table) or "table"

        def field(column: ColumnInfo) -> dict[str, Any]:
            avro_type = avro_field_type(column, self.config)
            if column.flags & ColumnInfo.NULLABLE or not column.flags & ColumnInfo.HANDLE_KEY:
                return {"name": _NAME.sub("_", column.name), "type": ["null", avro_type], "default": None}
            return {"name": _NAME.sub("_", column.name), "type": avro_type}

        fields = [field(c) for c in columns.values()]
        if self.config.enable_tidb_extension:
            fields += [
                {"name": "_tidb_op", "type": "string"},
                {"name": "_tidb_commit_ts", "type": "long"},
                {"name": "_tidb_commit_physical_time", "type": "long"},
            ]
        value = {"type": "record", "name": name, "namespace": namespace, "fields": fields}
        handle = [field(c) for c in columns.values() if c.is_handle_key]
        key = {"type": "record", "name": name + "_key", "namespace": namespace, "fields": handle}
        return key, value, columns

    def _encode(self, subject: str, schema: dict[str, Any], record: Mapping[str, Any]) -> bytes:
        import fastavro

        schema_id = self.registry.register(subject, schema)
        text = json.dumps(schema, sort_keys=True)
        parsed = self._parsed.get(text)
        if parsed is None:
            parsed = self._parsed[text] = fastavro.parse_schema(schema)
        out = io.BytesIO()
        out.write(b"\0" + struct.pack(">I", schema_id))
        fastavro.schemaless_writer(out, parsed, dict(record))
        return out.getvalue()

    def encode_rows(self, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        return [self._encode_row(row) for row in rows]

    def _encode_row(self, row: RowChange) -> EncodedMessage:
        key_schema, value_schema, columns = self.schemas(row)
        types = {f["name"]: _plain(f["type"]) for f in value_schema["fields"]}
        image = row.image()

        def record(names: Sequence[str]) -> dict[str, Any]:
            out = {}
            for name in names:
                field = _NAME.sub("_", name)
                out[field] = _avro_value(columns[name], types[field], image.get(name))
            return out

        subject = f"{value_schema['namespace']}.{value_schema['name']}"
        key_record = record([n for n, c in columns.items() if c.is_handle_key])
        key = self._encode(subject + "-key", key_schema, key_record) if key_schema["fields"] else None
        value = b""  # a delete is a tombstone unless the TiDB extension is on
        if row.op is not OpType.DELETE or self.config.enable_tidb_extension:
            fields = record(list(columns))
            if self.config.enable_tidb_extension:
                fields["_tidb_op"] = {OpType.INSERT: "c", OpType.UPDATE: "u", OpType.DELETE: "d"}[row.op]
                fields["_tidb_commit_ts"] = row.commit_ts
                fields["_tidb_commit_physical_time"] = tso_physical_ms(row.commit_ts)
            value = self._encode(subject + "-value", value_schema, fields)
        return EncodedMessage(key, value, row.table, 1, row.commit_ts)

    def encode_ddl(self, ddl: DDLEvent) -> EncodedMessage | None:
        """None: the avro protocol sends no DDL (consumers see schema changes in the registry)."""
        return None

    def encode_resolved(self, ts: int) -> EncodedMessage | None:
        return None


def _plain(avro_type: Any) -> Any:
    """The non-null branch of a nullable union."""
    if isinstance(avro_type, list):
        return next(t for t in avro_type if t != "null")
    return avro_type


@hookimpl
def cdcflow_register_codecs(registry: Registrar[Codec[Any]]) -> None:
    registry.add(AvroCodec)
