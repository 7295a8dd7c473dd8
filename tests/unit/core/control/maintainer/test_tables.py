"""The changefeed's table set while tables come and go: a change waits for the checkpoint to
reach its commit ts, the barrier holds the captures there until the new spans replicate, and
the checkpoint never passes a span that joined before it caught up."""

from __future__ import annotations

from cdcflow.core.control.maintainer.tables import ChangefeedTables
from cdcflow.core.control.scheduling import ReplicationState, SpanReplication
from cdcflow.core.data.events import Span, TableName, TableSetChange
from cdcflow.core.data.filter import TableFilter

TRIGGER = Span(0, b"ddl", b"ddl~")
A = TableName("shop", "a", 11)
B = TableName("shop", "b", 12)
OTHER = TableName("other", "x", 13)


def span(table: TableName) -> Span:
    return Span(table.table_id, b"t%d" % table.table_id, b"t%d~" % table.table_id)


def status(s: Span, state: ReplicationState, checkpoint: int) -> SpanReplication:
    return SpanReplication(s, state, "c1", None, checkpoint, checkpoint)


def tables(*initial: TableName, start: int = 100) -> ChangefeedTables:
    return ChangefeedTables(TableFilter(["shop.*"]), {t: [span(t)] for t in initial}, TRIGGER, start)


def test_a_created_table_is_added_at_its_commit_ts_and_the_barrier_holds_until_it_replicates():
    t = tables(A)
    assert t.spans() == [TRIGGER, span(A)]
    assert t.barrier() == 100  # nothing known above the start yet: no capture publishes past it

    assert t.receive(TableSetChange(150, created=(B,), query="CREATE TABLE b"), {B: [span(B)]})
    t.resolve(200)
    assert t.barrier() == 150 and t.checkpoint_cap({}) == 150
    assert t.apply_due(149) == [] and span(B) not in t.spans()  # not every span reached it yet

    assert t.apply_due(150) == [150]
    assert t.spans() == [TRIGGER, span(A), span(B)]
    assert t.barrier() == 150  # the new span is not replicating yet
    t.settle([status(span(B), ReplicationState.PREPARE, 150)], 150)
    assert t.barrier() == 150
    t.settle([status(span(B), ReplicationState.REPLICATING, 150)], 150)
    assert t.barrier() == 200 and t.checkpoint_cap({}) == 200 and not t.joining


def test_a_joined_span_caps_the_checkpoint_until_it_reaches_the_schedulers_watermark():
    t = tables(A)
    t.receive(TableSetChange(150, created=(B,)), {B: [span(B)]})
    t.resolve(400)
    t.apply_due(150)
    # The scheduler's watermark never goes back: it may stand above the span that just joined.
    joined = status(span(B), ReplicationState.REPLICATING, 150)
    t.settle([joined], 300)
    assert t.barrier() == 400 and t.joining
    assert t.checkpoint_cap({span(B): joined}) == 150
    caught_up = status(span(B), ReplicationState.REPLICATING, 300)
    t.settle([caught_up], 300)
    assert not t.joining and t.checkpoint_cap({span(B): caught_up}) == 400


def test_a_dropped_table_is_removed_at_its_commit_ts():
    t = tables(A, B)
    assert t.receive(TableSetChange(150, dropped=(B,)), {})
    t.resolve(200)
    assert t.barrier() == 150
    assert t.apply_due(150) == [150]
    assert t.spans() == [TRIGGER, span(A)] and t.barrier() == 200 and not t.joining


def test_changes_outside_the_filter_or_already_known_do_not_hold_the_changefeed():
    t = tables(A)
    assert not t.receive(TableSetChange(150, created=(OTHER,)), {OTHER: [span(OTHER)]})
    assert not t.receive(TableSetChange(160, dropped=(OTHER,)), {})
    assert not t.receive(TableSetChange(170, created=(A,)), {A: [span(A)]})  # a table it has
    t.resolve(200)
    assert t.barrier() == 200 and t.next_change() is None


def test_truncate_replaces_the_span_and_rename_within_the_filter_keeps_it():
    t = tables(A)
    new_a = TableName("shop", "a", 21)
    assert t.receive(TableSetChange(150, dropped=(A,), created=(new_a,), query="TRUNCATE a"), {new_a: [span(new_a)]})
    renamed = TableName("shop", "a2", 21)
    assert t.receive(TableSetChange(170, dropped=(new_a,), created=(renamed,)), {renamed: [span(renamed)]})
    t.resolve(200)
    assert t.next_change() == (150, "TRUNCATE a")
    t.apply_due(150)
    assert t.spans() == [TRIGGER, span(new_a)] and t.barrier() == 150
    t.settle([status(span(new_a), ReplicationState.REPLICATING, 150)], 150)
    assert t.barrier() == 170  # the next change
    t.apply_due(170)
    assert t.spans() == [TRIGGER, span(renamed)] and t.tables() == [renamed]
    assert t.barrier() == 200 and not t.joining  # the same span: nothing joins


def test_changes_are_applied_one_commit_ts_at_a_time():
    t = tables()
    t.receive(TableSetChange(150, created=(A,)), {A: [span(A)]})
    t.receive(TableSetChange(160, created=(B,)), {B: [span(B)]})
    t.resolve(200)
    assert t.apply_due(155) == [150] and t.spans() == [TRIGGER, span(A)]
    assert t.barrier() == 150  # A does not replicate yet
    t.settle([status(span(A), ReplicationState.REPLICATING, 150)], 150)
    assert t.barrier() == 160
    assert t.apply_due(160) == [160] and t.spans() == [TRIGGER, span(A), span(B)]


def test_a_fixed_table_set_has_no_barrier():
    t = ChangefeedTables(TableFilter(["shop.*"]), {A: [span(A)]}, None, 100)
    t.resolve(500)
    assert not t.followed and t.barrier() is None and t.checkpoint_cap({}) is None
    assert t.spans() == [span(A)]
