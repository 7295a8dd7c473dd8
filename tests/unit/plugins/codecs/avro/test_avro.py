"""The avro codec's pieces that need no registry: type mapping, value conversion, framing, config checks."""

import datetime as dt
import decimal
import io

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.config import validate_text
from cdcflow.core.data.events import ColumnInfo
from cdcflow.core.data.types import TypeCode
from cdcflow.core.plugin import PluginManager
from cdcflow.plugins.codecs.avro import AvroCodec, AvroConfig, AvroEncodeError, AvroFormatError
from cdcflow.plugins.codecs.avro.types import column_codec, encode_value, from_avro, sanitize_name
from cdcflow.plugins.codecs.avro.wire import frame, frame_resolved, resolved_ts_of, unframe

NULL = ColumnInfo.NULLABLE
UNSIGNED = ColumnInfo.UNSIGNED


def avro_type(code, flags=0, sql_type="", **config):
    return column_codec(ColumnInfo("c", code, flags, sql_type), AvroConfig(**config)).avro_type


@pytest.mark.parametrize(
    ("code", "flags", "sql_type", "config", "expected"),
    [
        (TypeCode.TINY, 0, "", {}, {"type": "int", "connect.parameters": {"tidb_type": "INT"}}),
        (TypeCode.LONG, 0, "", {}, {"type": "int", "connect.parameters": {"tidb_type": "INT"}}),
        (TypeCode.LONG, UNSIGNED, "", {}, {"type": "long", "connect.parameters": {"tidb_type": "INT UNSIGNED"}}),
        (TypeCode.LONGLONG, 0, "", {}, {"type": "long", "connect.parameters": {"tidb_type": "BIGINT"}}),
        (
            TypeCode.LONGLONG,
            UNSIGNED,
            "",
            {"avro_bigint_unsigned_handling_mode": "string"},
            {"type": "string", "connect.parameters": {"tidb_type": "BIGINT UNSIGNED"}},
        ),
        (TypeCode.FLOAT, 0, "", {}, {"type": "double", "connect.parameters": {"tidb_type": "FLOAT"}}),
        (
            TypeCode.NEWDECIMAL,
            0,
            "decimal(10,4)",
            {},
            {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": 10,
                "scale": 4,
                "connect.parameters": {"tidb_type": "DECIMAL"},
            },
        ),
        (
            TypeCode.NEWDECIMAL,
            0,
            "decimal(10,4)",
            {"avro_decimal_handling_mode": "string"},
            {"type": "string", "connect.parameters": {"tidb_type": "DECIMAL"}},
        ),
        (TypeCode.VARCHAR, 0, "varchar(8)", {}, {"type": "string", "connect.parameters": {"tidb_type": "TEXT"}}),
        (TypeCode.BLOB, ColumnInfo.BINARY, "blob", {}, {"type": "bytes", "connect.parameters": {"tidb_type": "BLOB"}}),
        (
            TypeCode.BIT,
            0,
            "bit(12)",
            {},
            {"type": "bytes", "connect.parameters": {"tidb_type": "BIT", "length": "12"}},
        ),
        (
            TypeCode.ENUM,
            0,
            "enum('a','b,c','d''e')",
            {},
            {"type": "string", "connect.parameters": {"tidb_type": "ENUM", "allowed": "a,b\\,c,d'e"}},
        ),
        (TypeCode.JSON, 0, "json", {}, {"type": "string", "connect.parameters": {"tidb_type": "JSON"}}),
        (
            TypeCode.DATE,
            0,
            "date",
            {},
            {"type": "int", "logicalType": "date", "connect.parameters": {"tidb_type": "DATE"}},
        ),
        (
            TypeCode.DATETIME,
            0,
            "datetime(6)",
            {},
            {"type": "long", "logicalType": "local-timestamp-micros", "connect.parameters": {"tidb_type": "DATETIME"}},
        ),
        (
            TypeCode.TIMESTAMP,
            0,
            "timestamp",
            {},
            {"type": "long", "logicalType": "timestamp-micros", "connect.parameters": {"tidb_type": "TIMESTAMP"}},
        ),
        (
            TypeCode.DURATION,
            0,
            "time",
            {},
            {"type": "long", "logicalType": "time-micros", "connect.parameters": {"tidb_type": "TIME"}},
        ),
        (
            TypeCode.DURATION,
            0,
            "time",
            {"avro_time_handling_mode": "string"},
            {"type": "string", "connect.parameters": {"tidb_type": "TIME"}},
        ),
        (TypeCode.YEAR, 0, "year", {}, {"type": "int", "connect.parameters": {"tidb_type": "YEAR"}}),
    ],
)
def test_column_types_map_as_documented(code, flags, sql_type, config, expected):
    assert avro_type(code, flags, sql_type, **config) == expected


