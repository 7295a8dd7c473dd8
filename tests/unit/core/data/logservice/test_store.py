import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.data.events import ColumnInfo, DDLEvent, RawKVEvent, Span, TableName, TableSchema
from cdcflow.core.data.logservice import EventStore, event_from_record, read_manifest
from cdcflow.core.data.logservice.records import batch_to_records, read_record_batches
from cdcflow.core.testing import insert

SPAN_A = Span(1, b"t1", b"t1~")
SPAN_B = Span(2, b"t2", b"t2~")


def raw(span, key, commit_ts, start_ts=None, value=b"v"):
    return RawKVEvent(span, key, value, b"", start_ts or commit_ts - 1, commit_ts)


def read_chunks(store, start, end):
    """Every event published in (start, end], per chunk, decoded."""
    out = []
    for chunk in store.chunks_between(start, end):
        events = []
        for batch in read_record_batches(store.directory / chunk.file):
            events.extend(event_from_record(r, store.span_of, store.schemas) for r in batch_to_records(batch))
        out.append((chunk, events))
    return out


def published_events(store, start, end):
    return [e for _, events in read_chunks(store, start, end) for e in events]


def new_store(tmp_path, **kw):
    kw.setdefault("fsync", False)
    return EventStore(tmp_path / "store", "cf", **kw)


def test_chunks_are_sorted_by_commit_start_key_and_cut_at_the_frontier(tmp_path):
    store = new_store(tmp_path)
    store.add_span(SPAN_A, 0, replicating=True)
    store.add_span(SPAN_B, 0, replicating=True)
    events = [raw(SPAN_A, b"k%d" % (i % 7), 10 + i % 5, start_ts=5 + i % 3) for i in range(40)]
    random.Random(7).shuffle(events)
    for e in events:
        store.put(SPAN_A, e)
    store.put(SPAN_B, raw(SPAN_B, b"b", 11))
    store.put(SPAN_B, raw(SPAN_B, b"c", 30))
    assert not store.resolve(SPAN_A, 20)  # span B still at 0
    assert store.resolve(SPAN_B, 12)
    assert store.published_ts == 12
    chunks = read_chunks(store, 0, 12)
    by_span = {chunk.span_id: evs for chunk, evs in chunks}
    a = by_span[0]
    assert [e.sort_key() for e in a] == sorted(e.sort_key() for e in events if e.commit_ts <= 12)
    assert [e.key for e in by_span[1]] == [b"b"]
    assert store.resolve(SPAN_B, 25)
    rest = published_events(store, 12, 25)
    assert sorted(e.sort_key() for e in rest) == sorted(e.sort_key() for e in events if e.commit_ts > 12)
    assert all(c.lo == 12 and c.hi == 20 for c, _ in read_chunks(store, 12, 25))


def test_row_changes_round_trip_with_schema_and_images(tmp_path):
    store = new_store(tmp_path)
    row = insert("shop", "orders", {"id": 1, "note": "é", "blob": b"\x00"}, commit_ts=10)
    span = Span(row.table.table_id, b"x", b"y")
    store.add_span(span, 0, replicating=True)
    store.put(span, row)
    store.resolve(span, 10)
    [got] = published_events(store, 0, 10)
    assert got == row


def test_events_at_or_below_the_floor_are_dropped(tmp_path):
    store = new_store(tmp_path)
    assert store.add_span(SPAN_A, 100, replicating=True) == 100
    assert not store.put(SPAN_A, raw(SPAN_A, b"a", 100))
    assert store.put(SPAN_A, raw(SPAN_A, b"a", 101))
    assert store.stats().dropped_duplicates == 1


