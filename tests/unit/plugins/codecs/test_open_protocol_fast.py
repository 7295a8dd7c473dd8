"""The Open Protocol encoder's per-schema shortcuts write what its general path writes.

The shortcuts — a value writer per column type, the schema's columns sorted
once, images holding exactly the schema's columns walked without sorting —
are checked against the general path (:func:`encode_column_value` and an
image sorted per row), which the golden-bytes tests in test_open_protocol.py
pin to the reference.
"""

import datetime as dt
import decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.data.codec import make_encoded_message
from cdcflow.core.data.events import ColumnInfo, OpType, RowChange, TableName, TableSchema
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import CdcflowError
from cdcflow.plugins.codecs.columns import format_date_value
from cdcflow.plugins.codecs.gojson import escape_html
from cdcflow.plugins.codecs.open_protocol import (
    OpenProtocolCodec,
    OpenProtocolConfig,
    _image_json,
    _known,
    _value_json,
    _value_writer,
    encode_column_value,
)

TABLE = TableName("shop", "every", 9)
H = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY
N = ColumnInfo.NULLABLE

#: (column, values of the types sources give for it)
COLUMNS = [
    (ColumnInfo("id", TypeCode.LONGLONG, H), st.integers(-(1 << 63), (1 << 63) - 1) | st.booleans()),
    (ColumnInfo("u", TypeCode.LONGLONG, N | ColumnInfo.UNSIGNED), st.integers(0, (1 << 64) - 1)),
    (ColumnInfo("bit", TypeCode.BIT, N), st.integers(0, 255) | st.binary(min_size=1, max_size=2)),
    (ColumnInfo("status", TypeCode.ENUM, N), st.integers(1, 4) | st.sampled_from(["new", "paid"])),
    (ColumnInfo("tags", TypeCode.SET, N), st.integers(0, 7)),
    (ColumnInfo("d", TypeCode.DOUBLE, N), st.floats(allow_nan=True, allow_infinity=True)),
    (ColumnInfo("f", TypeCode.FLOAT, N), st.floats(width=32)),
    (
        ColumnInfo("amount", TypeCode.NEWDECIMAL, N),
        st.decimals(allow_nan=False, allow_infinity=False, places=2) | st.integers(-100, 100),
    ),
    (ColumnInfo("name", TypeCode.VARCHAR, N), st.text(max_size=8) | st.binary(max_size=4)),
    (ColumnInfo("raw", TypeCode.VARCHAR, N | ColumnInfo.BINARY, "varbinary(8)"), st.binary(max_size=6)),
    (ColumnInfo("blob", TypeCode.BLOB, N | ColumnInfo.BINARY), st.binary(max_size=6) | st.text(max_size=4)),
    (ColumnInfo("doc", TypeCode.JSON, N), st.text(max_size=8) | st.dictionaries(st.text(max_size=2), st.integers())),
    (ColumnInfo("day", TypeCode.DATE, N, "date"), st.dates() | st.just("0000-00-00")),
    (ColumnInfo("at", TypeCode.DATETIME, N, "datetime(3)"), st.datetimes() | st.just("0000-00-00 00:00:00")),
    (ColumnInfo("ts", TypeCode.TIMESTAMP, N, "timestamp(6)"), st.datetimes(timezones=st.just(dt.UTC))),
    (ColumnInfo("ts0", TypeCode.TIMESTAMP, N), st.datetimes(timezones=st.just(dt.UTC)) | st.datetimes()),
    (
        ColumnInfo("win", TypeCode.DURATION, N, "time(2)"),
        st.integers(-(10**12), 10**12).map(lambda us: dt.timedelta(microseconds=us)),
    ),
    (ColumnInfo("y", TypeCode.YEAR, N), st.integers(1901, 2155)),
]
SCHEMA = TableSchema(TABLE, tuple(c for c, _ in COLUMNS))


@st.composite
def images(draw):
    return {c.name: draw(st.none() | values) for c, values in COLUMNS}


@settings(max_examples=200, deadline=None)
@given(images())
def test_each_value_writer_writes_what_the_general_path_writes(image):
    for column, _ in COLUMNS:
        value = image[column.name]
        if value is not None:
            assert _value_writer(column)(value) == _value_json(encode_column_value(column, value)), column.name


@settings(max_examples=100, deadline=None)
@given(images(), images())
def test_rows_encode_as_with_the_image_sorted_per_row(after, before):
    known = {c.name: _known(c) for c, _ in COLUMNS}
    codec = OpenProtocolCodec(OpenProtocolConfig())
    rows = [
        RowChange(TABLE, OpType.INSERT, 10, 9, after, None, SCHEMA),
        RowChange(TABLE, OpType.UPDATE, 11, 10, after, before, SCHEMA),
        RowChange(TABLE, OpType.DELETE, 12, 11, None, before, SCHEMA),
    ]
    expected = [
        '{"u":' + _image_json(after, known, False) + "}",
        '{"u":' + _image_json(after, known, False) + ',"p":' + _image_json(before, known, False) + "}",
        '{"d":' + _image_json(before, known, False) + "}",
    ]
    for row, text in zip(rows, expected, strict=True):
        assert codec.row_pair(row)[1] == escape_html(text).encode("utf-8")


