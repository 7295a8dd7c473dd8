"""Fuzz: the C row decoder (``_rowfast``) against the Python decoders it stands in for.

For any bytes, the C decoder either gives exactly what the Python decoder gives,
or refuses with ValueError (the mounter then decodes the row in Python). It
never accepts what Python refuses, and never gives another value.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import functools
import math
import random
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.plugins.sources.playground.catalog import Column
from cdcflow.plugins.sources.playground.shop import SHOP_TABLES, random_value

# Not importorskip: an install that failed to build the extension must fail here, not skip.
from cdcflow.plugins.sources.tikv.tidb import _rowfast as rowfast  # type: ignore[attr-defined]
from cdcflow.plugins.sources.tikv.tidb import jsonbin, keys, mounter, mydecimal, rowcodec, timecodec, values
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, Flag, TypeCode
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBColumn, TiDBDatabase, TiDBTable
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore
from tests.unit.fuzz._mutate import mutated
from tests.unit.fuzz.profiles import FUZZ
from tests.unit.fuzz.test_tidb_json import JSON_VALUES


def test_the_native_decoder_is_built_and_used() -> None:
    """The package's C extension compiled here (setup.py), and the mounter uses it."""
    assert mounter.NATIVE is rowfast


def _same_or_refused(native: Any, python: Any, data: bytes) -> Any:
    """What ``native(data)`` gave, having checked it against ``python(data)``."""
    try:
        expected: Any = python(data)
    except ValueError:
        expected = ValueError
    try:
        got: Any = native(data)
    except ValueError:
        return ValueError  # refused: Python decodes it (or raises its coded error)
    assert expected is not ValueError, f"C accepted what Python refuses: {data.hex()}"
    assert type(got) is type(expected)
    if isinstance(got, decimal.Decimal):
        assert str(got) == str(expected)  # the same digits, sign and exponent (-0.00 included)
    else:
        assert got == expected
    return got


# ------------------------------------------------------------------ JSON


def _json(data: bytes) -> Any:
    return _same_or_refused(rowfast.json_text, jsonbin.decode_json, data)


@FUZZ
@given(JSON_VALUES)
def test_json_documents_decode_to_pythons_text(value: Any) -> None:
    data = jsonbin.encode_json(value)
    assert _json(data) == jsonbin.decode_json(data)  # valid documents are never refused


@FUZZ
@given(st.data())
def test_json_mutated_documents(data: st.DataObject) -> None:
    _json(data.draw(mutated(st.builds(jsonbin.encode_json, JSON_VALUES))))


@FUZZ
@given(st.sampled_from([jsonbin.OBJECT, jsonbin.ARRAY]), st.binary(max_size=200))
def test_json_random_container_bodies(tp: int, body: bytes) -> None:
    _json(bytes([tp]) + body)


@pytest.mark.parametrize(
    "value",
    [
        'quote " backslash \\ newline \n tab \t cr \r bs \b ff \f nul \x00 us \x1f del \x7f',
        "ünïcödé ✓ 😀",
        {"b": 1, "a": [True, False, None], "": {"x": -(2**63)}},
        [2**64 - 1, -0.0, 1e300, 5e-324, 0.1, 1.0, 123456789.0],
        [[[[[]]]]],
        {},
    ],
)
def test_json_edge_values(value: Any) -> None:
    data = jsonbin.encode_json(value)
    assert _json(data) == jsonbin.decode_json(data)


def test_json_special_floats_and_what_is_left_to_python() -> None:
    for x in (math.nan, math.inf, -math.inf):
        data = bytes([jsonbin.FLOAT64]) + struct.pack("<d", x)
        assert _json(data) == jsonbin.decode_json(data)
    # opaque and temporal values, and a repeated key, are Python's
    opaque = bytes([jsonbin.OPAQUE, 15, 2]) + b"hi"
    assert _json(opaque) is ValueError and jsonbin.decode_json(opaque).startswith('"base64:type15:')
    packed = timecodec.pack_time(dt.datetime(2024, 2, 29, 1, 2, 3))
    assert _json(bytes([jsonbin.DATETIME]) + struct.pack("<Q", packed)) is ValueError
    repeated = _object_with_keys([b"k", b"k"])
    assert _json(repeated) is ValueError and jsonbin.decode_json(repeated) == '{"k": 2}'
    unsorted = _object_with_keys([b"z", b"a"])
    assert _json(unsorted) == jsonbin.decode_json(unsorted) == '{"z": 1, "a": 2}'