def test_memory_quota_spills_sorted_runs_and_publishes_everything_in_order(tmp_path):
    store = new_store(tmp_path, memory_quota=20_000, chunk_rows=64, batch_rows=16, max_runs=6)
    store.add_span(SPAN_A, 0, replicating=True)
    rng = random.Random(1)
    events = [raw(SPAN_A, b"k%05d" % i, rng.randint(1, 50), value=b"x" * 50) for i in range(1000)]
    for e in events:
        store.put(SPAN_A, e)
        assert store.stats().memory_bytes < 20_000 + 1000
    stats = store.stats()
    assert stats.spilled_runs > 3
    assert stats.spilled_runs <= store.max_runs  # compacted beyond that
    store.resolve(SPAN_A, 25)
    first = published_events(store, 0, 25)
    assert [e.sort_key() for e in first] == sorted(e.sort_key() for e in events if e.commit_ts <= 25)
    assert all(c.rows <= 64 for c, _ in read_chunks(store, 0, 25))
    store.resolve(SPAN_A, 50)
    second = published_events(store, 25, 50)
    assert [e.sort_key() for e in second] == sorted(e.sort_key() for e in events if e.commit_ts > 25)
    assert store.stats().spilled_runs == 0
    assert not list((store.directory / "spill").iterdir())


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(0, 5)), max_size=120),
    st.lists(st.integers(1, 35), min_size=1, max_size=6),
    st.integers(2_000, 40_000),
    st.integers(2, 4),
)
def test_publishing_loses_and_repeats_nothing_whatever_the_quota(tmp_path_factory, puts, resolves, quota, max_runs):
    store = new_store(tmp_path_factory.mktemp("s"), memory_quota=quota, chunk_rows=7, batch_rows=3, max_runs=max_runs)
    store.add_span(SPAN_A, 0, replicating=True)
    expected = []
    resolved = 0
    for n, (ts, key) in enumerate(puts):
        if ts > resolved:
            event = raw(SPAN_A, b"%d-%d" % (key, n), ts)
            store.put(SPAN_A, event)
            expected.append(event)
        if n % 20 == 19 and resolves:
            resolved = max(resolved, resolves.pop())
            store.resolve(SPAN_A, resolved)
    store.resolve(SPAN_A, 40)
    got = published_events(store, 0, 40)
    assert [e.sort_key() for e in got] == sorted(e.sort_key() for e in expected)
    assert sorted(got, key=lambda e: e.sort_key()) == sorted(expected, key=lambda e: e.sort_key())


def test_cut_at_every_ddl_barrier(tmp_path):
    store = new_store(tmp_path)
    store.add_span(SPAN_A, 0, replicating=True)
    for ts in (5, 10, 15):
        store.put(SPAN_A, raw(SPAN_A, b"k%d" % ts, ts))
    ddl = DDLEvent(10, "ALTER TABLE t ADD c INT", TableName("s", "t", 1))
    assert store.put_ddl(ddl)
    assert not store.put_ddl(ddl)
    # The same change sent again with a richer schema (a newer source after a restart) is a repeat too.
    richer = TableSchema(TableName("s", "t", 1), (ColumnInfo("c", 3, origin_default=7),))
    assert not store.put_ddl(dataclasses.replace(ddl, schema_after=richer))
    assert store.put_ddl(dataclasses.replace(ddl, commit_ts=12))  # another change
    store.resolve(SPAN_A, 20)
    assert store.published_ts == 20
    assert read_manifest(store.directory).ddl_ts == [10, 12]
    assert [e.commit_ts for e in published_events(store, 0, 10)] == [5, 10]
    assert [e.commit_ts for e in published_events(store, 12, 20)] == [15]
    assert store.ddl_between(0, 10) == [ddl]
    assert store.ddl_between(12, 20) == []


def test_barrier_caps_publishing(tmp_path):
    store = new_store(tmp_path)
    store.add_span(SPAN_A, 0, replicating=True)
    store.put(SPAN_A, raw(SPAN_A, b"a", 8))
    store.set_barrier(6)
    store.resolve(SPAN_A, 10)
    assert store.published_ts == 6
    assert store.set_barrier(None)
    assert store.published_ts == 10