def convert(code, value, flags=NULL, sql_type="", **config):
    codec = column_codec(ColumnInfo("c", code, flags, sql_type), AvroConfig(**config))
    return encode_value(codec, value, "t")


def test_value_conversions():
    assert convert(TypeCode.NEWDECIMAL, decimal.Decimal("-1.25"), sql_type="decimal(5,2)") == b"\x83"
    assert convert(TypeCode.NEWDECIMAL, decimal.Decimal("-1.29"), sql_type="decimal(5,2)") == b"\xff\x7f"
    assert convert(TypeCode.NEWDECIMAL, decimal.Decimal("1.5"), sql_type="decimal(5,2)") == b"\x00\x96"
    assert convert(TypeCode.NEWDECIMAL, decimal.Decimal("1.5"), avro_decimal_handling_mode="string") == "1.5"
    assert convert(TypeCode.BIT, 0) == b"\x00"
    assert convert(TypeCode.BIT, 0x1FF, sql_type="bit(12)") == b"\x01\xff"
    assert convert(TypeCode.ENUM, 2, sql_type="enum('a','b')") == "b"
    assert convert(TypeCode.ENUM, 0, sql_type="enum('a','b')") == ""
    assert convert(TypeCode.SET, 0b101, sql_type="set('a','b','c')") == "a,c"
    assert convert(TypeCode.SET, 0, sql_type="set('a','b','c')") == ""
    assert convert(TypeCode.LONGLONG, (1 << 64) - 1, UNSIGNED) == -1  # TiCDC's long mode wraps
    assert convert(TypeCode.LONGLONG, (1 << 64) - 1, UNSIGNED, avro_bigint_unsigned_handling_mode="string") == str(
        (1 << 64) - 1
    )
    assert convert(TypeCode.DATE, dt.date(1969, 12, 31)) == -1
    assert convert(TypeCode.DATETIME, dt.datetime(1970, 1, 1, 0, 0, 1, 5)) == 1_000_005
    assert convert(TypeCode.TIMESTAMP, dt.datetime(1970, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))) == 0
    assert convert(TypeCode.DURATION, -dt.timedelta(hours=838, microseconds=1)) == -(838 * 3600 * 10**6 + 1)
    assert convert(TypeCode.DURATION, "-01:00:00.5") == -3_600_500_000
    assert convert(TypeCode.DATETIME, dt.datetime(2024, 2, 3, 4, 5, 6), avro_time_handling_mode="string") == (
        "2024-02-03 04:05:06"
    )
    assert (
        convert(
            TypeCode.TIMESTAMP,
            dt.datetime(2024, 2, 3, 4, 5, 6, 120000, tzinfo=dt.UTC),
            sql_type="timestamp(2)",
            avro_time_handling_mode="string",
        )
        == "2024-02-03 04:05:06.12"
    )
    assert convert(TypeCode.SET, 0b10, sql_type="set('x','it''s')") == "it's"
    assert convert(TypeCode.JSON, {"a": [1]}) == '{"a":[1]}'


def test_zero_dates_are_null_when_nullable_and_an_error_otherwise():
    assert convert(TypeCode.DATE, "0000-00-00") is None
    assert convert(TypeCode.DATETIME, "0000-00-00 00:00:00") is None
    with pytest.raises(AvroEncodeError, match=r"zero date.*avro-time-handling-mode=string"):
        convert(TypeCode.DATE, "0000-00-00", flags=0)
    assert convert(TypeCode.DATE, "0000-00-00", flags=0, avro_time_handling_mode="string") == "0000-00-00"