def test_images_with_other_columns_than_the_schema_take_the_general_path():
    codec = OpenProtocolCodec(OpenProtocolConfig())
    schema = TableSchema(TABLE, (ColumnInfo("id", TypeCode.LONG, H), ColumnInfo("b", TypeCode.VARCHAR, N)))
    missing = RowChange(TABLE, OpType.INSERT, 5, 4, {"id": 1}, None, schema)
    extra = RowChange(TABLE, OpType.INSERT, 5, 4, {"id": 1, "a": decimal.Decimal("1.5"), "b": "x"}, None, schema)
    other = RowChange(TABLE, OpType.INSERT, 5, 4, {"id": 1, "c": "y"}, None, schema)
    assert codec.row_pair(missing)[1] == b'{"u":{"id":{"t":3,"h":true,"f":10,"v":1}}}'
    assert codec.row_pair(extra)[1] == (
        b'{"u":{"a":{"t":246,"f":64,"v":"1.5"},"b":{"t":15,"f":64,"v":"x"},"id":{"t":3,"h":true,"f":10,"v":1}}}'
    )
    assert codec.row_pair(other)[1] == b'{"u":{"c":{"t":15,"f":64,"v":"y"},"id":{"t":3,"h":true,"f":10,"v":1}}}'


OTHER = TableName("shop", "other", 10)
#: Rows whose image is not exactly the schema's columns (the C writer leaves them to Python).
ODD_IMAGES = [{"id": 1}, {"id": 2, "extra": "x"}]


@st.composite
def row_runs(draw):
    """Rows of two tables and two schema objects, runs of one and interleaved, every op,
    some with images the C writer does not take and some without a schema."""
    schemas = [SCHEMA, TableSchema(TABLE, SCHEMA.columns), TableSchema(OTHER, SCHEMA.columns)]
    rows = []
    for ts in range(draw(st.integers(1, 12))):
        schema = draw(st.sampled_from([*schemas, None]))
        table = schema.table if schema is not None else draw(st.sampled_from([TABLE, OTHER]))
        op = draw(st.sampled_from([OpType.INSERT, OpType.UPDATE, OpType.DELETE]))
        after = None if op is OpType.DELETE else draw(images() | st.sampled_from(ODD_IMAGES))
        before = None if op is OpType.INSERT else draw(st.none() | images() | st.sampled_from(ODD_IMAGES))
        if op is OpType.DELETE and before is None:
            before = draw(images())
        rows.append(RowChange(table, op, 100 + ts, 99 + ts, after, before, schema))
    return rows


@settings(max_examples=150, deadline=None)
@given(
    row_runs(),
    st.fixed_dictionaries(
        {
            "output_old_value": st.booleans(),
            "only_output_updated_columns": st.booleans(),
            "delete_only_output_handle_key_columns": st.booleans(),
            "large_message_handle_option": st.sampled_from(["none", "handle-key-only"]),
            "max_message_bytes": st.sampled_from([1024, 1600, 1 << 20]),
        }
    ),
)
def test_row_parts_encoded_in_one_loop_are_each_rows_pair(rows, options):
    """encode_row_parts (one loop over the rows, the C writer's images) gives every row the
    key and value row_pair gives it alone, a large one its handle-key-only pair, and fails on
    the row _fitting_pair fails on, with the same error."""
    codec = OpenProtocolCodec(OpenProtocolConfig(**options))

    def outcome(encode):
        try:
            return encode()
        except CdcflowError as exc:  # the same error either way, or the same parts
            return type(exc), str(exc)

    expected = outcome(lambda: [make_encoded_message(*codec._fitting_pair(r), r.table, 1, r.commit_ts) for r in rows])
    assert outcome(lambda: codec.encode_row_parts("t", rows)) == expected


def spelled(moment, fsp):
    """DATETIME text field by field (years below 1000 keep their zeros), fraction per precision."""
    text = f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
    text += f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    if fsp is None:
        return text + (f".{moment.microsecond:06d}" if moment.microsecond else "")
    return text + (f".{moment.microsecond:06d}"[: fsp + 1] if fsp > 0 else "")


@settings(max_examples=300, deadline=None)
@given(
    st.datetimes(
        min_value=dt.datetime(1, 1, 2),
        max_value=dt.datetime(9999, 12, 30),
        timezones=st.none()
        | st.just(dt.UTC)
        | st.integers(-14 * 60, 14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m))),
    ),
    st.none() | st.integers(0, 6),
)
def test_datetimes_are_spelled_field_by_field_in_utc(value, fsp):
    moment = value.astimezone(dt.UTC) if value.tzinfo is not None else value
    assert format_date_value(TypeCode.DATETIME, value, fsp) == spelled(moment, fsp)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=300, unique=True),
    st.data(),
)
def test_any_column_names_and_counts_encode_as_the_general_path(names, data):
    """Names with quotes, braces, backslashes or code in them, and wide tables."""
    hostile = ['"}; raise SystemExit #', "{tail}", "n0", "v0", "image", "'", "\\", "\n"]
    names = list(dict.fromkeys(hostile + names))
    columns = tuple(ColumnInfo(name, TypeCode.VARCHAR if i % 2 else TypeCode.LONG, N) for i, name in enumerate(names))
    schema = TableSchema(TABLE, columns)
    image = {
        c.name: data.draw(st.none() | (st.text(max_size=4) if c.type_code == TypeCode.VARCHAR else st.integers()))
        for c in columns
    }
    known = {c.name: _known(c) for c in columns}
    row = RowChange(TABLE, OpType.INSERT, 10, 9, image, None, schema)
    expected = escape_html('{"u":' + _image_json(image, known, False) + "}").encode("utf-8")
    assert OpenProtocolCodec(OpenProtocolConfig()).row_pair(row)[1] == expected