def test_published_chunks_survive_a_restart_until_released(tmp_path):
    store = new_store(tmp_path)
    store.add_span(SPAN_A, 0, replicating=True)
    for ts in (5, 15, 25):
        store.put(SPAN_A, raw(SPAN_A, b"k%d" % ts, ts))
    store.resolve(SPAN_A, 10)
    store.resolve(SPAN_A, 20)
    store.checkpoint(10)
    store.release(10)
    assert store.chunks_between(0, 10) == []
    del store  # a crash: nothing closed

    again = new_store(tmp_path)
    assert again.published_ts == 20
    assert [e.commit_ts for e in published_events(again, 10, 20)] == [15]
    # The span resumes from the published ts: events up to it are not fed twice.
    assert again.add_span(SPAN_A, 10, replicating=True) == 20
    assert not again.put(SPAN_A, raw(SPAN_A, b"k15", 15))
    assert again.put(SPAN_A, raw(SPAN_A, b"k25", 25))
    again.release(20)
    assert not list((again.directory / "chunks").iterdir())


def test_after_a_restart_spans_re_added_one_by_one_lose_nothing(tmp_path):
    """The spans come back one at a time (a maintainer adds them over several ticks): the
    first one moves the published ts on, and the others still feed from where the store
    stopped, catching up in new chunks, covered only once those are flushed."""
    store = new_store(tmp_path)
    store.add_span(SPAN_A, 0, replicating=True)
    store.add_span(SPAN_B, 0, replicating=True)
    store.put(SPAN_B, raw(SPAN_B, b"b15", 15))
    store.resolve(SPAN_A, 20)
    store.resolve(SPAN_B, 20)
    store.checkpoint(20, store.next_chunk)
    del store  # the executor closed (a changefeed restart) or the capture crashed

    again = new_store(tmp_path)
    assert again.add_span(SPAN_A, 20, replicating=True) == 20
    assert again.resolve(SPAN_A, 40)
    assert again.published_ts == 40  # B is not back yet
    seen = again.next_chunk
    # B must feed from 20, where its events stop in chunks, not from the published 40.
    assert again.add_span(SPAN_B, 20, replicating=True) == 20
    for ts in (25, 35, 45):
        assert again.put(SPAN_B, raw(SPAN_B, b"b%d" % ts, ts))
    assert not again.covers(SPAN_B)  # its checkpoint cannot count the store's yet
    again.resolve(SPAN_B, 40)
    late = again.chunks_in(seen, again.next_chunk)
    events = [
        event_from_record(r, again.span_of, again.schemas)
        for chunk in late
        for batch in read_record_batches(again.directory / chunk.file)
        for r in batch_to_records(batch)
    ]
    assert [e.commit_ts for e in events] == [25, 35]
    assert not again.covers(SPAN_B)
    again.checkpoint(40, again.next_chunk)
    assert again.covers(SPAN_B)


def test_prepared_span_buffers_without_publishing_then_drops_what_was_flushed_elsewhere(tmp_path):
    store = new_store(tmp_path)
    store.add_span(SPAN_A, 0, replicating=True)
    store.resolve(SPAN_A, 15)
    # B moves here from a capture that keeps replicating it: prepared below the
    # published ts, it holds nothing.
    assert store.add_span(SPAN_B, 0, replicating=False) == 0
    for ts in (5, 12, 18):
        store.put(SPAN_B, raw(SPAN_B, b"b%d" % ts, ts))
    store.resolve(SPAN_B, 20)
    store.resolve(SPAN_A, 20)
    assert store.published_ts == 20
    assert published_events(store, 0, 20) == []
    seen = store.next_chunk
    store.add_span(SPAN_B, 10, replicating=True)  # the old capture flushed up to 10
    # B resolved up to the published ts already: its events there are caught up at once.
    caught_up = store.chunks_in(seen, store.next_chunk)
    assert [c.hi for c in caught_up] == [20] and sum(c.rows for c in caught_up) == 2
    store.put(SPAN_B, raw(SPAN_B, b"b25", 25))
    store.resolve(SPAN_A, 30)
    assert store.published_ts == 20  # B's resolved ts holds the frontier
    store.resolve(SPAN_B, 30)
    assert [e.commit_ts for e in published_events(store, 0, 30)] == [12, 18, 25]


