"""Raw records read column by column give the events that record by record gives."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.events import RawKVEvent, Span
from cdcflow.core.data.logservice.records import (
    batch_to_records,
    event_from_record,
    raw_events,
    raw_puts_batch,
    record_from_event,
    records_to_batch,
)
from tests.unit.fuzz.profiles import FUZZ

SPANS = {1: Span(1, b"t1", b"t2"), 7: Span(7, b"t7", b"t8")}


class _NoSchemas:
    def id_of(self, schema: object) -> int:
        raise AssertionError("raw records carry no schema")

    def get(self, schema_id: int) -> None:
        return None


events = st.builds(
    lambda span_id, key, value, old, start_ts, delta, delete: (
        span_id,
        RawKVEvent(SPANS[span_id], key, b"" if delete else value, old, start_ts, start_ts + delta, delete=delete),
    ),
    st.sampled_from(sorted(SPANS)),
    st.binary(max_size=20),
    st.binary(min_size=1, max_size=40),
    st.binary(max_size=40),
    st.integers(1, 2**62),
    st.integers(1, 1000),
    st.booleans(),
)


@FUZZ
@given(st.lists(events, max_size=30))
def test_raw_events_are_the_events_of_the_records(items: list[tuple[int, RawKVEvent]]) -> None:
    batch = records_to_batch([record_from_event(e, span_id, _NoSchemas()) for span_id, e in items])
    by_record = [event_from_record(r, SPANS.__getitem__, _NoSchemas()) for r in batch_to_records(batch)]
    assert raw_events(batch, SPANS.__getitem__) == by_record == [e for _, e in items]


class _NoSchemaIds:
    def id_of(self, schema: object) -> int:
        return -1


@FUZZ
@given(
    st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=40)), max_size=30),
    st.sampled_from(sorted(SPANS)),
    st.integers(0, 2**63 - 1),
)
def test_raw_puts_made_by_column_equal_the_records_of_their_events(
    pairs: list[tuple[bytes, bytes]], span_id: int, ts: int
) -> None:
    span = SPANS[span_id]
    want = records_to_batch(
        [record_from_event(RawKVEvent(span, k, v, b"", ts, ts), span_id, _NoSchemaIds()) for k, v in pairs]
    )
    got = raw_puts_batch([k for k, _ in pairs], [v for _, v in pairs], span_id, span.table_id, ts)
    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist()
