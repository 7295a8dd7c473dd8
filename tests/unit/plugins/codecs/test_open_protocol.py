"""Open Protocol bytes, computed by hand from the reference framing (docs/reference/open-protocol.md)."""

import dataclasses
import datetime as dt
import decimal
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.data.events import ColumnInfo, DDLEvent, OpType, RowChange, TableName, TableSchema
from cdcflow.core.testing import delete, insert, update
from cdcflow.plugins.codecs.open_protocol import (
    MessageTooLargeError,
    OpenProtocolCodec,
    OpenProtocolConfig,
    encode_column_value,
)
from cdcflow.plugins.codecs.open_protocol_decode import DecodedResolved, decode_message

ORDERS = TableName("shop", "orders", 7)
SCHEMA = TableSchema(
    ORDERS,
    (
        ColumnInfo("id", 3, ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY),  # INT NOT NULL PRIMARY KEY: f = 10
        ColumnInfo("name", 15, ColumnInfo.NULLABLE),  # VARCHAR: f = 64
        ColumnInfo("price", 246, ColumnInfo.NULLABLE),  # DECIMAL: f = 64
    ),
)


def row(op, after=None, before=None, ts=100):
    return RowChange(ORDERS, op, ts, ts - 1, after, before, SCHEMA)


def codec(**options):
    return OpenProtocolCodec(OpenProtocolConfig(**options))


def test_insert_golden_bytes():
    [message] = codec().encode_rows([row(OpType.INSERT, {"id": 1, "name": "a<b", "price": decimal.Decimal("9.50")})])
    key_json = b'{"ts":100,"scm":"shop","tbl":"orders","t":1}'  # 10 + 13 + 15 + 6 = 44 bytes
    value_json = (
        b'{"u":{"id":{"t":3,"h":true,"f":10,"v":1},'  # 41
        b'"name":{"t":15,"f":64,"v":"a\\u003cb"},'  # 38
        b'"price":{"t":246,"f":64,"v":"9.50"}}}'  # 37
    )
    assert len(key_json) == 44 and len(value_json) == 116
    assert message.key == b"\0\0\0\0\0\0\0\x01" + b"\0\0\0\0\0\0\0\x2c" + key_json
    assert message.value == b"\0\0\0\0\0\0\0\x74" + value_json
    assert message.row_count == 1 and message.ts == 100


def test_update_carries_old_value_and_delete_carries_d():
    op = codec()
    [upd] = op.encode_rows([row(OpType.UPDATE, {"id": 1, "name": "x"}, {"id": 1, "name": "y"})])
    assert upd.value[8:] == (
        b'{"u":{"id":{"t":3,"h":true,"f":10,"v":1},"name":{"t":15,"f":64,"v":"x"}},'
        b'"p":{"id":{"t":3,"h":true,"f":10,"v":1},"name":{"t":15,"f":64,"v":"y"}}}'
    )
    [no_old] = codec(output_old_value=False).encode_rows([row(OpType.UPDATE, {"id": 1}, {"id": 1})])
    assert no_old.value[8:] == b'{"u":{"id":{"t":3,"h":true,"f":10,"v":1}}}'
    [dele] = op.encode_rows([row(OpType.DELETE, None, {"id": 2})])
    assert dele.value[8:] == b'{"d":{"id":{"t":3,"h":true,"f":10,"v":2}}}'


def test_only_updated_columns_and_key_only_deletes():
    [upd] = codec(only_output_updated_columns=True).encode_rows(
        [row(OpType.UPDATE, {"id": 1, "name": "x", "price": None}, {"id": 1, "name": "y", "price": None})]
    )
    assert upd.value[8:].endswith(b'"p":{"id":{"t":3,"h":true,"f":10,"v":1},"name":{"t":15,"f":64,"v":"y"}}}')
    [dele] = codec(delete_only_output_handle_key_columns=True).encode_rows(
        [row(OpType.DELETE, None, {"id": 2, "name": "z"})]
    )
    assert dele.value[8:] == b'{"d":{"id":{"t":3,"h":true,"f":10,"v":2}}}'


def test_partitioned_table_key_has_ptn():
    part = dataclasses.replace(ORDERS, partition_id=42)
    [message] = codec().encode_rows([RowChange(part, OpType.INSERT, 5, 4, {"id": 1}, None, SCHEMA)])
    assert message.key[16:] == b'{"ts":5,"scm":"shop","tbl":"orders","ptn":42,"t":1}'


