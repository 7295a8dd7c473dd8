"""Fuzz: TiDB row values (rowcodec v1/v2), datums and the mounter, from bytes a TiKV store sends.

Every input yields a value or a coded error: the codec functions raise their
``ValueError`` subclasses (RowFormatError, ValueFormatError, KeyFormatError),
the mounter turns those into :class:`RowDecodeError` (6001) naming table, key
and commit ts. Nothing else may escape.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import struct
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.events import RawKVEvent, RowChange, Span
from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.sources.tikv.tidb import keydatum, keys, rowcodec, values
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, Flag
from cdcflow.plugins.sources.tikv.tidb.mounter import RowDecodeError, TiDBMounter
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBDatabase, TiDBTable
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore
from tests.unit.fuzz._mutate import mutated
from tests.unit.fuzz.profiles import FUZZ
from tests.unit.plugins.sources.tikv.tidb import tidb_json as tj

UTF8 = {"charset": "utf8mb4", "collate": "utf8mb4_bin"}
BIN = {"charset": "binary", "collate": "binary"}

#: (column id, name, FieldType, strategy of Python values the encoder takes)
COLUMNS: list[tuple[int, str, FieldType, st.SearchStrategy[Any]]] = [
    (1, "id", FieldType(TypeCode.LONGLONG, Flag.NOT_NULL | Flag.PRI_KEY, **BIN), st.integers(-(2**63), 2**63 - 1)),
    (2, "tiny", FieldType(TypeCode.TINY, **BIN), st.integers(-128, 127)),
    (3, "ushort", FieldType(TypeCode.SHORT, Flag.UNSIGNED, **BIN), st.integers(0, 65535)),
    (4, "ubig", FieldType(TypeCode.LONGLONG, Flag.UNSIGNED, **BIN), st.integers(0, 2**64 - 1)),
    (5, "f", FieldType(TypeCode.FLOAT, **BIN), st.floats(width=32, allow_nan=False)),
    (6, "d", FieldType(TypeCode.DOUBLE, **BIN), st.floats(allow_nan=False)),
    (
        7,
        "dec",
        FieldType(TypeCode.NEWDECIMAL, flen=20, decimal=4, **BIN),
        st.decimals(min_value=-(10**15), max_value=10**15, places=4, allow_nan=False, allow_infinity=False),
    ),
    (8, "name", FieldType(TypeCode.VARCHAR, flen=255, **UTF8), st.text(max_size=40)),
    (9, "blob", FieldType(TypeCode.BLOB, Flag.BINARY, **BIN), st.binary(max_size=40)),
    (10, "day", FieldType(TypeCode.DATE, **BIN), st.dates()),
    (11, "at", FieldType(TypeCode.DATETIME, decimal=6, **BIN), st.datetimes()),
    (
        12,
        "ts",
        FieldType(TypeCode.TIMESTAMP, decimal=3, **BIN),
        st.datetimes(min_value=dt.datetime(1970, 1, 2), timezones=st.just(dt.UTC)),
    ),
    (
        13,
        "dur",
        FieldType(TypeCode.DURATION, **BIN),
        st.timedeltas(min_value=-dt.timedelta(hours=838), max_value=dt.timedelta(hours=838)),
    ),
    (14, "e", FieldType(TypeCode.ENUM, elems=("a", "b", "c"), **UTF8), st.sampled_from(["a", "b", "c"])),
    (15, "s", FieldType(TypeCode.SET, elems=("x", "y"), **UTF8), st.integers(0, 3)),
    (16, "bits", FieldType(TypeCode.BIT, Flag.UNSIGNED, flen=64, **BIN), st.integers(0, 2**64 - 1)),
    (
        17,
        "doc",
        FieldType(TypeCode.JSON, **BIN),
        st.lists(
            st.recursive(
                st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
                lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                max_leaves=8,
            ),
            max_size=3,
        ),
    ),  # a list: str values are JSON text to the encoder
    (18, "yr", FieldType(TypeCode.YEAR, Flag.UNSIGNED, **BIN), st.integers(1901, 2155)),
]
TYPES = [ft for _, _, ft, _ in COLUMNS]
TABLE_ID = 300
SPAN = Span(1, b"", b"")


def _table_json() -> dict[str, Any]:
    cols = [
        tj.column(
            cid,
            name,
            i,
            tj.field_type(ft.tp, ft.flag, ft.flen, ft.decimal, ft.charset, ft.collate, list(ft.elems) or None),
        )
        for i, (cid, name, ft, _) in enumerate(COLUMNS)
    ]
    return tj.table(
        TABLE_ID,
        "everything",
        cols,
        [tj.index(1, "PRIMARY", "everything", [("id", 0)], unique=True, primary=True)],
        pk_is_handle=True,
    )


def _common_table_json() -> dict[str, Any]:
    cols = [
        tj.column(1, "k", 0, tj.field_type(TypeCode.VARCHAR, Flag.NOT_NULL | Flag.PRI_KEY, 64, 0, **UTF8)),
        tj.column(2, "n", 1, tj.field_type(TypeCode.LONGLONG, Flag.NOT_NULL | Flag.PRI_KEY, 20, 0, **BIN)),
        tj.column(3, "v", 2, tj.field_type(TypeCode.VARCHAR, 0, 64, 0, **UTF8)),
    ]
    idx = tj.index(1, "PRIMARY", "clustered", [("k", 0), ("n", 1)], unique=True, primary=True)
    return tj.table(TABLE_ID + 1, "clustered", cols, [idx], common=True)


def _mounter() -> TiDBMounter:
    store = SchemaStore()
    store.add_database(TiDBDatabase(1, "fuzz"))
    store.add_table(1, "fuzz", TiDBTable.from_json(_table_json()), 0)
    store.add_table(1, "fuzz", TiDBTable.from_json(_common_table_json()), 0)
    return TiDBMounter(store)


MOUNTER = _mounter()


@st.composite
def valid_rows(draw: st.DrawFn) -> bytes:
    """A v2 row of the table, built with the project's own encoder (some columns NULL or absent)."""
    cols: dict[int, tuple[FieldType, Any]] = {}
    for cid, _, ft, strategy in COLUMNS[1:]:
        choice = draw(st.sampled_from(["value", "value", "null", "absent"]))
        if choice == "value":
            cols[cid] = (ft, draw(strategy))
        elif choice == "null":
            cols[cid] = (ft, None)
    return rowcodec.encode_row(cols)