def test_bad_values_name_table_and_column():
    with pytest.raises(AvroEncodeError, match="t: column 'c' is NOT NULL"):
        convert(TypeCode.LONG, None, flags=0)
    with pytest.raises(AvroEncodeError, match=r"column 'c' \(decimal\(5,2\)\).*more than 2 decimal places"):
        convert(TypeCode.NEWDECIMAL, decimal.Decimal("1.255"), sql_type="decimal(5,2)")
    with pytest.raises(AvroEncodeError, match="ENUM index 3"):
        convert(TypeCode.ENUM, 3, sql_type="enum('a','b')")


@given(
    st.decimals(min_value=-(10**8), max_value=10**8, places=4, allow_nan=False, allow_infinity=False),
)
def test_decimals_round_trip_through_avro_bytes(value):
    codec = column_codec(ColumnInfo("c", TypeCode.NEWDECIMAL, 0, "decimal(12,4)"), AvroConfig())
    raw = encode_value(codec, value, "t")
    assert from_avro(codec.avro_type, raw) == value


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_unsigned_bigints_round_trip_through_long_mode(value):
    codec = column_codec(ColumnInfo("c", TypeCode.LONGLONG, UNSIGNED), AvroConfig())
    raw = encode_value(codec, value, "t")
    assert -(1 << 63) <= raw < 1 << 63
    assert from_avro(codec.avro_type, raw) == value


def test_names_are_sanitized_as_ticdc_does():
    assert sanitize_name("order-items") == "order_items"
    assert sanitize_name("1st") == "_1st"
    assert sanitize_name("列") == "_"


def test_confluent_framing_golden_bytes():
    schema = fastavro.parse_schema({"type": "record", "name": "t", "fields": [{"name": "id", "type": "long"}]})
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema, {"id": 1})
    assert frame(1, body.getvalue()) == bytes.fromhex("00 00000001 02")
    assert frame(0x01020304, b"") == bytes.fromhex("00 01020304")
    assert unframe(bytes.fromhex("00 00000102 0a0b")) == (258, b"\x0a\x0b")
    assert frame_resolved(0x0102030405060708) == bytes.fromhex("02 0102030405060708")
    assert resolved_ts_of(bytes.fromhex("02 0000000000000010")) == 16


@pytest.mark.parametrize("data", [b"", b"\x00\x00\x00", b"\x01\x00\x00\x00\x01\x02"])
def test_unframe_rejects_what_is_not_confluent_avro(data):
    with pytest.raises(AvroFormatError):
        unframe(data)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "needs schema-registry"),
        ("127.0.0.1:8081", "must be an http(s)://"),
        ("ftp://r:1", "must be an http(s)://"),
        ("http://r:notaport", "invalid port"),
    ],
)
def test_check_config_reports_the_registry_url(url, message):
    issues = AvroCodec.check_config(AvroConfig(schema_registry=url), PluginManager.default(autoload=False))
    assert len(issues) == 1 and issues[0][0] == "schema-registry" and message in issues[0][1]


def test_check_config_accepts_a_registry_with_credentials():
    config = AvroConfig(schema_registry="https://u%40x:p%3Aw@registry:8081")
    assert AvroCodec.check_config(config, PluginManager.default(autoload=False)) == []


def test_watermarks_need_the_extension_and_the_option():
    assert AvroCodec(AvroConfig(avro_enable_watermark=True)).encode_resolved(5) is None
    assert AvroCodec(AvroConfig(enable_tidb_extension=True)).encode_resolved(5) is None
    codec = AvroCodec(AvroConfig(enable_tidb_extension=True, avro_enable_watermark=True))
    message = codec.encode_resolved(5)
    assert message is not None and message.key is None and message.value == bytes.fromhex("02 0000000000000005")


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("kafka://h:9092/t?protocol=avro", "needs schema-registry"),
        ("kafka://h:9092/t?protocol=avro&schema-registry=registry:8081", "must be an http(s)://"),
    ],
)
def test_validate_reports_the_registry_of_a_kafka_sink(uri, message):
    text = f"""
connectors:
  - name: a
    source: {{type: tikv}}
    sinks:
      - uri: "{uri}"
        dispatchers: [{{matcher: ["*.*"], topic: "tidb_{{schema}}_{{table}}"}}]
"""
    _, issues = validate_text(text, "c.yaml", PluginManager.default(autoload=False), {})
    shown = [str(issue) for issue in issues]
    assert len(shown) == 1 and message in shown[0] and "c.yaml:6" in shown[0] and "schema-registry" in shown[0], shown