def test_ddl_and_resolved_golden_bytes():
    ddl = codec().encode_ddl(DDLEvent(200, "ALTER TABLE orders ADD c INT", ORDERS, action_type=5))
    key_json = b'{"ts":200,"scm":"shop","tbl":"orders","t":2}'
    value_json = b'{"q":"ALTER TABLE orders ADD c INT","t":5}'
    assert ddl.key == struct.pack(">QQ", 1, len(key_json)) + key_json
    assert ddl.value == struct.pack(">Q", len(value_json)) + value_json
    resolved = codec().encode_resolved(300)
    assert resolved.key == b"\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0\x10" + b'{"ts":300,"t":3}'
    assert resolved.value == b"\0" * 8


def test_batches_split_at_max_batch_size():
    rows = [row(OpType.INSERT, {"id": i}, ts=10 + i) for i in range(5)]
    messages = codec(max_batch_size=2).encode_rows(rows)
    assert [m.row_count for m in messages] == [2, 2, 1]
    first = messages[0]
    k0, k1 = (b'{"ts":%d,"scm":"shop","tbl":"orders","t":1}' % ts for ts in (10, 11))
    assert first.key == struct.pack(">QQ", 1, len(k0)) + k0 + struct.pack(">Q", len(k1)) + k1
    assert [e.commit_ts for m in messages for e in decode_message(m.key, m.value)] == [10, 11, 12, 13, 14]


def test_batches_split_at_max_message_bytes():
    # Each row is a 43-byte key and a 42-byte value: 8 + 36 overhead, then 16 + 85 per row.
    # 1024 bytes hold 9 rows (44 + 9 * 101 = 953; a 10th would need 953 + 101 = 1054 > 1024).
    rows = [row(OpType.INSERT, {"id": i % 10}, ts=10) for i in range(12)]
    key, value = codec().row_pair(rows[0])
    assert (len(key), len(value)) == (43, 42)
    messages = codec(max_batch_size=100, max_message_bytes=1024).encode_rows(rows)
    assert [m.row_count for m in messages] == [9, 3]
    assert all(len(m.key) + len(m.value) + 36 <= 1024 for m in messages)


def test_oversize_row_names_table_and_key():
    big = row(OpType.INSERT, {"id": 77, "name": "x" * 2000})
    with pytest.raises(MessageTooLargeError) as info:
        codec(max_message_bytes=1024).encode_rows([big])
    assert "shop.orders" in str(info.value) and "id=77" in str(info.value)
    assert info.value.code == 1001


def test_oversize_row_sent_handle_key_only_when_configured():
    big = row(OpType.INSERT, {"id": 77, "name": "x" * 2000})
    [message] = codec(max_message_bytes=1024, large_message_handle_option="handle-key-only").encode_rows([big])
    assert message.key[16:] == b'{"ts":100,"scm":"shop","tbl":"orders","t":1,"ohk":true}'
    assert message.value[8:] == b'{"u":{"id":{"t":3,"h":true,"f":10,"v":77}}}'


@pytest.mark.parametrize(
    ("column", "value", "encoded"),
    [
        (ColumnInfo("c", 8, ColumnInfo.UNSIGNED), 2**64 - 1, 2**64 - 1),
        (ColumnInfo("c", 5), float("nan"), 0),
        (ColumnInfo("c", 246), decimal.Decimal("1E+3"), "1000"),
        (ColumnInfo("c", 10), dt.date(2024, 2, 29), "2024-02-29"),
        (ColumnInfo("c", 12), dt.datetime(2024, 2, 29, 1, 2, 3, 4500), "2024-02-29 01:02:03.004500"),
        (ColumnInfo("c", 11), -dt.timedelta(hours=838, seconds=59), "-838:00:59"),
        (ColumnInfo("c", 16), b"\x01\x02", 258),
        (ColumnInfo("c", 247), 2, 2),
        (ColumnInfo("c", 245), {"a": [1]}, '{"a":[1]}'),
        (ColumnInfo("c", 252, ColumnInfo.BINARY), b"\x00\xff", "AP8="),
        (ColumnInfo("c", 252), "text", "dGV4dA=="),
        (ColumnInfo("c", 253, ColumnInfo.BINARY), b"\x89PNG", "\\x89PNG"),
        (ColumnInfo("c", 15), "plain", "plain"),
    ],
)
def test_value_table(column, value, encoded):
    assert encode_column_value(column, value) == encoded