@st.composite
def valid_v1_rows(draw: st.DrawFn) -> bytes:
    """A v1 row: (column id, value) datum pairs, as TiDB before row format v2 wrote them."""
    parts = []
    for cid, value in draw(
        st.dictionaries(
            st.integers(1, 20),
            st.none() | st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=12) | st.floats(allow_nan=False),
            max_size=6,
        )
    ).items():
        parts.append(keydatum.encode_key_datum(cid) + keydatum.encode_key_datum(value))
    return b"".join(parts)


def row_key(handle: int) -> bytes:
    return keys.record_key(TABLE_ID, handle)


def _mount(
    key: bytes, value: bytes, old_value: bytes = b"", *, delete: bool = False, commit_ts: int = 1000
) -> RowChange | None:
    event = RawKVEvent(SPAN, key, value, old_value, 900, commit_ts, delete)
    try:
        return MOUNTER.mount_row(event)
    except RowDecodeError as e:
        assert e.code == 6001
        assert e.detail["key"] == key.hex() and e.detail["commit_ts"] == commit_ts
        assert e.detail["table"] in ("fuzz.everything", "fuzz.clustered") or e.detail["table"].startswith("table id ")
        assert key.hex() in e.message and str(commit_ts) in e.message
        return None


# --------------------------------------------------------------------------- codec level


@FUZZ
@given(st.binary(max_size=300))
def test_decode_row_random_bytes(data: bytes) -> None:
    try:
        row = rowcodec.decode_row(data)
    except rowcodec.RowFormatError:
        return
    assert isinstance(row, dict)
    assert len(row) <= len(data)


@FUZZ
@given(st.one_of(mutated(valid_rows()), mutated(valid_v1_rows())))
def test_decode_row_mutated(data: bytes) -> None:
    try:
        row = rowcodec.decode_row(data)
    except rowcodec.RowFormatError:
        return
    for ft in TYPES:
        for raw in row.values():
            with contextlib.suppress(ValueError):  # the mounter's decode errors (ValueFormatError …)
                rowcodec.decode_column(ft, raw)