def test_spans_preparing_at_the_published_ts_hold_it_and_are_published_together(tmp_path):
    # A changefeed starts: its spans are prepared at its start ts and leave their
    # prepare phase one by one. Published together, in cuts across all of them, so
    # that the changefeed's checkpoint (the lowest of theirs) moves cut by cut
    # instead of waiting for the last span's whole catch-up.
    store = new_store(tmp_path, cut_rows=10)
    spans = [SPAN_A, SPAN_B, Span(3, b"t3", b"t3~")]
    for span in spans:
        assert store.add_span(span, 0, replicating=False) == 0
        for i in range(20):
            store.put(span, raw(span, b"k%d" % i, 10 + i))
        store.resolve(span, 100)
    store.add_span(SPAN_A, 0, replicating=True)
    assert not store.resolve(SPAN_A, 110)  # B and C prepare at the published ts: held
    assert store.published_ts == 0
    store.add_span(SPAN_B, 0, replicating=True)
    assert not store.resolve(SPAN_A, 120)
    store.add_span(spans[2], 0, replicating=True)  # the last one: published at once
    assert store.published_ts == 100
    chunks = store.chunks_in(0, store.next_chunk)
    assert all(c.lo < c.hi for c in chunks)  # cuts, no catch-up chunks
    cuts = sorted({c.hi for c in chunks})
    assert len(cuts) >= 5 and cuts[-1] == 100
    for cut in cuts[:-1]:  # every cut holds rows of every span
        assert {c.span_id for c in chunks if c.hi == cut} == {0, 1, 2}
    assert sorted(e.sort_key() for e in published_events(store, 0, 100)) == sorted(
        raw(span, b"k%d" % i, 10 + i).sort_key() for span in spans for i in range(20)
    )


def test_memory_at_its_quota_lifts_the_hold_of_a_preparing_span(tmp_path):
    store = new_store(tmp_path, memory_quota=10_000, disk_quota=1)
    store.add_span(SPAN_A, 0, replicating=True)
    store.add_span(SPAN_B, 0, replicating=False)
    n = 0
    while store.has_room():
        n += 1
        store.put(SPAN_A, raw(SPAN_A, b"k%d" % n, 5 + n % 3, value=b"x" * 100))
    assert store.resolve(SPAN_A, 10)  # published although B still prepares at 0
    assert store.published_ts == 10 and store.has_room()
    assert len(published_events(store, 0, 10)) == n


def test_backpressure_when_memory_is_full_and_the_disk_quota_forbids_spilling(tmp_path):
    store = new_store(tmp_path, memory_quota=10_000, disk_quota=1)
    store.add_span(SPAN_A, 0, replicating=True)
    n = 0
    while store.has_room():
        n += 1
        store.put(SPAN_A, raw(SPAN_A, b"k%d" % n, 5 + n % 3, value=b"x" * 100))
    assert store.stats().memory_bytes >= 10_000
    assert store.stats().spilled_runs == 0
    store.resolve(SPAN_A, 100)  # publishing moves the events to chunks and frees memory
    assert store.has_room()
    assert len(published_events(store, 0, 100)) == n


def test_remove_span_drops_unpublished_events(tmp_path):
    store = new_store(tmp_path, memory_quota=5_000)
    store.add_span(SPAN_A, 0, replicating=True)
    store.add_span(SPAN_B, 0, replicating=True)
    for i in range(50):
        store.put(SPAN_B, raw(SPAN_B, b"k%d" % i, 50))
    store.remove_span(SPAN_B)
    assert store.stats().memory_bytes == 0
    assert store.stats().spilled_runs == 0
    store.resolve(SPAN_A, 60)
    assert store.published_ts == 60
    assert published_events(store, 0, 60) == []


