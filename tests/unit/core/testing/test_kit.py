import asyncio

import pytest

from cdcflow.core.data.events import DDLEvent, MicroBatch, OpType, TableName
from cdcflow.core.testing import ListSink, ListSinkConfig, ListSource, SimulatedCrash, delete, drive, insert, update


def events():
    orders = insert("shop", "orders", {"id": 1}, commit_ts=10)
    table = orders.table
    return [
        orders,
        insert("shop", "users", {"id": 7}, commit_ts=11),
        ListSource.resolved(12),
        update("shop", "orders", {"id": 1, "v": 0}, {"id": 1, "v": 1}, commit_ts=14),
        DDLEvent(15, "ALTER TABLE orders ADD c INT", TableName("shop", "orders", table.table_id)),
        insert("shop", "orders", {"id": 2, "c": 5}, commit_ts=16),
        delete("shop", "users", {"id": 7}, commit_ts=13),
        ListSource.resolved(20),
    ]


def test_drive_cuts_batches_at_resolved_and_ddl():
    sink = ListSink()
    result = asyncio.run(drive(ListSource.of(events()), [sink]))
    assert result.checkpoint_ts == 20
    spans = [(b.start_ts, b.end_ts) for b in result.batches]
    assert spans == [(0, 12), (12, 15), (15, 20)]
    assert [r.commit_ts for r in result.batches[1].rows] == [13, 14]
    assert [d.commit_ts for d in result.batches[1].ddl] == [15]
    assert [r.op for r in sink.rows] == [OpType.INSERT, OpType.INSERT, OpType.DELETE, OpType.UPDATE, OpType.INSERT]
    assert sink.opened and sink.closed


def test_drive_honours_filter_and_start_ts():
    from cdcflow.core.data.filter import TableFilter

    sink = ListSink()
    asyncio.run(drive(ListSource.of(events()), [sink], table_filter=TableFilter(["shop.users"]), start_ts=12))
    assert [(r.table.table, r.commit_ts) for r in sink.rows] == [("users", 13)]


def test_crash_then_replay_from_checkpoint():
    sink = ListSink(ListSinkConfig(crash_on_batch=1))
    with pytest.raises(SimulatedCrash):
        asyncio.run(drive(ListSource.of(events()), [sink]))
    assert sorted(sink.batches) == [0]
    assert sink.partial  # half the batch got out before the crash
    checkpoint = sink.batches[0].end_ts
    asyncio.run(drive(ListSource.of(events()), [sink], start_ts=checkpoint, first_batch_id=1))
    assert sink.deliveries[1] == 2
    assert [r.commit_ts for r in sink.rows] == [10, 11, 13, 14, 16]


def test_a_list_sink_keeps_an_initial_snapshots_batch_unless_told_to_crash_in_it():
    snapshot = MicroBatch("cf", -1, 5, 5, rows=tuple(events()[:1]))
    sink = ListSink()
    sink.write_batch(snapshot)  # negative ids are snapshots' batches, not "never"
    assert sink.batches == {-1: snapshot}
    crashing = ListSink(ListSinkConfig(crash_on_batch=-1))
    with pytest.raises(SimulatedCrash):
        crashing.write_batch(snapshot)
    assert crashing.batches == {}


def test_until_ts_stops_an_endless_source():
    class Endless(ListSource):
        async def feed(self, span, start_ts):
            ts = start_ts
            while True:
                ts += 10
                yield insert("s", "t", {"ts": ts}, commit_ts=ts - 5)
                yield type(self).resolved_event(span, ts)

        @staticmethod
        def resolved_event(span, ts):
            from cdcflow.core.data.events import ResolvedEvent

            return ResolvedEvent(span, ts)

    source = Endless.of([insert("s", "t", {}, commit_ts=1)])
    sink = ListSink()
    result = asyncio.run(drive(source, [sink], until_ts=50))
    assert result.checkpoint_ts >= 50
    assert all(r.commit_ts <= result.checkpoint_ts for r in sink.rows)


def test_list_source_with_create_and_drop_table_follows_its_table_set():
    from cdcflow.core.data.events import ResolvedEvent, TableSetChange
    from cdcflow.core.testing import create_table, drop_table

    late = create_table("shop", "late", commit_ts=15)
    gone = drop_table("shop", "users", commit_ts=18)
    *before, resolved = events()
    source = ListSource.of([*before, late, insert("shop", "late", {"id": 1}, commit_ts=17), gone, resolved])
    orders, users, new = (TableName("shop", t, insert("shop", t, {}, commit_ts=1).table.table_id) for t in
                          ("orders", "users", "late"))  # fmt: skip
    assert source.trigger_span() == ListSource.TRIGGER
    assert set(asyncio.run(source.tables_at(14))) == {orders, users}
    assert set(asyncio.run(source.tables_at(15))) == {orders, users, new}
    assert set(asyncio.run(source.tables_at(18))) == {orders, new}

    async def collect(stream):
        return [e async for e in stream]

    changes = asyncio.run(collect(source.table_changes(12)))
    assert changes == [
        TableSetChange(15, created=(new,), query=late.query),
        TableSetChange(18, dropped=(users,), query=gone.query),
        ResolvedEvent(ListSource.TRIGGER, 20),
    ]
    # The CREATE TABLE on the trigger span; the table's own DDL in its feed.
    trigger = asyncio.run(collect(source.feed(ListSource.TRIGGER, 0)))
    assert [e for e in trigger if isinstance(e, DDLEvent)] == [late]
    assert ListSource.of(events()).trigger_span() is None and ListSource.of(events()).table_changes(0) is None
