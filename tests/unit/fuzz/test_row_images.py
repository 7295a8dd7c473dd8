"""Row images as the event store keeps them (``dumps_image`` / ``loads_image``): every value
comes back equal, of the same type, with the same zone, ``fold`` and Decimal exponent, in both
the tagged form and the plain pickle it falls back to; images of earlier releases still load."""

from __future__ import annotations

import datetime as dt
import decimal
import pickle
import zoneinfo
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.events import OpType, RowChange, Span, TableName
from cdcflow.core.data.logservice.records import (
    KIND_ROW,
    dumps_image,
    event_from_record,
    loads_image,
    record_from_event,
)
from tests.unit.fuzz.profiles import FUZZ

_TAGGED = 1

plain_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
tagged_values = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True),
    st.dates(),
    st.datetimes(),
    st.datetimes(timezones=st.just(dt.UTC)),
    st.datetimes().map(lambda d: d.replace(fold=1)),
    st.timedeltas(),
)
names = st.text(min_size=1, max_size=12)


def same(a: Any, b: Any) -> bool:
    """Equal, of one type, and alike where equality looks past it."""
    if type(a) is not type(b):
        return False
    if isinstance(a, decimal.Decimal):
        return a.as_tuple() == b.as_tuple()  # NaN != NaN; 1.0 == 1.00
    if isinstance(a, dt.datetime):
        # The same zone: UTC stays the UTC singleton; a pickled zone comes back alike.
        zone = a.tzinfo is b.tzinfo or (type(a.tzinfo) is type(b.tzinfo) and repr(a.tzinfo) == repr(b.tzinfo))
        return a == b and zone and a.fold == b.fold
    return bool(a == b)


def assert_round_trip(image: dict[str, Any]) -> bytes:
    data = dumps_image(image)
    back = loads_image(data)
    assert list(back) == list(image)
    for name, value in image.items():
        assert same(back[name], value), (name, value, back[name])
    return data


@FUZZ
@given(st.dictionaries(names, st.one_of(plain_values, tagged_values), max_size=12))
def test_images_of_the_values_rows_hold_round_trip_in_the_tagged_form(image: dict[str, Any]) -> None:
    data = assert_round_trip(image)
    assert data[0] == _TAGGED


@FUZZ
@given(
    st.dictionaries(names, st.one_of(plain_values, tagged_values), max_size=8),
    st.sampled_from(
        [
            dt.datetime(2024, 3, 10, 2, 30, tzinfo=zoneinfo.ZoneInfo("America/New_York")),
            dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(0), "Z")),  # equal to UTC, not UTC itself
            dt.time(12, 30, 1, 5),
            (1, "a"),
            [1, 2],
            bytearray(b"ab"),
            decimal.Decimal,
        ]
    ),
)
def test_an_image_with_any_other_value_is_a_plain_pickle(image: dict[str, Any], other: Any) -> None:
    image["other"] = other
    data = assert_round_trip(image)
    assert data[:1] == pickle.PROTO


def test_tagged_values_keep_what_equality_overlooks() -> None:
    image = {
        "price": decimal.Decimal("-0.00"),
        "big": decimal.Decimal("1E+30"),
        "nan": decimal.Decimal("sNaN12"),
        "at": dt.datetime(2021, 11, 7, 1, 30, fold=1),
        "utc": dt.datetime(1, 1, 1, tzinfo=dt.UTC),
        "day": dt.date.max,
        "span": dt.timedelta(days=-3, microseconds=7),
        "flag": True,
    }
    assert dumps_image(image)[0] == _TAGGED
    assert_round_trip(image)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_images_an_earlier_release_pickled_still_load(protocol: int) -> None:
    image = {"id": 1, "price": decimal.Decimal("9.50"), "at": dt.datetime(2024, 1, 2, tzinfo=dt.UTC)}
    assert loads_image(pickle.dumps(image, protocol=protocol)) == image


def test_a_row_change_crosses_the_record_form_with_its_images() -> None:
    table = TableName("shop", "orders", 42, -1)
    before = {"id": 7, "total": decimal.Decimal("10.00"), "at": dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)}
    after = dict(before, total=decimal.Decimal("12.50"))
    change = RowChange(table, OpType.UPDATE, 200, 199, after, before, None, b"k")

    class NoSchemas:
        def id_of(self, schema: Any) -> int:
            return -1

        def get(self, schema_id: int) -> None:
            return None

    record = record_from_event(change, 3, NoSchemas())  # type: ignore[arg-type]
    assert record[3] == KIND_ROW and record[10][0] == _TAGGED and record[11][0] == _TAGGED
    back = event_from_record(record, lambda _: Span(42, b"", b""), NoSchemas())  # type: ignore[arg-type]
    assert back == change