def test_a_span_joining_behind_the_published_ts_is_caught_up_in_new_chunks(tmp_path):
    store = new_store(tmp_path)
    store.add_span(SPAN_A, 0, replicating=True)
    store.put(SPAN_A, raw(SPAN_A, b"a", 10))
    assert store.resolve(SPAN_A, 100)
    seen = store.next_chunk
    # B joins later from an older checkpoint; no cut can take its events any more.
    store.add_span(SPAN_B, 0, replicating=True)
    for ts in (5, 50, 90):
        store.put(SPAN_B, raw(SPAN_B, b"b%d" % ts, ts))
    assert store.resolve(SPAN_B, 60)
    assert store.resolve(SPAN_B, 100)
    assert store.published_ts == 100
    late = store.chunks_in(seen, store.next_chunk)
    assert all(c.lo == c.hi == 100 and c.span_id == 1 for c in late)
    events = []
    for chunk in late:
        for batch in read_record_batches(store.directory / chunk.file):
            events.extend(event_from_record(r, store.span_of, store.schemas) for r in batch_to_records(batch))
    assert [e.commit_ts for e in events] == [5, 50, 90]
    assert not store.covers(SPAN_B)
    store.checkpoint(100, store.next_chunk)
    assert store.covers(SPAN_B)
    store.release(100, before_chunk=store.next_chunk)
    assert store.chunks_in(0, store.next_chunk) == []


def test_a_removed_and_re_added_span_publishes_what_came_after_its_checkpoint(tmp_path):
    store = new_store(tmp_path)
    store.add_span(SPAN_A, 0, replicating=True)
    store.add_span(SPAN_B, 0, replicating=True)
    store.put(SPAN_B, raw(SPAN_B, b"x", 10))
    store.resolve(SPAN_A, 40)
    store.resolve(SPAN_B, 20)
    store.remove_span(SPAN_B)
    assert store.published_ts == 40
    seen = store.next_chunk
    store.add_span(SPAN_B, 20, replicating=True)
    store.put(SPAN_B, raw(SPAN_B, b"y", 30))
    store.resolve(SPAN_B, 50)
    store.resolve(SPAN_A, 50)
    assert store.published_ts == 50
    late = [c for c in store.chunks_in(seen, store.next_chunk) if c.span_id == 1]
    assert sum(c.rows for c in late) == 1 and late[0].hi == 40


def test_a_large_resolved_interval_is_published_as_bounded_cuts_never_splitting_a_ts(tmp_path):
    store = new_store(tmp_path, cut_rows=10, auto_spill=False)
    store.add_span(SPAN_A, 0, replicating=True)
    store.add_span(SPAN_B, 0, replicating=True)
    # 60 rows over 30 commit ts in two spans; ts 40 holds 12 rows (one transaction).
    events = [raw(SPAN_A, b"a%d" % i, 10 + i) for i in range(30)] + [raw(SPAN_B, b"b%d" % i, 10 + i) for i in range(18)]
    events += [raw(SPAN_B, b"t%d" % i, 40) for i in range(12)]
    for e in events[:20]:
        store.put(e.span, e)
    store.spill()  # some rows come from spill runs, the rest from memory
    for e in events[20:]:
        store.put(e.span, e)
    store.resolve(SPAN_A, 100)
    assert store.resolve(SPAN_B, 100)
    cuts = sorted({c.hi for c in store.chunks_between(0, 100)})
    assert len(cuts) >= 5 and store.published_ts == 100
    previous, seen = 0, []
    for cut in cuts:
        rows = published_events(store, previous, cut)
        assert all(previous < e.commit_ts <= cut for e in rows)
        # Every row of a ts is in one cut; a cut holds at most the bound, or one ts alone.
        assert len(rows) <= 10 or len({e.commit_ts for e in rows}) == 1, (previous, cut, len(rows))
        seen += rows
        previous = cut
    assert sorted(e.sort_key() for e in seen) == sorted(e.sort_key() for e in events)