def test_decoder_rejects_other_versions():
    with pytest.raises(Exception, match="version 2"):
        list(decode_message(struct.pack(">Q", 2), b""))


def test_decoder_reads_resolved_without_value():
    key_json = b'{"ts":9,"t":3}'
    assert list(decode_message(struct.pack(">QQ", 1, len(key_json)) + key_json, None)) == [DecodedResolved(9)]


# One value type per column, as in a real table; None in any column.
COLUMN_VALUES = {
    "a": st.integers(-(2**63), 2**63 - 1),
    "b": st.text(max_size=20),
    "c": st.binary(max_size=20),
    "d": st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**9), max_value=10**9),
    "e": st.floats(allow_nan=False, allow_infinity=False),
    "f": st.datetimes(min_value=dt.datetime(1000, 1, 1)),
}
images_strategy = st.fixed_dictionaries({}, optional={k: st.none() | v for k, v in COLUMN_VALUES.items()}).filter(bool)


@settings(deadline=None)  # timing varies on a shared machine; correctness does not
@given(st.lists(images_strategy, min_size=1, max_size=20))
def test_round_trip_through_decoder(images):
    rows = [insert("s", "t", image, commit_ts=10 + i) for i, image in enumerate(images)]
    rows += [update("s", "t", images[0], images[-1], commit_ts=99), delete("s", "t", images[-1], commit_ts=100)]
    decoded = [e for m in codec(max_batch_size=3).encode_rows(rows) for e in decode_message(m.key, m.value)]
    assert [(e.op, e.commit_ts, e.after, e.before) for e in decoded] == [
        (r.op, r.commit_ts, r.after, r.before) for r in rows
    ]


@settings(deadline=None)
@given(
    st.lists(st.text(max_size=100), min_size=1, max_size=60),  # a row always fits in 1024 bytes alone
    st.integers(1, 20),
    st.integers(1024, 4096),
)
def test_batching_invariants(notes, max_batch_size, max_message_bytes):
    rows = [row(OpType.INSERT, {"id": i, "name": note}, ts=10 + i) for i, note in enumerate(notes)]
    messages = codec(max_batch_size=max_batch_size, max_message_bytes=max_message_bytes).encode_rows(rows)
    assert all(1 <= m.row_count <= max_batch_size for m in messages)
    assert all(len(m.key) + len(m.value) + 36 <= max_message_bytes for m in messages)
    decoded = [e for m in messages for e in decode_message(m.key, m.value)]
    assert [(e.commit_ts, e.after) for e in decoded] == [(r.commit_ts, r.after) for r in rows]
    # a message is only cut when the next row would not fit or the batch is full
    start = 0
    for first in messages[:-1]:
        start += first.row_count
        next_key, next_value = codec().row_pair(rows[start])
        full = first.row_count == max_batch_size
        assert full or len(first.key) + len(first.value) + 36 + len(next_key) + len(next_value) + 16 > max_message_bytes


def test_fractional_seconds_follow_the_column_precision_and_timestamps_are_utc():
    dt3 = ColumnInfo("c", 12, sql_type="datetime(3)")
    assert encode_column_value(dt3, dt.datetime(2024, 1, 2, 3, 4, 5, 120000)) == "2024-01-02 03:04:05.120"
    assert (
        encode_column_value(ColumnInfo("c", 12, sql_type="datetime"), dt.datetime(2024, 1, 2)) == "2024-01-02 00:00:00"
    )
    assert encode_column_value(ColumnInfo("c", 11, sql_type="time(1)"), dt.timedelta(seconds=1.5)) == "00:00:01.5"
    cet = dt.timezone(dt.timedelta(hours=1))
    ts = ColumnInfo("ts", 7, ColumnInfo.NULLABLE, sql_type="timestamp")
    value = dt.datetime(2024, 1, 2, 1, 0, tzinfo=cet)
    assert encode_column_value(ts, value) == "2024-01-02 00:00:00"
    table = TableName("s", "t")
    change = RowChange(table, OpType.INSERT, 5, 4, {"ts": value}, None, TableSchema(table, (ts,)))
    [message] = codec().encode_rows([change])
    [decoded] = decode_message(message.key, message.value)
    assert decoded.after == {"ts": value} and decoded.after["ts"].tzinfo == dt.UTC
