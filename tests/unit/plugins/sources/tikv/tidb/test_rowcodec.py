"""Row values: hand-built bytes for every supported type, and hypothesis round
trips against the independent encoder in refcodec.py."""

import datetime as dt
import decimal
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.sources.tikv.tidb import keydatum, rowcodec, values
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, Flag

from . import refcodec

T = TypeCode
UNSIGNED = Flag.UNSIGNED


def dec(ft, raw):
    return values.decode_value(ft, raw)


# ----------------------------------------------------------------- hand-built bytes


@pytest.mark.parametrize(
    ("ft", "raw", "expected"),
    [
        (FieldType(T.TINY), b"\xff", -1),
        (FieldType(T.TINY, UNSIGNED), b"\xff", 255),
        (FieldType(T.SHORT), b"\x00\x80", -32768),
        (FieldType(T.LONG), b"\x01\x00\x00\x00", 1),
        (FieldType(T.LONGLONG), b"\x00\x00\x00\x00\x00\x00\x00\x80", -(1 << 63)),
        (FieldType(T.LONGLONG, UNSIGNED), b"\xff" * 8, (1 << 64) - 1),
        (FieldType(T.INT24), b"\x7f", 127),
        (FieldType(T.YEAR), b"\xe4\x07", 2020),
        (FieldType(T.DOUBLE), bytes.fromhex("bff8000000000000"), 1.5),
        (FieldType(T.DOUBLE), bytes.fromhex("4007ffffffffffff"), -1.5),
        (FieldType(T.DOUBLE), bytes.fromhex("8000000000000000"), 0.0),
        (FieldType(T.FLOAT), bytes.fromhex("bfb99999a0000000"), 0.10000000149011612),
        (FieldType(T.NEWDECIMAL, flen=10, decimal=2), bytes.fromhex("0a02800001000c"), decimal.Decimal("256.12")),
        (FieldType(T.NEWDECIMAL, flen=10, decimal=2), bytes.fromhex("0a027fffff84d2"), decimal.Decimal("-123.45")),
        (FieldType(T.NEWDECIMAL, flen=5, decimal=0), bytes.fromhex("05008003e8"), decimal.Decimal("1000")),
        (FieldType(T.VARCHAR), "héllo".encode(), "héllo"),
        (FieldType(T.STRING), b"", ""),
        (FieldType(T.BLOB, charset="binary", collate="binary"), b"\x00\xff", b"\x00\xff"),
        (FieldType(T.VARCHAR, Flag.BINARY, charset="binary", collate="binary"), b"\x80", b"\x80"),
        (FieldType(T.DATE), (((2021 * 13 + 3) << 5 | 14) << 41).to_bytes(8, "little"), dt.date(2021, 3, 14)),
        (
            FieldType(T.DATETIME),
            ((((2021 * 13 + 3) << 5 | 14) << 17 | (1 << 12 | 2 << 6 | 3)) << 24 | 500).to_bytes(8, "little"),
            dt.datetime(2021, 3, 14, 1, 2, 3, 500),
        ),
        (
            FieldType(T.TIMESTAMP),
            ((((1970 * 13 + 1) << 5 | 1) << 17) << 24).to_bytes(8, "little"),
            dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
        ),
        (FieldType(T.DATE), b"\x00", "0000-00-00"),
        (FieldType(T.DATETIME), b"\x00", "0000-00-00 00:00:00"),
        (FieldType(T.DURATION), (3_600_000_000_000).to_bytes(8, "little", signed=True), dt.timedelta(hours=1)),
        (FieldType(T.DURATION), b"\x00", dt.timedelta(0)),
        (FieldType(T.DURATION), (-1_500_000).to_bytes(4, "little", signed=True), dt.timedelta(microseconds=-1500)),
        (FieldType(T.ENUM, elems=("a", "b")), b"\x02", 2),
        (FieldType(T.SET, elems=("a", "b")), b"\x03", 3),
        (FieldType(T.BIT, flen=16), b"\x01\x01", 257),
        (FieldType(T.JSON), b"\x04\x01", "true"),
        (FieldType(T.JSON), b"\x04\x00", "null"),
        (FieldType(T.JSON), b"\x09" + (7).to_bytes(8, "little"), "7"),
        (FieldType(T.JSON), b"\x0c\x02hi", '"hi"'),
        (FieldType(T.JSON), b"\x03" + bytes.fromhex("02000000120000000401000000040200000000"[:36]), "[true, false]"),
    ],
)
def test_hand_built_values(ft, raw, expected):
    got = dec(ft, raw)
    assert got == expected
    assert type(got) is type(expected)


def test_hand_built_json_object():
    # {"a": 1}: count 1, size 8+6+5+1+8 = 28, key at 19, value at 20
    body = bytes.fromhex("010000001c0000001300000001000914000000") + b"a" + (1).to_bytes(8, "little")
    assert dec(FieldType(T.JSON), b"\x01" + body) == '{"a": 1}'