def test_the_data_source_stops_a_batch_at_the_cut_that_keeps_it_within_the_bound(tmp_path):
    from cdcflow.core.data.pipeline.datasource import CdcflowStreamReader

    store = new_store(tmp_path, cut_rows=10)
    store.add_span(SPAN_A, 0, replicating=True)
    for i in range(45):
        store.put(SPAN_A, raw(SPAN_A, b"k%d" % i, 10 + i))
    assert store.resolve(SPAN_A, 100)
    reader = CdcflowStreamReader(store.directory, max_batch_rows=20)
    offset = reader.initialOffset()
    batches = []
    while offset["resolved_ts"] < 100:
        end = reader.latestOffset(offset, None)
        assert end["resolved_ts"] > offset["resolved_ts"]
        rows = sum(c.rows for c in store.chunks_in(offset["chunk"], end["chunk"]))
        batches.append(rows)
        offset = end
    assert sum(batches) == 45 and max(batches) <= 20 and len(batches) >= 3
    unbounded = CdcflowStreamReader(store.directory).latestOffset(reader.initialOffset(), None)
    assert unbounded["resolved_ts"] == 100


def test_catch_up_chunks_of_a_span_that_joined_behind_are_read_in_bounded_batches(tmp_path):
    from cdcflow.core.data.pipeline.datasource import CdcflowStreamReader

    store = new_store(tmp_path, chunk_rows=10)
    store.add_span(SPAN_A, 0, replicating=True)
    assert store.resolve(SPAN_A, 50)
    # B joins behind the published ts with 45 rows below it: catch-up chunks labelled 50.
    store.add_span(SPAN_B, 0, replicating=True)
    for i in range(45):
        store.put(SPAN_B, raw(SPAN_B, b"b%d" % i, 5 + i))
    store.resolve(SPAN_B, 50)
    reader = CdcflowStreamReader(store.directory, max_batch_rows=20)
    offset = {"resolved_ts": 50, "chunk": 0}
    sizes = []
    while offset["chunk"] < store.next_chunk:
        end = reader.latestOffset(offset, None)
        assert end["resolved_ts"] == 50 and end["chunk"] > offset["chunk"]
        sizes.append(sum(c.rows for c in store.chunks_in(offset["chunk"], end["chunk"])))
        offset = end
    assert sum(sizes) == 45 and max(sizes) <= 20


def test_a_change_sent_again_is_published_once_from_memory_and_from_spill_runs(tmp_path):
    """A source sends committed changes again (TiKV rescans a split region from its resolved
    ts): the copies meet in the cut's merge, in memory or in spill runs, and one is kept."""
    store = new_store(tmp_path, memory_quota=6_000, chunk_rows=5, batch_rows=2, max_runs=2)
    store.add_span(SPAN_A, 0, replicating=True)
    first = [raw(SPAN_A, b"k%03d" % i, 10 + i % 4, value=b"x" * 40) for i in range(60)]
    again = [dataclasses.replace(e) for e in first[20:50]]  # the region's rescan
    also_same_key_other_txn = raw(SPAN_A, b"k000", 10, start_ts=3)  # another txn: not a repeat
    for e in [*first, *again, also_same_key_other_txn]:
        store.put(SPAN_A, e)
    assert store.stats().spilled_runs > 0  # copies are in runs and in memory
    store.resolve(SPAN_A, 20)
    got = published_events(store, 0, 20)
    expected = sorted([*first, also_same_key_other_txn], key=lambda e: e.sort_key())
    assert [e.sort_key() for e in got] == [e.sort_key() for e in expected]
    assert got == expected
    assert store.stats().dropped_duplicates == len(again)


def test_only_identical_commit_start_key_are_merged(tmp_path):
    from cdcflow.core.data.logservice.buffers import SpanBuffers

    records = [(1, 0, b"a"), (1, 0, b"a"), (1, 0, b"b"), (2, 0, b"a"), (2, 1, b"a"), (2, 1, b"a"), (2, 1, b"a")]
    buffers = SpanBuffers(tmp_path / "spill", "cf", memory_quota=1 << 20, disk_quota=0, max_runs=2)
    assert list(buffers._unique(records)) == [(1, 0, b"a"), (1, 0, b"b"), (2, 0, b"a"), (2, 1, b"a")]
    assert buffers.dropped == 3