@FUZZ
@given(st.sampled_from(TYPES), st.binary(max_size=64))
def test_decode_value_random_bytes(ft: FieldType, data: bytes) -> None:
    with contextlib.suppress(values.ValueFormatError):
        values.decode_value(ft, data)
    with contextlib.suppress(values.ValueFormatError):
        values.value_decoder(ft)(data)


#: Datums with long varints: 9 to 11 bytes of continuation bits and a last byte.
LONG_VARINTS = st.builds(
    lambda flag, n, last: bytes([flag]) + b"\xff" * n + bytes([last]),
    st.sampled_from([keydatum.DatumKind.VARINT, keydatum.DatumKind.UVARINT]),
    st.integers(8, 10),
    st.integers(0, 127),
)


@FUZZ
@given(st.one_of(st.binary(max_size=120), LONG_VARINTS))
def test_decode_datums_random_bytes(data: bytes) -> None:
    try:
        datums = keydatum.decode_datums(data)
    except keys.KeyFormatError:
        return
    assert len(datums) <= len(data)
    for datum in datums:
        if isinstance(datum.value, int) and datum.kind in (
            keydatum.DatumKind.INT,
            keydatum.DatumKind.VARINT,
            keydatum.DatumKind.DURATION,
        ):
            assert -(2**63) <= datum.value < 2**63
        if isinstance(datum.value, int) and datum.kind in (keydatum.DatumKind.UINT, keydatum.DatumKind.UVARINT):
            assert 0 <= datum.value < 2**64
        for ft in TYPES:
            with contextlib.suppress(ValueError):  # ValueFormatError, JSONFormatError …: the mounter's decode errors
                rowcodec.value_from_datum(ft, datum)


# --------------------------------------------------------------------------- the mounter


@FUZZ
@given(
    st.integers(-(2**63), 2**63 - 1),
    st.one_of(st.binary(max_size=200), mutated(valid_rows()), mutated(valid_v1_rows()), valid_rows()),
    st.one_of(st.just(b""), st.binary(max_size=60), mutated(valid_rows())),
    st.booleans(),
)
def test_mounter_row_value(handle: int, value: bytes, old_value: bytes, delete: bool) -> None:
    change = _mount(row_key(handle), value, old_value, delete=delete)
    if change is not None:
        image = change.after if change.after is not None else change.before
        assert image is not None
        assert image["id"] == handle


@FUZZ
@given(valid_rows())
def test_mounter_valid_rows_decode(value: bytes) -> None:
    change = MOUNTER.mount_row(RawKVEvent(SPAN, row_key(1), value, b"", 900, 1000, False))
    assert change is not None and change.after is not None and set(change.after) == {n for _, n, _, _ in COLUMNS}


@FUZZ
@given(
    st.one_of(
        st.binary(min_size=1, max_size=60),
        mutated(
            st.builds(
                keydatum.encode_key_datums, st.tuples(st.text(max_size=10), st.integers(-(2**63), 2**63 - 1)).map(list)
            )
        ),
    )
)
def test_mounter_common_handle(handle: bytes) -> None:
    key = keys.record_prefix(TABLE_ID + 1) + handle
    _mount(key, b"", delete=True)
    _mount(key, rowcodec.encode_row({3: (FieldType(TypeCode.VARCHAR), "v")}))


@FUZZ
@given(st.binary(min_size=0, max_size=40))
def test_mounter_random_keys(key: bytes) -> None:
    _mount(b"t" + keys.encode_int(TABLE_ID) + b"_r" + key, b"\x80\x00\x00\x00\x00\x00")
    _mount(key, b"\x80\x00\x00\x00\x00\x00")


# --------------------------------------------------------------------------- memory


def _peak(fn: Any, *args: Any) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        fn(*args)
        error = None
    except Exception as e:  # noqa: BLE001 - returned for the caller to check
        error = e
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, error