def _object_with_keys(keys: list[bytes]) -> bytes:
    """An object whose i-th key is keys[i] and value the int i + 1 (inline entries in order)."""
    n = len(keys)
    head = 8 + 6 * n + 5 * n
    key_bytes = b"".join(keys)
    entries, offset = b"", head
    for k in keys:
        entries += struct.pack("<IH", offset, len(k))
        offset += len(k)
    values_at = offset
    value_entries = b"".join(struct.pack("<BI", jsonbin.INT64, values_at + 8 * i) for i in range(n))
    body = entries + value_entries + key_bytes + b"".join(struct.pack("<q", i + 1) for i in range(n))
    return bytes([jsonbin.OBJECT]) + struct.pack("<II", n, 8 + len(body)) + body


# ------------------------------------------------------------------ DECIMAL


@st.composite
def decimals(draw: st.DrawFn) -> bytes:
    precision = draw(st.integers(1, mydecimal.MAX_PRECISION))
    frac = draw(st.integers(0, min(precision, mydecimal.MAX_SCALE)))
    digits = draw(st.text("0123456789", min_size=precision, max_size=precision))
    sign = draw(st.sampled_from(["", "-"]))
    text = sign + (digits[: precision - frac] or "0") + ("." + digits[precision - frac :] if frac else "")
    return mydecimal.encode_row_decimal(decimal.Decimal(text), precision, frac)


def _decimal(data: bytes) -> Any:
    return _same_or_refused(lambda b: rowfast.decimal_value(b, decimal.Decimal), mydecimal.decode_row_value, data)


@FUZZ
@given(decimals())
def test_decimals_decode_to_pythons_value(data: bytes) -> None:
    assert _decimal(data) is not ValueError


@FUZZ
@given(st.data())
def test_decimal_mutated_values(data: st.DataObject) -> None:
    _decimal(data.draw(mutated(decimals())))


@pytest.mark.parametrize(
    "text,precision,frac",
    [
        ("0", 1, 0),
        ("-0.00", 3, 2),
        ("0.5", 1, 1),
        ("-123456789012345678.9", 65, 30),
        ("99999", 5, 0),
        ("1e-30", 31, 30),
    ],
)
def test_decimal_edges(text: str, precision: int, frac: int) -> None:
    data = mydecimal.encode_row_decimal(decimal.Decimal(text), precision, frac)
    assert str(_decimal(data)) == str(mydecimal.decode_row_value(data))


# ------------------------------------------------------------------ DURATION


def _duration(data: bytes) -> Any:
    item = (("d", rowfast.DURATION, 0, None),)
    value = bytes([rowcodec.CODEC_VERSION, 0]) + struct.pack("<HHBH", 1, 0, 1, len(data)) + data
    python = values.value_decoder(FieldType(TypeCode.DURATION))
    return _same_or_refused(lambda b: _layout(item, 1, 5)(value, 0)["d"], python, data)


@FUZZ
@given(st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-(10**15), 10**15)))
def test_durations_decode_to_pythons_timedelta(ns: int) -> None:
    assert _duration(struct.pack("<q", ns)) is not ValueError