def test_hand_built_v2_row():
    raw = bytes.fromhex("80 00 0200 0100 01 03 02 0100 0400".replace(" ", "")) + b"\x05abc"
    row = rowcodec.decode_row(raw)
    assert row == {1: b"\x05", 3: b"abc", 2: None}


def test_v2_row_with_checksum_and_large_layout():
    row = refcodec.row_v2({300: b"xy", 2: None, 1: b"\x01"}, checksum=True)
    assert row[1] == 0x03  # large + checksum
    assert rowcodec.decode_row(row) == {1: b"\x01", 300: b"xy", 2: None}


@pytest.mark.parametrize(
    "bad",
    [
        b"\x80",
        b"\x80\x00\x01\x00\x00\x00",  # header says 1 column, none follows
        bytes.fromhex("800001000000010500") + b"ab",  # offset past the data
        bytes.fromhex("800002000000020101000200") + b"ab",  # ids not ascending
        bytes.fromhex("800001000000010100") + b"ab",  # stray byte
        bytes.fromhex("800201000000010100") + b"a\x01\x00",  # truncated checksum
    ],
)
def test_malformed_v2_rows_raise(bad):
    with pytest.raises(rowcodec.RowFormatError):
        rowcodec.decode_row(bad)


@pytest.mark.parametrize(
    ("ft", "raw"),
    [
        (FieldType(T.LONG), b"\x01\x02\x03"),
        (FieldType(T.DOUBLE), b"\x01"),
        (FieldType(T.NEWDECIMAL), b"\x0a\x02\x80"),
        (FieldType(T.NEWDECIMAL), bytes.fromhex("0a0280000100ff")),  # fraction word 255 > 99
        (FieldType(T.VARCHAR), b"\xff\xfe"),
        (FieldType(T.DATETIME), (((2021 * 13 + 2) << 5 | 30) << 41).to_bytes(8, "little")),  # Feb 30
        (FieldType(T.JSON), b"\x01\x05\x00"),
        (FieldType(T.JSON), b"\x7f"),
        (FieldType(T.JSON), b"\x04\x01\x00"),  # a literal followed by a stray byte
        (FieldType(T.JSON), b"\x03" + bytes.fromhex("000000000c000000") + b"\x00"),  # says 12 bytes, has 9
    ],
)
def test_corrupt_values_raise(ft, raw):
    with pytest.raises(values.ValueFormatError):
        dec(ft, raw)


@pytest.mark.parametrize("tp", [T.GEOMETRY, T.VECTOR_FLOAT32, T.NULL, 0x99])
def test_unknown_types_raise(tp):
    with pytest.raises(values.UnsupportedColumnType):
        dec(FieldType(tp), b"\x00")


def test_v1_row():
    # (varint col id 1, varint -3), (col 2, compact bytes "ab"), (col 3, NULL), (col 4, uint packed date)
    packed = ((2000 * 13 + 1) << 5 | 2) << 41
    raw = b"\x08\x02\x08\x05" + b"\x08\x04\x02\x04ab" + b"\x08\x06\x00" + b"\x08\x08\x04" + packed.to_bytes(8, "big")
    row = rowcodec.decode_row(raw)
    assert isinstance(row, rowcodec.V1Row)
    assert rowcodec.decode_column(FieldType(T.LONG), row[1]) == -3
    assert rowcodec.decode_column(FieldType(T.VARCHAR), row[2]) == "ab"
    assert row[3] is None
    assert rowcodec.decode_column(FieldType(T.DATE), row[4]) == dt.date(2000, 1, 2)
    assert rowcodec.decode_row(b"\x00") == {}


def test_v1_row_more_kinds():
    # BIT as compact bytes, DECIMAL, TIME as comparable int, DOUBLE, uvarint ENUM, JSON
    dec = bytes([5, 2]) + refcodec.bin_decimal(decimal.Decimal("-1.25"), 5, 2)
    json_body = b"\x0c\x02hi"
    raw = (
        b"\x08\x02\x02\x04\x01\x02"
        + b"\x08\x04\x06"
        + dec
        + b"\x08\x06\x07"
        + (5_000_000_000 + (1 << 63)).to_bytes(8, "big")
        + b"\x08\x08\x05"
        + refcodec.cmp_float(2.5)
        + b"\x08\x0a\x09\x02"
        + b"\x08\x0c\x0a"
        + json_body
    )
    row = rowcodec.decode_row(raw)
    col = rowcodec.decode_column
    assert col(FieldType(T.BIT, flen=16), row[1]) == 0x0102
    assert col(FieldType(T.NEWDECIMAL, flen=5, decimal=2), row[2]) == decimal.Decimal("-1.25")
    assert col(FieldType(T.DURATION), row[3]) == dt.timedelta(seconds=5)
    assert col(FieldType(T.DOUBLE), row[4]) == 2.5
    assert col(FieldType(T.ENUM, elems=("a", "b")), row[5]) == 2
    assert col(FieldType(T.JSON), row[6]) == '"hi"'
    with pytest.raises(values.ValueFormatError):
        col(FieldType(T.LONG), row[2])


