"""Rows as the TiKV source mounts them, of every TiDB type, through the avro codec, the registry and back."""

from typing import Any

import pytest
from hypothesis import given, settings

from cdcflow.core.data.events import ColumnInfo, RowChange
from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.codecs.avro import AvroCodec, AvroConfig, AvroDecoder, SchemaRegistryClient
from cdcflow.plugins.codecs.columns import elements_of
from tests.integration.plugins.codecs.schema_registry import SchemaRegistryServer
from tests.unit.plugins.codecs.test_open_protocol_mounted import mounted
from tests.unit.plugins.sources.tikv.tidb.test_mounter import typed_rows

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry():
    server = SchemaRegistryServer()
    yield server
    server.close()


def avro_side(column: ColumnInfo, value: Any) -> Any:
    """What the decoder gives back for a mounted value: ENUM/SET as names, BIT as bytes, the rest unchanged."""
    if value is None:
        return None
    if column.type_code == TypeCode.ENUM:
        return elements_of(column)[value - 1]
    if column.type_code == TypeCode.SET:
        return ",".join(e for i, e in enumerate(elements_of(column)) if value >> i & 1)
    if column.type_code == TypeCode.BIT:
        return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
    return value


@settings(max_examples=60, deadline=None)
@given(typed_rows())
def test_every_mounted_type_round_trips(registry, case):
    change: RowChange = mounted(case)
    assert change.schema is not None and change.after is not None
    codec = AvroCodec(AvroConfig(schema_registry=registry.url, enable_tidb_extension=True))
    [message] = codec.encode_rows_for_topic("tidb_shop_wide", [change])
    decoded = AvroDecoder(SchemaRegistryClient(registry.url)).decode(message.key, message.value)
    columns = {c.name: c for c in change.schema.columns}
    assert decoded.value is not None
    assert decoded.value.fields == {name: avro_side(columns[name], v) for name, v in change.after.items()}
    assert decoded.key is not None and decoded.key.fields == {"id": change.after["id"]}
    assert decoded.op == "c" and decoded.commit_ts == change.commit_ts