@pytest.mark.parametrize(
    ("decode", "data", "error"),
    [
        # v2 header claiming 65535 + 65535 large columns in 6 bytes
        (rowcodec.decode_row, b"\x80\x01\xff\xff\xff\xff", rowcodec.RowFormatError),
        # v1 row: compact bytes of length 2^62
        (
            rowcodec.decode_row,
            keydatum.encode_key_datum(1) + b"\x02" + b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f",
            rowcodec.RowFormatError,
        ),
        # datum: compact bytes of length 2^62
        (keydatum.decode_datums, b"\x02\xfe\xff\xff\xff\xff\xff\xff\xff\x7f", keys.KeyFormatError),
        # DECIMAL value declaring precision 255
        (lambda d: values.decode_value(FieldType(TypeCode.NEWDECIMAL), d), b"\xff\x1e\x80", values.ValueFormatError),
    ],
)
def test_declared_sizes_beyond_the_input_are_refused_before_allocating(decode: Any, data: bytes, error: type) -> None:
    peak, raised = _peak(decode, data)
    assert isinstance(raised, error), raised
    assert peak < 64 * 1024, f"{peak} bytes allocated for a {len(data)}-byte input"


def test_decimal_regression_sanity() -> None:
    # a valid DECIMAL round-trips (the fuzz tests' encoder and decoder agree)
    ft = FieldType(TypeCode.NEWDECIMAL, flen=20, decimal=4)
    assert values.decode_value(ft, values.encode_value(ft, decimal.Decimal("-12.5"))) == decimal.Decimal("-12.5000")


# --------------------------------------------------------------------------- regressions (inputs the fuzzer found)


@pytest.mark.parametrize(
    "data", [b"\t\x80\x80\x80\x80\x80\x80\x80\x80\x80\x02", b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x02"]
)
def test_varint_datum_past_64_bits_is_refused(data: bytes) -> None:
    with pytest.raises(keys.KeyFormatError, match="overflows 64 bits"):
        keydatum.decode_datums(data)


def test_varint_datum_of_64_bits_decodes() -> None:
    assert keydatum.decode_datums(b"\x09" + b"\xff" * 9 + b"\x01")[0].value == 2**64 - 1
    assert keydatum.decode_datums(b"\x08" + b"\xff" * 9 + b"\x01")[0].value == -(2**63)


def test_v1_row_with_an_overflowing_varint_is_a_row_decode_error() -> None:
    value = keydatum.encode_key_datum(2) + b"\x08" + b"\xff" * 9 + b"\x7f"  # column 2 (tinyint): a 70-bit varint
    key = row_key(5)
    with pytest.raises(RowDecodeError) as info:
        MOUNTER.mount_row(RawKVEvent(SPAN, key, value, b"", 900, 1234, False))
    assert info.value.code == 6001
    assert info.value.detail["table"] == "fuzz.everything"
    assert info.value.detail["key"] == key.hex() and info.value.detail["commit_ts"] == 1234


def test_json_column_nested_too_deep_is_a_row_decode_error() -> None:
    depth = 5000
    levels = b"".join(
        struct.pack("<II", 1, 13 * (depth - 1 - i) + 8) + struct.pack("<BI", 0x03, 13) for i in range(depth - 1)
    )
    doc = b"\x03" + levels + struct.pack("<II", 0, 8)
    key = row_key(6)
    with pytest.raises(RowDecodeError, match="nested deeper than") as info:
        MOUNTER.mount_row(RawKVEvent(SPAN, key, rowcodec.encode_row_raw({17: doc}), b"", 900, 77, False))
    assert info.value.detail["key"] == key.hex() and info.value.detail["commit_ts"] == 77


@pytest.mark.parametrize(
    "value",
    [
        # v1: column 1 (the PK-is-handle `id`) given as NULL in the value.
        bytes.fromhex("03" + "00" * 8 + "00" + "03" + "8000000000000001" + "00"),
        # v2: column 1 given as NULL, column 2 with a value.
        rowcodec.encode_row_raw({1: None, 2: b"\x05"}),
        # v2: column 1 given with another value than the key's handle.
        rowcodec.encode_row_raw({1: (99).to_bytes(8, "little", signed=True)}),
    ],
    ids=["v1-null", "v2-null", "v2-other"],
)
def test_the_pk_handle_column_is_the_keys_handle_whatever_the_value_holds(value: bytes) -> None:
    """TiDB does not write the PK-is-handle column into the value and reads it from the key
    (as TiCDC's mounter does): a value that holds it does not change it."""
    change = _mount(row_key(7), value)
    assert change is not None and change.after is not None
    assert change.after["id"] == 7