def test_common_handle_datums():
    handle = keydatum.encode_key_datums(["k1", 5])
    datums = keydatum.decode_datums(handle)
    assert [d.value for d in datums] == [b"k1", 5]


# ----------------------------------------------------------------- round trips

I8 = st.integers(-(1 << 63), (1 << 63) - 1)
U8 = st.integers(0, (1 << 64) - 1)


@given(I8)
def test_signed_int_round_trip(v):
    raw = refcodec.le_int(v, True)
    assert dec(FieldType(T.LONGLONG), raw) == v
    assert values.encode_value(FieldType(T.LONGLONG), v) == raw


@given(U8)
def test_unsigned_int_round_trip(v):
    raw = refcodec.le_int(v, False)
    for tp in (T.LONGLONG, T.BIT, T.SET, T.ENUM):
        ft = FieldType(tp, UNSIGNED)
        assert dec(ft, raw) == v
        assert values.encode_value(ft, v) == raw


@given(st.floats(allow_nan=False))
def test_double_round_trip(v):
    raw = refcodec.cmp_float(v)
    assert dec(FieldType(T.DOUBLE), raw) == v
    assert values.encode_value(FieldType(T.DOUBLE), v) == raw


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_float_round_trip(v):
    raw = refcodec.cmp_float(v)
    assert dec(FieldType(T.FLOAT), raw) == v
    assert values.encode_value(FieldType(T.FLOAT), v) == raw


@st.composite
def decimals(draw):
    precision = draw(st.integers(1, 65))
    scale = draw(st.integers(0, min(30, precision)))
    digits = draw(st.integers(0, 10**precision - 1))
    sign = draw(st.sampled_from([1, -1]))
    return precision, scale, decimal.Decimal(f"{sign * digits}E-{scale}")


@given(decimals())
def test_decimal_round_trip(case):
    precision, scale, v = case
    raw = bytes([precision, scale]) + refcodec.bin_decimal(v, precision, scale)
    ft = FieldType(T.NEWDECIMAL, flen=precision, decimal=scale)
    got = dec(ft, raw)
    assert got == v
    assert got.as_tuple().exponent == -scale
    assert values.encode_value(ft, v) == raw


@given(st.text())
def test_string_round_trip(v):
    raw = v.encode()
    assert dec(FieldType(T.VARCHAR), raw) == v
    assert values.encode_value(FieldType(T.VARCHAR), v) == raw


@given(st.binary())
def test_bytes_round_trip(v):
    ft = FieldType(T.BLOB, charset="binary", collate="binary")
    assert dec(ft, v) == v
    assert values.encode_value(ft, v) == v


@given(st.dates())
def test_date_round_trip(v):
    raw = refcodec.le_int(refcodec.packed_time(v), False)
    assert dec(FieldType(T.DATE), raw) == v
    assert values.encode_value(FieldType(T.DATE), v) == raw


@given(st.datetimes())
def test_datetime_round_trip(v):
    raw = refcodec.le_int(refcodec.packed_time(v), False)
    assert dec(FieldType(T.DATETIME), raw) == v
    assert values.encode_value(FieldType(T.DATETIME), v) == raw


@given(st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2037, 1, 1), timezones=st.just(dt.UTC)))
def test_timestamp_round_trip(v):
    raw = refcodec.le_int(refcodec.packed_time(v), False)
    assert dec(FieldType(T.TIMESTAMP), raw) == v
    assert values.encode_value(FieldType(T.TIMESTAMP), v) == raw


@given(st.integers(-838 * 3600 * 10**6, 838 * 3600 * 10**6))
def test_time_round_trip(micros):
    v = dt.timedelta(microseconds=micros)
    raw = refcodec.le_int(micros * 1000, True)
    assert dec(FieldType(T.DURATION), raw) == v
    assert values.encode_value(FieldType(T.DURATION), v) == raw


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)


@given(JSON_VALUES)
def test_json_round_trip(v):
    tp, body = refcodec.json_bin(v)
    raw = bytes([tp]) + body
    text = dec(FieldType(T.JSON), raw)
    assert json.loads(text) == v
    assert values.encode_value(FieldType(T.JSON), json.dumps(v)) == raw


@given(
    st.dictionaries(
        st.integers(1, 1000),
        st.one_of(st.none(), st.binary(max_size=30)),
        max_size=12,
    ),
    st.booleans(),
)
def test_v2_row_round_trip(cols, checksum):
    raw = refcodec.row_v2(cols, checksum=checksum)
    assert rowcodec.decode_row(raw) == cols
    if not checksum:
        assert rowcodec.encode_row_raw(cols) == raw
