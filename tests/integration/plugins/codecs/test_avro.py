"""The avro codec against a Confluent-REST schema registry over HTTP, and through the Kafka sink's mock cluster."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.data.events import ColumnInfo, DDLEvent, MicroBatch, RowChange, TableSchema, tso_from_ms
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.data.types import TypeCode as T
from cdcflow.core.errors import DownstreamUnavailableError, ErrorCode, Retryable
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import delete, insert, update
from cdcflow.core.testing.open_protocol import read_topic
from cdcflow.plugins.codecs.avro import (
    AvroCodec,
    AvroConfig,
    AvroDecoder,
    SchemaIncompatibleError,
    SchemaNotFoundError,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from cdcflow.plugins.codecs.open_protocol import MessageTooLargeError
from cdcflow.plugins.sinks.kafka import KafkaSink, KafkaSinkConfig
from cdcflow.plugins.sinks.kafka.dispatch import DispatchRule
from tests.integration.plugins.codecs.schema_registry import SchemaRegistryServer

#: The plugin manager sinks are opened with (their codecs are plugins).
PLUGINS = PluginManager.default(autoload=False)

pytestmark = pytest.mark.integration

PK = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY
N = ColumnInfo.NULLABLE
U = ColumnInfo.UNSIGNED
B = ColumnInfo.BINARY
UTC = dt.UTC

#: One column of every type the mounter produces: (column, value as the mounter gives it, value decoded back
#: in the default modes).
EVERY_TYPE: tuple[tuple[ColumnInfo, Any, Any], ...] = (
    (ColumnInfo("id", T.LONGLONG, PK, "bigint"), 7, 7),
    (ColumnInfo("c_tiny", T.TINY, N, "tinyint"), -128, -128),
    (ColumnInfo("c_tiny_u", T.TINY, N | U, "tinyint unsigned"), 255, 255),
    (ColumnInfo("c_short", T.SHORT, N, "smallint"), -32768, -32768),
    (ColumnInfo("c_medium_u", T.INT24, N | U, "mediumint unsigned"), 16777215, 16777215),
    (ColumnInfo("c_int", T.LONG, N, "int"), -(2**31), -(2**31)),
    (ColumnInfo("c_int_u", T.LONG, N | U, "int unsigned"), 2**32 - 1, 2**32 - 1),
    (ColumnInfo("c_bigint", T.LONGLONG, N, "bigint"), -(2**63), -(2**63)),
    (ColumnInfo("c_bigint_u", T.LONGLONG, N | U, "bigint unsigned"), 2**64 - 1, 2**64 - 1),
    (ColumnInfo("c_float", T.FLOAT, N, "float"), 1.5, 1.5),
    (ColumnInfo("c_double", T.DOUBLE, N, "double"), -2.25e300, -2.25e300),
    (
        ColumnInfo("c_decimal", T.NEWDECIMAL, N, "decimal(30,10)"),
        decimal.Decimal("-12345678901234567890.0123456789"),
        decimal.Decimal("-12345678901234567890.0123456789"),
    ),
    (ColumnInfo("c_varchar", T.VARCHAR, N, "varchar(64)"), "héllo 世界", "héllo 世界"),
    (ColumnInfo("c_char", T.STRING, N, "char(4)"), "ab", "ab"),
    (ColumnInfo("c_text", T.BLOB, N, "text"), "long text", "long text"),
    (ColumnInfo("c_binary", T.STRING, N | B, "binary(4)"), b"\x00\x01\x02\x03", b"\x00\x01\x02\x03"),
    (ColumnInfo("c_varbinary", T.VARCHAR, N | B, "varbinary(8)"), b"\xff\x00", b"\xff\x00"),
    (ColumnInfo("c_blob", T.BLOB, N | B, "blob"), b"\x00" * 3, b"\x00" * 3),
    (ColumnInfo("c_bit", T.BIT, N | U, "bit(12)"), 0xABC, b"\x0a\xbc"),
    (ColumnInfo("c_enum", T.ENUM, N, "enum('small','large')"), 2, "large"),
    (ColumnInfo("c_set", T.SET, N, "set('r','w','x')"), 0b011, "r,w"),
    (ColumnInfo("c_json", T.JSON, N, "json"), '{"a": [1, true]}', '{"a": [1, true]}'),
    (ColumnInfo("c_year", T.YEAR, N, "year"), 2024, 2024),
    (ColumnInfo("c_date", T.DATE, N, "date"), dt.date(1000, 1, 2), dt.date(1000, 1, 2)),
    (
        ColumnInfo("c_datetime", T.DATETIME, N, "datetime(6)"),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    ),
    (
        ColumnInfo("c_timestamp", T.TIMESTAMP, N, "timestamp(3)"),
        dt.datetime(2038, 1, 19, 3, 14, 7, 123000, tzinfo=UTC),
        dt.datetime(2038, 1, 19, 3, 14, 7, 123000, tzinfo=UTC),
    ),
    (ColumnInfo("c_time", T.DURATION, N, "time(6)"), -dt.timedelta(hours=838, seconds=59), None),
)
TIME_BACK = -dt.timedelta(hours=838, seconds=59)

#: The same values decoded back with every string mode on (TiCDC's text forms).
STRING_MODES = {
    "c_bigint_u": str(2**64 - 1),
    "c_decimal": "-12345678901234567890.0123456789",
    "c_date": "1000-01-02",
    "c_datetime": "9999-12-31 23:59:59.999999",
    "c_timestamp": "2038-01-19 03:14:07.123",  # as TiDB prints timestamp(3)
    "c_time": "-838:00:59.000000",
}


@pytest.fixture
def registry():
    server = SchemaRegistryServer()
    yield server
    server.close()


def schema_of(columns: tuple[ColumnInfo, ...], version: int = 1) -> TableSchema:
    return TableSchema(insert("shop", "every", {}, commit_ts=2).table, columns, version)


def typed(change: RowChange, schema: TableSchema) -> RowChange:
    return dataclasses.replace(change, table=schema.table, schema=schema)


def codec_for(registry: SchemaRegistryServer, **options: Any) -> AvroCodec:
    return AvroCodec(AvroConfig(schema_registry=registry.url, **options))


def decoder_for(registry: SchemaRegistryServer) -> AvroDecoder:
    return AvroDecoder(SchemaRegistryClient(registry.url))


@pytest.mark.parametrize("modes", ["default", "strings"])
def test_every_column_type_round_trips_through_the_registry(registry, modes):
    options: dict[str, Any] = {"enable_tidb_extension": True}
    expected = {c.name: back for c, _, back in EVERY_TYPE} | {"c_time": TIME_BACK}
    if modes == "strings":
        options |= {
            "avro_decimal_handling_mode": "string",
            "avro_bigint_unsigned_handling_mode": "string",
            "avro_time_handling_mode": "string",
        }
        expected |= STRING_MODES
    schema = schema_of(tuple(c for c, _, _ in EVERY_TYPE))
    values = {c.name: v for c, v, _ in EVERY_TYPE}
    commit_ts = tso_from_ms(1_700_000_000_123, 5)
    [message] = codec_for(registry, **options).encode_rows(
        [typed(insert("shop", "every", values, commit_ts=commit_ts), schema)]
    )

    decoded = decoder_for(registry).decode(message.key, message.value)
    assert decoded.kind == "row" and decoded.op == "c" and decoded.commit_ts == commit_ts
    assert decoded.key is not None and decoded.key.fields == {"id": 7}
    assert decoded.value is not None and decoded.value.fields == expected
    # The registry holds exactly what the codec registered, under the TopicNameStrategy subjects.
    assert sorted(registry.subjects) == ["shop_every-key", "shop_every-value"]
    value_schema = json.loads(registry.schemas[decoded.value.schema_id])
    assert value_schema["name"] == "every" and value_schema["namespace"] == "default.shop"
    assert value_schema["fields"][-3:] == [
        {"name": "_tidb_op", "type": "string", "default": ""},
        {"name": "_tidb_commit_ts", "type": "long", "default": 0},
        {"name": "_tidb_commit_physical_time", "type": "long", "default": 0},
    ]
    full = decoder_for(registry).record(message.value).fields
    assert full["_tidb_commit_physical_time"] == 1_700_000_000_123


def test_nulls_round_trip_in_nullable_columns(registry):
    schema = schema_of(tuple(c for c, _, _ in EVERY_TYPE))
    values = {c.name: (v if c.is_handle_key else None) for c, v, _ in EVERY_TYPE}
    [message] = codec_for(registry).encode_rows([typed(insert("shop", "every", values, commit_ts=9), schema)])
    decoded = decoder_for(registry).decode(message.key, message.value)
    assert decoded.value is not None and decoded.value.fields == values
    assert decoded.op is None  # without the TiDB extension inserts and updates look alike


def test_golden_bytes_of_a_row(registry):
    schema = schema_of((ColumnInfo("id", T.LONGLONG, PK, "bigint"), ColumnInfo("name", T.VARCHAR, N, "varchar(8)")))
    [message] = codec_for(registry).encode_rows(
        [typed(insert("shop", "every", {"id": 1, "name": "a"}, commit_ts=9), schema)]
    )
    assert message.key == bytes.fromhex("00 00000001 02")  # magic, key schema id 1, long 1 (zig-zag)
    assert message.value == bytes.fromhex("00 00000002 02 02 02 61")  # id 1; union branch 1, "a"
    assert registry.subjects == {"shop_every-key": [1], "shop_every-value": [2]}


def test_updates_carry_the_new_row_and_deletes_are_tombstones(registry):
    schema = schema_of((ColumnInfo("id", T.LONG, PK, "int"), ColumnInfo("v", T.VARCHAR, N, "varchar(8)")))
    codec = codec_for(registry, enable_tidb_extension=True)
    changes = [
        typed(update("shop", "every", {"id": 1, "v": "old"}, {"id": 1, "v": "new"}, commit_ts=20), schema),
        typed(delete("shop", "every", {"id": 1, "v": "new"}, commit_ts=21), schema),
    ]
    up, gone = codec.encode_rows(changes)
    decoder = decoder_for(registry)
    decoded = decoder.decode(up.key, up.value)
    assert decoded.op == "u" and decoded.value is not None and decoded.value.fields == {"id": 1, "v": "new"}
    assert gone.value == b""  # no extension fields on deletes, even with the extension (TiCDC)
    deleted = decoder.decode(gone.key, None)
    assert deleted.op == "d" and deleted.key is not None and deleted.key.fields == {"id": 1}


def test_schema_change_registers_a_new_version(registry):
    before = schema_of((ColumnInfo("id", T.LONG, PK, "int"), ColumnInfo("a", T.VARCHAR, N, "varchar(8)")))
    after = schema_of((*before.columns, ColumnInfo("b", T.NEWDECIMAL, N, "decimal(6,2)")), version=2)
    codec = codec_for(registry)
    [old] = codec.encode_rows([typed(insert("shop", "every", {"id": 1, "a": "x"}, commit_ts=10), before)])
    [new] = codec.encode_rows(
        [typed(insert("shop", "every", {"id": 2, "a": "y", "b": decimal.Decimal("1.25")}, commit_ts=12), after)]
    )
    client = SchemaRegistryClient(registry.url)
    assert client.versions("shop_every-value") == [1, 2]
    assert client.versions("shop_every-key") == [1]  # the key did not change
    assert old.value[1:5] != new.value[1:5]
    assert new.value[1:5] == client.version("shop_every-value")["id"].to_bytes(4, "big")
    decoder = decoder_for(registry)
    assert decoder.decode(old.key, old.value).value.fields == {"id": 1, "a": "x"}  # type: ignore[union-attr]
    assert decoder.decode(new.key, new.value).value.fields == {  # type: ignore[union-attr]
        "id": 2,
        "a": "y",
        "b": decimal.Decimal("1.25"),
    }


def test_incompatible_schema_change_is_refused_clearly(registry):
    before = schema_of((ColumnInfo("id", T.LONG, PK, "int"),))
    after = schema_of((*before.columns, ColumnInfo("c", T.LONG, 0, "int")), version=2)  # NOT NULL, no default
    codec = codec_for(registry)
    codec.encode_rows([typed(insert("shop", "every", {"id": 1}, commit_ts=10), before)])
    with pytest.raises(SchemaIncompatibleError) as caught:
        codec.encode_rows([typed(insert("shop", "every", {"id": 2, "c": 3}, commit_ts=12), after)])
    error = caught.value
    assert error.code == ErrorCode.ErrDownstreamUnavailable and error.retryable is Retryable.LATER
    assert "shop_every-value" in error.message and "compatibility" in error.message
    assert error.detail["status"] == 409 and error.detail["error_code"] == 409
    # An operator relaxes the subject's rule; the same row then goes through.
    registry.compatibility["shop_every-value"] = "NONE"
    [message] = codec.encode_rows([typed(insert("shop", "every", {"id": 2, "c": 3}, commit_ts=12), after)])
    assert decoder_for(registry).decode(message.key, message.value).value.fields == {"id": 2, "c": 3}  # type: ignore[union-attr]


def test_schemas_are_posted_once_per_subject_and_version(registry):
    schema = schema_of((ColumnInfo("id", T.LONG, PK, "int"),))
    codec = codec_for(registry)
    codec.encode_rows([typed(insert("shop", "every", {"id": i}, commit_ts=10 + i), schema) for i in range(50)])
    posts = [path for method, path, _ in registry.requests if method == "POST"]
    assert posts == ["/subjects/shop_every-key/versions", "/subjects/shop_every-value/versions"]
    assert all(
        h["Content-Type"] == "application/vnd.schemaregistry.v1+json" for m, _, h in registry.requests if m == "POST"
    )


def test_topic_names_the_subjects(registry):
    schema = schema_of((ColumnInfo("id", T.LONG, PK, "int"),))
    codec_for(registry).encode_rows_for_topic(
        "tidb.shop.every", [typed(insert("shop", "every", {"id": 1}, commit_ts=3), schema)]
    )
    assert sorted(registry.subjects) == ["tidb_shop_every-key", "tidb_shop_every-value"]


def test_basic_auth_from_the_url():
    server = SchemaRegistryServer(users={"cdc user": "p@ss:word"})
    try:
        schema = schema_of((ColumnInfo("id", T.LONG, PK, "int"),))
        row = typed(insert("shop", "every", {"id": 1}, commit_ts=3), schema)
        with_auth = server.url.replace("http://", "http://cdc%20user:p%40ss%3Aword@")
        AvroCodec(AvroConfig(schema_registry=with_auth)).encode_rows([row])
        assert len(server.subjects) == 2
        wrong = server.url.replace("http://", "http://cdc%20user:nope@")
        with pytest.raises(SchemaRegistryError, match=r"HTTP 401.*check the user and password") as caught:
            AvroCodec(AvroConfig(schema_registry=wrong)).encode_rows([row])
        assert "nope" not in caught.value.message  # credentials stay out of messages
    finally:
        server.close()


def test_unreachable_registry_is_downstream_unavailable(registry):
    url = registry.url
    registry.close()
    schema = schema_of((ColumnInfo("id", T.LONG, PK, "int"),))
    with pytest.raises(DownstreamUnavailableError, match="unreachable") as caught:
        AvroCodec(AvroConfig(schema_registry=url, schema_registry_timeout=2)).encode_rows(
            [typed(insert("shop", "every", {"id": 1}, commit_ts=3), schema)]
        )
    assert caught.value.retryable is Retryable.RETRY


def test_unknown_schema_id(registry):
    with pytest.raises(SchemaNotFoundError, match="no such schema"):
        decoder_for(registry).record(bytes.fromhex("00 00000063 02"))


def test_ddl_and_watermarks_with_the_extension(registry):
    codec = codec_for(registry, enable_tidb_extension=True, avro_enable_watermark=True)
    table = schema_of(()).table
    ddl = codec.encode_ddl(DDLEvent(99, "ALTER TABLE shop.every ADD COLUMN b int", table, action_type=5))
    assert ddl is not None and ddl.key is None
    assert ddl.value == b"\x01" + (
        b'{"query":"ALTER TABLE shop.every ADD COLUMN b int","type":5,"schema":"shop","table":"every","commitTs":99}'
    )
    decoder = decoder_for(registry)
    assert decoder.decode(None, ddl.value).ddl["query"].startswith("ALTER TABLE")
    resolved = codec.encode_resolved(123)
    assert resolved is not None and decoder.decode(None, resolved.value).resolved_ts == 123
    assert codec_for(registry, enable_tidb_extension=True).encode_ddl(DDLEvent(99, "x", table)) is None


def read_all(sink: KafkaSink, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    return [m for ms in read_topic(sink.bootstrap_servers, topic).values() for m in ms]


def test_avro_through_the_kafka_sink(registry):
    base = f"cdc-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(
        KafkaSinkConfig(
            uri=f"kafka://mock/{base}",
            topic=base,
            protocol="avro",
            schema_registry=registry.url,
            enable_tidb_extension=True,
            dispatchers=[DispatchRule(matcher=["shop.*"], topic=base + ".{schema}.{table}", partition="index-value")],
        )
    )
    v1 = schema_of((ColumnInfo("id", T.LONG, PK, "int"), ColumnInfo("name", T.VARCHAR, N, "varchar(8)")))
    v2 = schema_of((*v1.columns, ColumnInfo("at", T.DATETIME, N, "datetime")), version=2)
    sink.open(SinkContext("cf", plugins=PLUGINS))
    try:
        sink.write_batch(
            MicroBatch(
                "cf",
                0,
                0,
                20,
                (
                    typed(insert("shop", "every", {"id": 1, "name": "x"}, commit_ts=10), v1),
                    typed(update("shop", "every", {"id": 1, "name": "x"}, {"id": 1, "name": "y"}, commit_ts=11), v1),
                ),
                (DDLEvent(20, "ALTER TABLE shop.every ADD COLUMN at datetime", v1.table, 5, v2),),
            )
        )
        stamp = dt.datetime(2024, 5, 6, 7, 8, 9)
        sink.write_batch(
            MicroBatch(
                "cf",
                1,
                20,
                30,
                (
                    typed(insert("shop", "every", {"id": 2, "name": "z", "at": stamp}, commit_ts=21), v2),
                    typed(delete("shop", "every", {"id": 1, "name": "y", "at": None}, commit_ts=22), v2),
                ),
            )
        )
        messages = read_all(sink, f"{base}.shop.every")
    finally:
        sink.close()
    decoder = decoder_for(registry)
    decoded = [decoder.decode(k, v) for k, v in messages]
    by_key: dict[int, list[tuple[str | None, Mapping[str, Any] | None]]] = {}
    for message in decoded:
        assert message.key is not None
        by_key.setdefault(message.key.fields["id"], []).append(
            (message.op, message.value.fields if message.value else None)
        )
    assert by_key == {
        1: [("c", {"id": 1, "name": "x"}), ("u", {"id": 1, "name": "y"}), ("d", None)],
        2: [("c", {"id": 2, "name": "z", "at": stamp})],
    }
    assert [v for _, v in messages].count(None) == 1  # the delete is a real Kafka tombstone (null value)
    assert sorted(registry.subjects) == [f"{base}_shop_every-key", f"{base}_shop_every-value"]
    assert len(registry.subjects[f"{base}_shop_every-value"]) == 2  # the DDL registered a new version


def test_a_row_over_max_message_bytes_names_table_and_key(registry):
    schema = schema_of((ColumnInfo("id", T.LONG, PK, "int"), ColumnInfo("doc", T.BLOB, N, "text")))
    codec = codec_for(registry, max_message_bytes=1024)
    [fits] = codec.encode_rows([typed(insert("shop", "every", {"id": 1, "doc": "x" * 900}, commit_ts=3), schema)])
    assert len(fits.value) > 900
    with pytest.raises(MessageTooLargeError, match=r"row of shop\.every \(id=2\) at commit ts 4 encodes to \d+ bytes"):
        codec.encode_rows([typed(insert("shop", "every", {"id": 2, "doc": "x" * 2000}, commit_ts=4), schema)])


@pytest.fixture(scope="module")
def shared_registry():
    server = SchemaRegistryServer()
    yield server
    server.close()


PROPERTY_COLUMNS = (
    ColumnInfo("id", T.LONGLONG, PK, "bigint"),
    ColumnInfo("i", T.LONG, N, "int"),
    ColumnInfo("u", T.LONGLONG, N | U, "bigint unsigned"),
    ColumnInfo("d", T.NEWDECIMAL, N, "decimal(65,30)"),
    ColumnInfo("s", T.VARCHAR, N, "varchar(255)"),
    ColumnInfo("b", T.BLOB, N | B, "blob"),
    ColumnInfo("ts", T.TIMESTAMP, N, "timestamp(6)"),
    ColumnInfo("dt", T.DATETIME, N, "datetime(6)"),
    ColumnInfo("t", T.DURATION, N, "time(6)"),
)


@settings(max_examples=60, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "id": st.integers(-(2**63), 2**63 - 1),
            "i": st.none() | st.integers(-(2**31), 2**31 - 1),
            "u": st.none() | st.integers(0, 2**64 - 1),
            "d": st.none()
            | st.decimals(min_value=-(10**34), max_value=10**34, places=30, allow_nan=False, allow_infinity=False),
            "s": st.none() | st.text(),
            "b": st.none() | st.binary(),
            "ts": st.none() | st.datetimes(min_value=dt.datetime(1970, 1, 1, 0, 0, 1), timezones=st.just(UTC)),
            "dt": st.none() | st.datetimes(),
            "t": st.none() | st.timedeltas(-dt.timedelta(hours=838, minutes=59, seconds=59), dt.timedelta(hours=838)),
        }
    )
)
def test_random_rows_round_trip(shared_registry, values):
    schema = schema_of(PROPERTY_COLUMNS)
    codec = codec_for(shared_registry)
    [message] = codec.encode_rows([typed(insert("shop", "every", values, commit_ts=5), schema)])
    decoded = decoder_for(shared_registry).decode(message.key, message.value)
    assert decoded.value is not None and decoded.value.fields == values
    assert decoded.key is not None and decoded.key.fields == {"id": values["id"]}


def test_transient_registry_errors_are_retried(registry):
    client = SchemaRegistryClient(registry.url, retries=2)
    registry.fail_next = 2
    assert client.register("s-value", '"string"') == 1
    assert [m for m, _, _ in registry.requests] == ["POST"] * 3
    registry.fail_next = 3
    with pytest.raises(SchemaRegistryError, match="HTTP 500 error 50001: Error in the backend data store") as caught:
        client.schema_by_id(2)
    assert caught.value.retryable is Retryable.RETRY and len(registry.requests) == 6
    registry.fail_next = 0
    with pytest.raises(SchemaNotFoundError):  # a 404 is not retried
        client.schema_by_id(2)
    assert len(registry.requests) == 7
