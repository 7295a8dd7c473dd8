"""The avro codec against a schema registry over HTTP, and through the Kafka sink on the mock cluster."""

from __future__ import annotations

import dataclasses
import decimal
import io
import json
import struct
import uuid

import fastavro
import pytest

from cdcflow.core.errors import DownstreamUnavailableError
from cdcflow.core.events import ColumnInfo, MicroBatch, TableSchema
from cdcflow.core.sink import SinkContext
from cdcflow.core.testing import delete, insert, update
from cdcflow.plugins.codecs.avro import AvroCodec, AvroConfig
from cdcflow.plugins.sinks.kafka import KafkaSink, KafkaSinkConfig
from cdcflow.plugins.sinks.kafka.dispatch import DispatchRule
from tests.integration.open_protocol_consumer import read_topic
from tests.integration.schema_registry import SchemaRegistryServer

pytestmark = pytest.mark.integration

PK = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY
COLUMNS = (
    ColumnInfo("id", 8, PK),
    ColumnInfo("price", 246, ColumnInfo.NULLABLE, sql_type="decimal(10,2)"),
    ColumnInfo("name", 15, ColumnInfo.NULLABLE),
    ColumnInfo("raw", 252, ColumnInfo.NULLABLE | ColumnInfo.BINARY),
)


@pytest.fixture
def registry():
    server = SchemaRegistryServer()
    yield server
    server.close()


def typed(change):
    return dataclasses.replace(change, schema=TableSchema(change.table, COLUMNS))


def decode(registry: SchemaRegistryServer, data: bytes) -> tuple[int, dict]:
    assert data[0] == 0, "Confluent wire format starts with magic byte 0"
    (schema_id,) = struct.unpack(">I", data[1:5])
    schema = fastavro.parse_schema(json.loads(registry.schemas[schema_id]))
    return schema_id, fastavro.schemaless_reader(io.BytesIO(data[5:]), schema)


def test_rows_in_confluent_wire_format(registry):
    codec = AvroCodec(AvroConfig(schema_registry=registry.url, enable_tidb_extension=True))
    row = typed(
        insert(
            "shop",
            "orders",
            {"id": 7, "price": decimal.Decimal("9.5"), "name": "a", "raw": b"\0\1"},
            commit_ts=(1000 << 18) + 3,
        )
    )
    [message] = codec.encode_rows([row])
    _, key = decode(registry, message.key)
    assert key == {"id": 7}
    _, value = decode(registry, message.value)
    assert value == {
        "id": 7,
        "price": decimal.Decimal("9.50"),
        "name": "a",
        "raw": b"\0\1",
        "_tidb_op": "c",
        "_tidb_commit_ts": (1000 << 18) + 3,
        "_tidb_commit_physical_time": 1000,
    }
    assert sorted(registry.subjects) == ["default.shop.orders-key", "default.shop.orders-value"]
    # the schema is registered once and reused
    codec.encode_rows([row, row])
    assert len(registry.schemas) == 2


def test_delete_is_a_tombstone_without_extension(registry):
    codec = AvroCodec(AvroConfig(schema_registry=registry.url))
    [message] = codec.encode_rows([typed(delete("shop", "orders", {"id": 7, "name": "a"}, commit_ts=10))])
    assert message.value == b"" and decode(registry, message.key)[1] == {"id": 7}
    assert codec.encode_resolved(10) is None


def test_registry_down_is_downstream_unavailable(registry):
    url = registry.url
    registry.close()
    codec = AvroCodec(AvroConfig(schema_registry=url))
    with pytest.raises(DownstreamUnavailableError):
        codec.encode_rows([typed(insert("shop", "orders", {"id": 1}, commit_ts=10))])


def test_avro_through_the_kafka_sink(registry):
    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(
        KafkaSinkConfig(
            uri=f"kafka://mock/{topic}?protocol=avro",
            topic=topic,
            protocol="avro",
            schema_registry=registry.url,
            dispatchers=[DispatchRule(matcher=["shop.*"], topic=topic + "_{schema}_{table}", partition="index-value")],
        )
    )
    sink.open(SinkContext("cf"))
    rows = (
        typed(insert("shop", "orders", {"id": 1, "price": decimal.Decimal("1.25"), "name": "x"}, commit_ts=10)),
        typed(update("shop", "orders", {"id": 1, "name": "x"}, {"id": 1, "name": "y"}, commit_ts=11)),
        typed(delete("shop", "orders", {"id": 1, "name": "y"}, commit_ts=12)),
    )
    sink.write_batch(MicroBatch("cf", 0, 0, 20, rows))
    messages = [m for ms in read_topic(sink.bootstrap_servers, f"{topic}_shop_orders").values() for m in ms]
    assert [decode(registry, k)[1] for k, _ in messages] == [{"id": 1}] * 3
    values = [decode(registry, v)[1]["name"] if v else None for _, v in messages]
    assert values == ["x", "y", None]
    sink.close()
