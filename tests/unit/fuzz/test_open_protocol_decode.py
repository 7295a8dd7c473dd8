"""Fuzz: the Open Protocol decoder (file sink readers, tools) on bytes read back from Kafka or files.

Every input yields events or an :class:`UnsupportedProtocolError` (6001) that
says which item of the message is wrong: never a JSONDecodeError,
UnicodeDecodeError, KeyError or TypeError escaping, and no allocation for a
frame length beyond the message.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import struct
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.events import ColumnInfo, DDLEvent, OpType, RowChange, TableName, TableSchema
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import UnsupportedProtocolError
from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
from cdcflow.plugins.codecs.open_protocol_decode import decode_file, decode_message
from tests.unit.fuzz._mutate import mutated
from tests.unit.fuzz.profiles import FUZZ

TABLE = TableName("shop", "orders", 7)
COLUMNS = [
    (ColumnInfo("id", TypeCode.LONG, ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY), st.integers(-(2**31), 2**31 - 1)),
    (ColumnInfo("name", TypeCode.VARCHAR, ColumnInfo.NULLABLE), st.text(max_size=12)),
    (ColumnInfo("raw", TypeCode.VARCHAR, ColumnInfo.NULLABLE | ColumnInfo.BINARY), st.binary(max_size=12)),
    (ColumnInfo("blob", TypeCode.BLOB, ColumnInfo.NULLABLE | ColumnInfo.BINARY), st.binary(max_size=12)),
    (
        ColumnInfo("price", TypeCode.NEWDECIMAL, ColumnInfo.NULLABLE),
        st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-(10**9), max_value=10**9),
    ),
    (ColumnInfo("f", TypeCode.DOUBLE, ColumnInfo.NULLABLE), st.floats(allow_nan=False, allow_infinity=False)),
    (ColumnInfo("day", TypeCode.DATE, ColumnInfo.NULLABLE), st.dates()),
    (ColumnInfo("at", TypeCode.DATETIME, ColumnInfo.NULLABLE), st.datetimes()),
    (
        ColumnInfo("dur", TypeCode.DURATION, ColumnInfo.NULLABLE),
        st.timedeltas(min_value=-dt.timedelta(hours=838), max_value=dt.timedelta(hours=838)),
    ),
]
SCHEMA = TableSchema(TABLE, tuple(c for c, _ in COLUMNS))
CODEC = OpenProtocolCodec(OpenProtocolConfig())


@st.composite
def images(draw: st.DrawFn) -> dict[str, Any]:
    return {c.name: draw(st.none() | s) if c.name != "id" else draw(s) for c, s in COLUMNS}


@st.composite
def messages(draw: st.DrawFn) -> tuple[bytes, bytes]:
    kind = draw(st.sampled_from(["insert", "update", "delete", "ddl", "resolved"]))
    ts = draw(st.integers(1, 2**63))
    if kind == "ddl":
        message = CODEC.encode_ddl(DDLEvent(ts, draw(st.text(max_size=30)), TABLE, 3))
    elif kind == "resolved":
        message = CODEC.encode_resolved(ts)
    else:
        op = {"insert": OpType.INSERT, "update": OpType.UPDATE, "delete": OpType.DELETE}[kind]
        after = None if op is OpType.DELETE else draw(images())
        before = None if op is OpType.INSERT else draw(images())
        rows = [RowChange(TABLE, op, ts, ts - 1, after, before, SCHEMA) for _ in range(draw(st.integers(1, 3)))]
        message = CODEC.encode_rows(rows)[0]
    assert message is not None
    return message.key, message.value or b""


def _decode(key: bytes, value: bytes) -> list[Any]:
    try:
        return list(decode_message(key, value))
    except UnsupportedProtocolError as e:
        assert e.code == 6001
        return []


@FUZZ
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_random_bytes(key: bytes, value: bytes) -> None:
    _decode(key, value)
    _decode(b"\0\0\0\0\0\0\0\x01" + key, value)


@FUZZ
@given(messages())
def test_valid_messages_decode(message: tuple[bytes, bytes]) -> None:
    assert _decode(*message)


@FUZZ
@given(
    st.one_of(
        mutated(messages().map(lambda m: m[0])).flatmap(
            lambda k: st.tuples(st.just(k), messages().map(lambda m: m[1]))
        ),
        messages().flatmap(lambda m: st.tuples(st.just(m[0]), mutated(st.just(m[1])))),
    )
)
def test_mutated_messages(message: tuple[bytes, bytes]) -> None:
    _decode(*message)


def _frame(*items: bytes) -> bytes:
    return b"".join(struct.pack(">Q", len(i)) + i for i in items)


@FUZZ
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(allow_nan=False),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(["t", "ts", "u", "p", "d", "v", "f", "q", "id", "scm", "tbl", "ptn"]), c, max_size=4
            )
        ),
        max_leaves=12,
    ),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(st.sampled_from(["t", "ts", "u", "p", "d", "v", "f", "q", "id"]), c, max_size=4)
        ),
        max_leaves=12,
    ),
)
def test_structurally_hostile_json(head: Any, body: Any) -> None:
    key = b"\0\0\0\0\0\0\0\x01" + _frame(json.dumps(head).encode())
    value = _frame(json.dumps(body).encode())
    _decode(key, value)
    for t in (1, 2, 3):
        _decode(b"\0\0\0\0\0\0\0\x01" + _frame(json.dumps({"t": t, "ts": 5}).encode()), value)


@FUZZ
@given(mutated(messages().map(lambda m: _frame(m[0], m[1]))))
def test_mutated_files(data: bytes) -> None:
    try:
        list(decode_file(data))
    except UnsupportedProtocolError as e:
        assert e.code == 6001


# --------------------------------------------------------------------------- regressions


VERSION = b"\0\0\0\0\0\0\0\x01"
ROW_KEY = _frame(b'{"ts":5,"scm":"s","tbl":"t","t":1}')


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (VERSION + _frame(b"\xff\xfe"), b"", "key item 0"),  # bad UTF-8
        (VERSION + _frame(b"{"), b"", "key item 0"),  # not JSON
        (VERSION + _frame(b"[1]"), b"", "key item 0"),  # not an object
        (VERSION + _frame(b'{"t":3}'), b"", "key item 0"),  # resolved without ts
        (VERSION + _frame(b'{"t":1,"ts":"x"}'), _frame(b"{}"), "key item 0"),  # ts not a number
        (VERSION + ROW_KEY, _frame(b"\xc3"), "value item 0"),
        (VERSION + ROW_KEY, _frame(b'{"u":[1]}'), "value item 0"),
        (VERSION + ROW_KEY, _frame(b'{"u":{"a":{"v":1}}}'), "value item 0"),  # no type
        (VERSION + ROW_KEY, _frame(b'{"u":{"a":{"t":252,"v":"!!"}}}'), "value item 0"),  # bad base64
        (VERSION + ROW_KEY, _frame(b'{"u":{"a":{"t":252,"v":"/w=="}}}'), "value item 0"),  # text BLOB not UTF-8
        (VERSION + ROW_KEY, _frame(b'{"u":{"a":{"t":15,"f":1,"v":"\\\\q"}}}'), "value item 0"),  # bad Go escape
        (VERSION + ROW_KEY, _frame(b'{"u":{"a":{"t":5,"v":"x"}}}'), "value item 0"),  # float from text
        (VERSION + ROW_KEY, _frame(b'{"u":{"a":{"t":246,"v":"1e"}}}'), "value item 0"),  # bad decimal
        (VERSION + ROW_KEY, _frame(b'{"u":{"a":{"t":10,"v":5}}}'), "value item 0"),  # date not text
        (VERSION + ROW_KEY, _frame(b"[" * 100_000 + b"]" * 100_000), "value item 0"),  # nested past recursion
    ],
)
def test_malformed_items_are_coded_errors_naming_the_item(key: bytes, value: bytes, match: str) -> None:
    with pytest.raises(UnsupportedProtocolError, match=match):
        list(decode_message(key, value))


def test_frame_length_past_the_end_is_refused_before_allocating() -> None:
    data = VERSION + struct.pack(">Q", 2**63) + b"{}"
    tracemalloc.start()
    try:
        with pytest.raises(UnsupportedProtocolError, match="runs past the end"):
            list(decode_message(data, b""))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def test_valid_values_still_decode() -> None:
    [change] = decode_message(
        VERSION + ROW_KEY, _frame(b'{"u":{"a":{"t":246,"v":"1.50"},"b":{"t":11,"v":"-01:02:03.5"}}}')
    )
    assert isinstance(change, RowChange)
    assert change.after == {
        "a": decimal.Decimal("1.50"),
        "b": -dt.timedelta(hours=1, minutes=2, seconds=3, microseconds=500000),
    }
    # a TIME Python cannot hold stays its text, as zero dates do
    [change] = decode_message(VERSION + ROW_KEY, _frame(b'{"u":{"b":{"t":11,"v":"99999999999:0:0"}}}'))
    assert isinstance(change, RowChange) and change.after == {"b": "99999999999:0:0"}