@pytest.mark.parametrize(
    "ns", [0, -1, 999, -999, 1000, -1001, 86_400 * 10**9 - 1, -(86_400 * 10**9) - 1, 2**63 - 1, -(2**63)]
)
def test_duration_edges(ns: int) -> None:
    got = _duration(struct.pack("<q", ns))
    assert got == dt.timedelta(microseconds=ns // 1000)
    for size, fmt in ((1, "<b"), (2, "<h"), (4, "<i")):
        small = max(min(ns, 2 ** (8 * size - 1) - 1), -(2 ** (8 * size - 1)))
        assert _duration(struct.pack(fmt, small)) == dt.timedelta(microseconds=small // 1000)
    assert _duration(b"\x00\x00\x00") is ValueError  # not 1, 2, 4 or 8 bytes: Python's error


# ------------------------------------------------------------------ whole rows


def _layout(items: tuple[tuple[str, int, int, Any], ...], stored: int, header_len: int) -> Any:
    return rowfast.Layout(2 + header_len, stored, rowcodec.check_tail, items).decode


def test_layout_values_of_every_kind_and_its_refusals() -> None:
    ints = struct.pack("<b", -5) + struct.pack("<H", 65535)
    name = "naïve".encode()
    dbl = struct.pack(">Q", struct.unpack(">Q", struct.pack(">d", 2.5))[0] | 1 << 63)
    stamp = struct.pack("<Q", timecodec.pack_time(dt.datetime(2024, 2, 29, 23, 59, 58, 7)))
    day = struct.pack("<Q", timecodec.pack_time(dt.datetime(1999, 12, 31)))
    parts = [ints[:1], ints[1:], name, b"\x00\xff", dbl, stamp, stamp, day]
    ends, total = [], 0
    for p in parts:
        total += len(p)
        ends.append(total)
    ids = bytes(range(1, len(parts) + 1))
    header = struct.pack("<HH", len(parts), 0) + ids
    value = bytes([rowcodec.CODEC_VERSION, 0]) + header + struct.pack(f"<{len(ends)}H", *ends) + b"".join(parts)
    items = (
        ("id", rowfast.HANDLE, 0, None),
        ("a", rowfast.INT, 0, None),
        ("b", rowfast.UINT, 1, None),
        ("c", rowfast.UTF8, 2, None),
        ("d", rowfast.BYTES, 3, None),
        ("e", rowfast.DOUBLE, 4, None),
        ("f", rowfast.DATETIME, 5, None),
        ("g", rowfast.TIMESTAMP, 6, None),
        ("h", rowfast.DATE, 7, None),
        ("i", rowfast.CALL, 3, lambda b: b[::-1]),
        ("j", rowfast.CONST, 0, "default"),
    )
    decode = _layout(items, len(parts), len(header))
    image = decode(value, 42)
    assert image == {
        "id": 42,
        "a": -5,
        "b": 65535,
        "c": "naïve",
        "d": b"\x00\xff",
        "e": 2.5,
        "f": dt.datetime(2024, 2, 29, 23, 59, 58, 7),
        "g": dt.datetime(2024, 2, 29, 23, 59, 58, 7, tzinfo=dt.UTC),
        "h": dt.date(1999, 12, 31),
        "i": b"\xff\x00",
        "j": "default",
    }
    assert list(image) == [i[0] for i in items]
    with pytest.raises(ValueError):
        decode(value + b"x", 42)  # data past the offsets
    with pytest.raises(ValueError):
        decode(value[:-1], 42)
    zero = value.replace(day, struct.pack("<Q", 0))
    with pytest.raises(ValueError):
        decode(zero, 42)  # a zero date is Python's: text, not a date
    bad_utf8 = value.replace(name, b"na\xc3(ve")
    with pytest.raises(ValueError):
        decode(bad_utf8, 42)
    checksum = bytes([rowcodec.CODEC_VERSION, rowcodec.FLAG_CHECKSUM]) + value[2:] + b"\x00" + b"1234"
    assert decode(checksum, 42) == image
    with pytest.raises(ValueError):
        decode(checksum[:-1], 42)  # a checksum cut short: check_tail refuses it


# ------------------------------------------------------------------ runs of puts


def _run_plan(unsigned: bool) -> Any:
    """A fresh plan (no layouts compiled yet) of ``shop.orders``, its handle signed or not."""
    store = SchemaStore()
    store.add_database(TiDBDatabase(1, "shop"))
    fields = []
    for n, (name, ft) in enumerate(SHOP_TABLES["orders"]):
        typed = dataclasses.replace(ft, flag=ft.flag | Flag.UNSIGNED) if n == 0 and unsigned else ft
        fields.append(TiDBColumn(n + 1, name, n, typed))
    store.add_table(1, "shop", TiDBTable(_RUN_TABLE, "orders", tuple(fields), pk_is_handle=True), 10)
    return mounter.TiDBMounter(store)._plan_between(_RUN_TABLE, 100)[2]


_RUN_TABLE = 70


@st.composite
def _runs(draw: st.DrawFn) -> tuple[bool, list[bytes], list[bytes]]:
    """Puts of shop.orders rows: most valid, some keys and values mutated, cut or of another table."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    columns = [Column(n + 1, name, ft) for n, (name, ft) in enumerate(SHOP_TABLES["orders"])]
    handles = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=12))
    ks = [keys.record_key(_RUN_TABLE, h) for h in handles]
    vs = [rowcodec.encode_row({c.id: (c.ft, random_value(rng, c)) for c in columns[1:]}) for _ in handles]
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(ks) - 1))
        what = draw(st.sampled_from(["value", "key", "other table", "empty"]))
        if what == "value":
            vs[i] = draw(mutated(st.just(vs[i])))
        elif what == "key":
            ks[i] = draw(mutated(st.just(ks[i])))
        elif what == "other table":
            ks[i] = keys.record_key(_RUN_TABLE + 1, handles[i])
        elif what == "empty":
            vs[i] = b""
    if draw(st.integers(0, 9)) == 0:
        del vs[draw(st.integers(0, len(vs) - 1))]  # a value missing: the run is refused, not misread
    return draw(st.booleans()), ks, vs


def _images_both_ways(unsigned: bool, ks: list[bytes], vs: list[bytes]) -> Any:
    """``_rowfast.images`` of a run, having checked it against the mounter's Python loop
    (each on a plan of its own, so that each compiles the layouts it needs)."""
    prefix = keys.record_key(_RUN_TABLE, 0)[:11]
    got = []
    for images in (rowfast.images, mounter._images):
        plan = _run_plan(unsigned)
        make = functools.partial(mounter._new_layout, plan)
        got.append(images(ks, vs, prefix, unsigned, plan.layouts, make, mounter._FAST_PATH_ERRORS))
    assert got[0] == got[1]
    return got[0]


@FUZZ
@given(_runs())
def test_a_run_of_puts_decodes_as_the_python_loop_decodes_it(run: tuple[bool, list[bytes], list[bytes]]) -> None:
    _images_both_ways(*run)


def test_run_images_their_handles_and_refusals() -> None:
    rng = random.Random(5)
    columns = [Column(n + 1, name, ft) for n, (name, ft) in enumerate(SHOP_TABLES["orders"])]
    handles = [-(2**63), -1, 0, 1, 2**63 - 1]
    ks = [keys.record_key(_RUN_TABLE, h) for h in handles]
    vs = [rowcodec.encode_row({c.id: (c.ft, random_value(rng, c)) for c in columns[1:]}) for _ in handles]
    images = _images_both_ways(False, ks, vs)
    assert [image["id"] for image in images] == handles
    unsigned = _images_both_ways(True, ks, vs)
    assert [image["id"] for image in unsigned] == [h & (2**64 - 1) for h in handles]
    assert _images_both_ways(False, ks, vs[:-1]) is None  # a value short
    assert _images_both_ways(False, ks, [*vs[:-1], vs[-1][:5]]) is None  # shorter than a v2 header
    assert _images_both_ways(False, ks, [*vs[:-1], b"\x81" + vs[-1][1:]]) is None  # not v2
    assert _images_both_ways(False, ks, [*vs[:-1], vs[-1][:1] + b"\x01" + vs[-1][2:]]) is None  # a large row
    assert _images_both_ways(False, ks, [*vs[:-1], vs[-1] + b"x"]) is None  # data past its offsets
    assert _images_both_ways(False, [*ks[:-1], ks[-1] + b"\x00"], vs) is None  # not a record key's length
    assert _images_both_ways(False, [], []) == []

    def broken(header: bytes, n_not_null: int) -> Any:
        raise RuntimeError("not a path error")

    prefix = ks[0][:11]
    for images_of in (rowfast.images, mounter._images):
        with pytest.raises(RuntimeError):  # an error that is not "leave it to the row path" propagates
            images_of(ks, vs, prefix, False, {}, broken, mounter._FAST_PATH_ERRORS)
