"""Fuzz: the C image writer (``_opfast``) against the Open Protocol codec's Python path.

Every row is encoded twice, by one codec with the C writer and by one without
(``NATIVE`` set to None, as where the extension is not built or
``CDCFLOW_PURE_PYTHON=1``), under every combination of the options that change
what a value holds; the bytes must be equal, and so must the errors.
"""

import dataclasses
import datetime as dt
import decimal
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.data.codec import EncodedMessage
from cdcflow.core.data.events import ColumnInfo, InsertRun, OpType, RowChange, TableSchema
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import UnsupportedProtocolError
from cdcflow.plugins.codecs import (
    _opfast,  # type: ignore[attr-defined]  # built by make setup
    open_protocol,
)
from cdcflow.plugins.codecs.gojson import escape_html
from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
from tests.unit.plugins.codecs.test_open_protocol_fast import COLUMNS, TABLE

N = ColumnInfo.NULLABLE
#: Text that takes every escape: quotes, backslashes, control characters (short and
#: \\u forms), Go's HTML escapes (<, >, &, U+2028, U+2029), and UTF-8 of 2 to 4 bytes.
HOSTILE = st.text(
    st.sampled_from('"\\\n\r\t\b\f\x00\x01\x1f\x7f<>&\u2028\u2029é€😀a ') | st.characters(blacklist_categories=["Cs"]),
    max_size=12,
)
ZONES = st.none() | st.just(dt.UTC) | st.integers(-14 * 60, 14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
EXTRA = [
    (ColumnInfo("note", TypeCode.VARCHAR, N), HOSTILE),
    (ColumnInfo("j<&>", TypeCode.JSON, N), HOSTILE),
    (ColumnInfo("big", TypeCode.LONGLONG, N), st.integers(-(1 << 70), 1 << 70)),
    (ColumnInfo("e\u2028", TypeCode.ENUM, N), HOSTILE),
    # Floats of every magnitude, around Go's switch to exponents (1e-6, 1e21) too.
    (
        ColumnInfo("dd", TypeCode.DOUBLE, N),
        st.floats()
        | st.sampled_from([1e-6, 9.99999e-7, 1e21, 9.999999999999999e20, 1e16, 123456789012345680.0, -0.0, 5e-324])
        | st.integers(-(10**6), 10**6),
    ),
    (
        ColumnInfo("dec", TypeCode.NEWDECIMAL, N),
        st.decimals(allow_nan=False)
        | st.sampled_from([decimal.Decimal(v) for v in ("1E+30", "-0.00", "NaN", "-Infinity", "1.5E-9")]),
    ),
    (ColumnInfo("when", TypeCode.DATETIME, N), st.datetimes(timezones=ZONES) | st.dates() | st.text(max_size=3)),
    (ColumnInfo("t1", TypeCode.TIMESTAMP, N, "timestamp(1)"), st.datetimes(timezones=ZONES)),
    (ColumnInfo("span", TypeCode.DURATION, N), st.timedeltas() | st.times()),
    (ColumnInfo("span4", TypeCode.DURATION, N, "time(4)"), st.timedeltas(min_value=dt.timedelta(days=-40))),
]
ALL = COLUMNS + EXTRA
SCHEMA = TableSchema(TABLE, tuple(c for c, _ in ALL))
OPTIONS = [
    dict(
        zip(
            ("output_old_value", "only_output_updated_columns", "delete_only_output_handle_key_columns"),
            flags,
            strict=True,
        )
    )
    for flags in itertools.product((True, False), repeat=3)
]


@st.composite
def images(draw):
    return {c.name: draw(st.none() | values) for c, values in ALL}


def python_pair(options, row, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(open_protocol, "NATIVE", None)
        return OpenProtocolCodec(OpenProtocolConfig(**options)).row_pair(row)


def rows(after, before, schema=SCHEMA):
    return [
        RowChange(TABLE, OpType.INSERT, 10, 9, after, None, schema),
        RowChange(TABLE, OpType.UPDATE, 11, 10, after, before, schema),
        RowChange(TABLE, OpType.UPDATE, 11, 10, after, None, schema),
        RowChange(TABLE, OpType.DELETE, 12, 11, None, before, schema),
    ]


def test_the_codec_uses_the_c_writer_where_it_is_built():
    assert open_protocol.NATIVE is _opfast


@settings(max_examples=150, deadline=None)
@given(images(), images())
def test_rows_encode_to_the_same_bytes_with_and_without_the_c_writer(after, before):
    with pytest.MonkeyPatch.context() as monkeypatch:
        for options in OPTIONS:
            codec = OpenProtocolCodec(OpenProtocolConfig(**options))
            for row in rows(after, before):
                assert codec.row_pair(row) == python_pair(options, row, monkeypatch), (options, row.op)


@settings(max_examples=100, deadline=None)
@given(images(), st.data())
def test_images_with_other_keys_than_the_schema_encode_as_the_python_path(image, data):
    shape = data.draw(st.sampled_from(["missing", "extra", "renamed", "empty", "none"]))
    name = data.draw(st.sampled_from([c.name for c, _ in ALL]))
    if shape == "missing":
        del image[name]
    elif shape == "extra":
        image["zz" + name] = 1
    elif shape == "renamed":
        image["zz" + name] = image.pop(name)
    elif shape == "empty":
        image = {}
    else:
        image = None
    with pytest.MonkeyPatch.context() as monkeypatch:
        for row in rows(image, image):
            assert OpenProtocolCodec(OpenProtocolConfig()).row_pair(row) == python_pair({}, row, monkeypatch)


def test_the_c_writer_declines_what_it_does_not_take():
    columns = ((("a", b'{"a":{"t":3,"f":64,"v":', _opfast.K_INT, None, str)),)
    assert _opfast.image({"a": 1}, columns) == b'{"a":{"t":3,"f":64,"v":1}}'
    assert _opfast.image({"b": 1}, columns) is None  # not the schema's columns
    assert _opfast.image({"a": 1, "b": 2}, columns) is None
    assert _opfast.image([("a", 1)], columns) is None  # not a dict
    assert _opfast.image({}, ()) is None
    with pytest.raises(TypeError):
        _opfast.image({"a": 1}, [columns[0]])


def test_text_that_is_not_utf8_and_a_writer_that_raises_fail_as_in_python(monkeypatch):
    surrogate = {c.name: None for c, _ in ALL} | {"note": "a\udc80"}
    for row in rows(surrogate, surrogate):
        with pytest.raises(UnicodeEncodeError):
            OpenProtocolCodec(OpenProtocolConfig()).row_pair(row)
        with pytest.raises(UnicodeEncodeError):
            python_pair({}, row, monkeypatch)
    schema = TableSchema(TABLE, (ColumnInfo("id", TypeCode.LONG, N), ColumnInfo("g", TypeCode.GEOMETRY, N)))
    row = RowChange(TABLE, OpType.INSERT, 10, 9, {"id": 1, "g": b"\x00"}, None, schema)
    with pytest.raises(UnsupportedProtocolError, match="GEOMETRY"):
        OpenProtocolCodec(OpenProtocolConfig()).row_pair(row)
    with pytest.raises(UnsupportedProtocolError, match="GEOMETRY"):
        python_pair({}, row, monkeypatch)


def one_column_both_ways(column, value):
    """One value through the C writer and through the compiled Python image writer."""
    known = {column.name: open_protocol._known(column)}
    ordered = tuple((name, head, writer) for name, (_, head, writer) in known.items())
    native = _opfast.image({column.name: value}, open_protocol._native_columns(known, ordered))
    python = open_protocol._compile_image_writer(ordered)({column.name: value})
    return native, escape_html(python).encode("utf-8")


@settings(max_examples=3000, deadline=None)
@given(st.floats() | st.integers(-(2**53), 2**53).map(float) | st.floats(min_value=1e-8, max_value=1e-5))
def test_doubles_are_written_with_go_s_digits_and_exponents(value):
    native, python = one_column_both_ways(ColumnInfo("d", TypeCode.DOUBLE, N), value)
    assert native == python


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from([None, "date", "datetime(0)", "datetime(2)", "timestamp(6)", "time(3)"]),
    st.sampled_from([TypeCode.DATE, TypeCode.DATETIME, TypeCode.TIMESTAMP, TypeCode.DURATION]),
    st.datetimes(timezones=ZONES) | st.dates() | st.timedeltas() | st.text(max_size=2),
)
def test_temporal_values_are_spelled_as_in_python(sql_type, code, value):
    native, python = one_column_both_ways(ColumnInfo("t", code, N, sql_type or ""), value)
    assert native == python


@pytest.mark.parametrize(
    ("code", "value"),
    [
        *((TypeCode.LONGLONG, v) for v in (-(2**63), -(2**63) + 1, -10, -1, 0, 9, 10, 2**63 - 1, 2**63, 2**64 - 1)),
        (TypeCode.DATETIME, dt.datetime(1, 1, 1)),
        (TypeCode.DATETIME, dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),
        (TypeCode.DATETIME, dt.datetime(2024, 2, 9, 8, 7, 6, 5)),
        (TypeCode.DATE, dt.date(10, 3, 4)),
        *(
            (TypeCode.DURATION, dt.timedelta(**kw))
            for kw in ({}, {"microseconds": -1}, {"hours": 838, "minutes": 59, "seconds": 59}, {"days": -4000})
        ),
    ],
)
def test_digits_at_the_edges_are_written_as_in_python(code, value):
    """The C writer spells integers and temporal fields digit by digit: the ends of each range."""
    for sql_type in ("", "datetime(6)" if code == TypeCode.DATETIME else "time(6)"):
        native, python = one_column_both_ways(ColumnInfo("v", code, N, sql_type), value)
        assert native is not None and native == python


@settings(max_examples=1000, deadline=None)
@given(st.decimals(allow_nan=False) | st.decimals(places=4, allow_nan=False) | st.integers().map(decimal.Decimal))
def test_decimals_are_written_in_fixed_point(value):
    native, python = one_column_both_ways(ColumnInfo("n", TypeCode.NEWDECIMAL, N), value)
    assert native == python


# -- packing parts into messages -------------------------------------------------------------

PARTS = st.lists(
    st.builds(
        EncodedMessage,
        st.none() | st.binary(max_size=40),
        st.binary(max_size=300),
        st.none(),
        st.just(1),
        st.integers(0, (1 << 63) - 1),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(PARTS, st.integers(-1, 20), st.integers(1024, 4096))
def test_parts_are_packed_into_the_messages_python_packs(parts, max_batch_size, max_message_bytes):
    config = OpenProtocolConfig(max_batch_size=max(1, max_batch_size), max_message_bytes=max_message_bytes)
    native = OpenProtocolCodec(config).assemble("t", parts)
    saved, open_protocol.NATIVE = open_protocol.NATIVE, None
    try:
        python = OpenProtocolCodec(config).assemble("t", parts)
    finally:
        open_protocol.NATIVE = saved
    assert native == python


def test_parts_of_another_shape_are_left_to_python():
    class Part:
        def __init__(self, key, value, ts):
            self.key, self.value, self.ts = key, value, ts

    pack = _opfast.pack
    assert pack([Part(bytearray(b"k"), b"v", 1)], 16, 4096, b"\0" * 8, 8) is None
    assert pack([Part(b"k", b"v", 1.5)], 16, 4096, b"\0" * 8, 8) is None
    assert pack([Part(b"k", b"v", 1 << 70)], 16, 4096, b"\0" * 8, 8) is None
    assert pack([], 16, 4096, b"\0" * 8, 8) == []
    with pytest.raises(AttributeError):
        pack([object()], 16, 4096, b"\0" * 8, 8)


@settings(max_examples=150, deadline=None)
@given(st.lists(images(), max_size=8), st.integers(1024, 4096))
def test_a_run_of_inserts_gives_the_parts_its_rows_give_in_python(afters, max_message_bytes):
    """``_opfast.parts`` writes a run's parts in one call; images the C writer leaves to
    Python and rows over the size limit are holes the codec fills: the parts are those
    of the run's rows, encoded one by one without the C writer."""
    run = InsertRun(TABLE, SCHEMA, 10, 9, [b"k%d" % i for i in range(len(afters))], afters)
    config = OpenProtocolConfig(max_message_bytes=max_message_bytes, large_message_handle_option="handle-key-only")

    def parts_of(codec_run):
        try:
            return codec_run()
        except UnsupportedProtocolError as e:
            return type(e), str(e)

    native = parts_of(lambda: OpenProtocolCodec(config).encode_insert_parts("t", run))
    saved, open_protocol.NATIVE = open_protocol.NATIVE, None
    try:
        python = parts_of(lambda: OpenProtocolCodec(config).encode_row_parts("t", run.rows()))
    finally:
        open_protocol.NATIVE = saved
    assert native == python
    if isinstance(native, list):
        assert all(type(part) is EncodedMessage for part in native)


def test_run_parts_are_frozen_messages_of_the_codecs_class():
    columns = (("a", b'{"a":{"t":3,"f":1,"v":', _opfast.K_INT, None, str),)
    value = b'{"u":{"a":{"t":3,"f":1,"v":1}}}'
    fields = open_protocol._PART_FIELDS
    made, holes = _opfast.parts(
        [{"a": 1}, {"b": 1}, {"a": 1, "b": 2}], columns, b"K", len(value), TABLE, 7, EncodedMessage, fields
    )
    assert made[0] == EncodedMessage(b"K", value, TABLE, 1, 7) and hash(made[0]) == hash(made[0])
    assert made[1:] == [None, None] and holes == [1, 2]  # images without the schema's columns: Python's
    with pytest.raises(dataclasses.FrozenInstanceError):
        made[0].value = b""
    over = _opfast.parts([{"a": 1}], columns, b"K", len(value) - 1, TABLE, 7, EncodedMessage, fields)
    assert over == ([None], [0])  # over the size a part may have
    with pytest.raises(TypeError):
        _opfast.parts([], columns, b"K", 30, TABLE, 7, EncodedMessage, (1, 2, 3, 4, 5))