def test_a_span_catching_up_behind_the_published_ts_is_flushed_chunk_by_chunk(tmp_path):
    # A changefeed's spans leave their prepare phase one by one: the first to
    # replicate moves the published ts to now, the others join behind it with their
    # whole backlog. Their checkpoints must move as that backlog is delivered, not
    # only once all of it is.
    store = new_store(tmp_path, cut_rows=10)
    store.add_span(SPAN_A, 0, replicating=True)
    assert store.resolve(SPAN_A, 100)
    store.add_span(SPAN_B, 0, replicating=True)
    for i in range(45):  # three rows a ts (one transaction): the bound of 10 falls inside one
        store.put(SPAN_B, raw(SPAN_B, b"b%d" % i, 5 + i // 3))
    assert store.resolve(SPAN_B, 100)
    late = [c for c in store.chunks_in(0, store.next_chunk) if c.span_id == 1]
    assert [c.rows for c in late] == [12, 12, 12, 9]
    # No transaction is split between two chunks (nor, so, between two batches).
    assert len({e.commit_ts for c in late for e in published_events_of(store, c)}) == 15
    assert sum(len({e.commit_ts for e in published_events_of(store, c)}) for c in late) == 15
    assert store.caught_up_ts(SPAN_B) == 0
    progress = []
    for chunk in late:
        store.checkpoint(100, chunk.seq + 1)
        flushed = store.caught_up_ts(SPAN_B)
        # Every event of the span at or below the reported ts is in a flushed chunk.
        pending = [e for c in late if c.seq > chunk.seq for e in published_events_of(store, c)]
        assert all(e.commit_ts > flushed for e in pending), (flushed, pending[:1])
        progress.append(flushed)
        assert not store.covers(SPAN_B) or chunk is late[-1]
    assert progress == sorted(progress) and len(set(progress)) == 4 and progress[-1] == 100
    assert store.covers(SPAN_B)


def published_events_of(store, chunk):
    events = []
    for batch in read_record_batches(store.directory / chunk.file):
        events.extend(event_from_record(r, store.span_of, store.schemas) for r in batch_to_records(batch))
    return events


def test_the_first_batch_does_not_take_a_whole_catch_up_with_the_cut_before_it(tmp_path):
    from cdcflow.core.data.pipeline.datasource import CdcflowStreamReader

    store = new_store(tmp_path, cut_rows=10)
    store.add_span(SPAN_A, 0, replicating=True)
    store.put(SPAN_A, raw(SPAN_A, b"a", 7))
    assert store.resolve(SPAN_A, 50)
    store.add_span(SPAN_B, 0, replicating=True)
    for i in range(45):
        store.put(SPAN_B, raw(SPAN_B, b"b%d" % i, 5 + i))
    store.resolve(SPAN_B, 50)
    reader = CdcflowStreamReader(store.directory, max_batch_rows=20)
    offset = reader.initialOffset()
    assert offset == {"resolved_ts": 0, "chunk": 0}
    sizes = []
    while offset["chunk"] < store.next_chunk:
        end = reader.latestOffset(offset, None)
        sizes.append(sum(c.rows for c in store.chunks_in(offset["chunk"], end["chunk"])))
        offset = end
    assert sum(sizes) == 46 and max(sizes) <= 20 and len(sizes) >= 3, sizes


def test_rows_without_a_key_of_one_transaction_are_all_kept(tmp_path):
    # A row source that knows no key: the rows of a transaction share their timestamps
    # and are not repeats of each other (a keyless table may even hold equal rows).
    store = new_store(tmp_path)
    store.add_span(SPAN_A, 0, replicating=True)
    rows = [insert("shop", "orders", {"id": i % 3}, commit_ts=10) for i in range(6)]
    for row in rows:
        store.put(SPAN_A, row)
    store.resolve(SPAN_A, 20)
    assert len(published_events(store, 0, 20)) == 6
    assert store.stats().dropped_duplicates == 0
