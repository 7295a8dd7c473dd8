"""Seed 002's transitions, one report at a time."""

from cdcflow.core.control.scheduling import AddSpan, RemoveSpan, ReplicationState
from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SpanState, SpanStatus
from cdcflow.plugins.schedulers.two_phase.replication_set import Command, ReplicationSet

SPAN = Span(7, b"a", b"z")
A, P, C, R, X = (
    ReplicationState.ABSENT,
    ReplicationState.PREPARE,
    ReplicationState.COMMIT,
    ReplicationState.REPLICATING,
    ReplicationState.REMOVING,
)


def st(state, ckpt=0, resolved=None):
    return SpanStatus(SPAN, state, ckpt, ckpt if resolved is None else resolved)


def prepare(capture, ts):
    return [Command(capture, AddSpan(SPAN, ts, is_secondary=True))]


def replicate(capture, ts):
    return [Command(capture, AddSpan(SPAN, ts, is_secondary=False))]


def remove(capture):
    return [Command(capture, RemoveSpan(SPAN))]


def replicating_on(capture, ts=5):
    rs = ReplicationSet(SPAN, ts)
    rs.add(capture)
    rs.observe(capture, st(SpanState.PREPARED, ts), 0)
    rs.observe(capture, st(SpanState.REPLICATING, ts), 0)
    assert rs.state is R
    return rs


def test_add_is_absent_prepare_commit_replicating():
    rs = ReplicationSet(SPAN, 5)
    assert rs.add("c0") == prepare("c0", 5)
    assert (rs.state, rs.secondary, rs.primary) == (P, "c0", None)
    assert rs.observe("c0", st(SpanState.PREPARING, 5), 0) == []
    assert rs.observe("c0", st(SpanState.PREPARED, 5), 0) == replicate("c0", 5)
    assert (rs.state, rs.primary, rs.secondary) == (C, "c0", None)
    assert rs.observe("c0", st(SpanState.REPLICATING, 9, 12), 0) == []
    assert (rs.state, rs.checkpoint_ts, rs.resolved_ts) == (R, 9, 12)


def test_remove_is_replicating_removing_absent_with_last_checkpoint():
    rs = replicating_on("c0")
    assert rs.remove() == remove("c0")
    assert rs.state is X
    assert rs.observe("c0", st(SpanState.STOPPING, 6), 0) == []
    rs.observe("c0", st(SpanState.STOPPED, 8), 0)
    assert (rs.state, rs.primary, rs.checkpoint_ts) == (A, None, 8)


def test_move_prepares_target_then_stops_source_then_promotes_target():
    rs = replicating_on("c0")
    assert rs.move("c1") == prepare("c1", 5)
    assert (rs.state, rs.primary, rs.secondary) == (P, "c0", "c1")
    rs.observe("c0", st(SpanState.REPLICATING, 7), 0)  # the source keeps replicating
    assert rs.observe("c1", st(SpanState.PREPARED, 5), 0) == remove("c0")
    assert (rs.state, rs.primary, rs.secondary) == (C, "c0", "c1")
    # The source stops with checkpoint 9; the target replicates from there.
    assert rs.observe("c0", st(SpanState.STOPPED, 9), 0) == replicate("c1", 9)
    assert (rs.state, rs.primary, rs.secondary) == (C, "c1", None)
    rs.observe("c1", st(SpanState.REPLICATING, 9), 0)
    assert (rs.state, rs.primary, rs.checkpoint_ts) == (R, "c1", 9)


def test_absent_report_before_our_request_was_accepted_is_ignored():
    rs = ReplicationSet(SPAN, 5)
    [cmd] = rs.add("c0")
    rs.note_sent("c0", 10)
    assert rs.observe("c0", st(SpanState.ABSENT), ack=9) == []
    assert rs.state is P
    # Accepted but not there: the prepare was lost, so it is sent again.
    assert rs.observe("c0", st(SpanState.ABSENT), ack=10) == [cmd]


def test_target_dies_mid_move_source_keeps_replicating():
    rs = replicating_on("c0")
    rs.move("c1")
    assert rs.capture_lost("c1") == []
    assert (rs.state, rs.primary, rs.secondary) == (R, "c0", None)


def test_source_dies_while_target_prepares_move_becomes_add():
    rs = replicating_on("c0")
    rs.move("c1")
    rs.capture_lost("c0")
    assert (rs.state, rs.primary, rs.secondary) == (P, None, "c1")
    assert rs.observe("c1", st(SpanState.PREPARED, 5), 0) == replicate("c1", 5)


def test_source_dies_in_commit_target_is_promoted_at_once():
    rs = replicating_on("c0")
    rs.move("c1")
    rs.observe("c1", st(SpanState.PREPARED, 5), 0)
    assert rs.capture_lost("c0") == replicate("c1", 5)
    assert (rs.state, rs.primary, rs.secondary) == (C, "c1", None)


def test_target_dies_in_commit_source_finishes_stopping_then_absent():
    rs = replicating_on("c0")
    rs.move("c1")
    rs.observe("c1", st(SpanState.PREPARED, 5), 0)
    rs.capture_lost("c1")
    assert (rs.state, rs.primary) == (X, "c0")
    rs.observe("c0", st(SpanState.STOPPED, 6), 0)
    assert (rs.state, rs.checkpoint_ts) == (A, 6)


def test_primary_dies_while_replicating_or_adding():
    rs = replicating_on("c0")
    rs.capture_lost("c0")
    assert (rs.state, rs.primary) == (A, None)
    rs = ReplicationSet(SPAN, 5)
    rs.add("c0")
    rs.capture_lost("c0")
    assert (rs.state, rs.secondary) == (A, None)


def test_checkpoint_never_regresses():
    rs = replicating_on("c0", ts=5)
    rs.observe("c0", st(SpanState.REPLICATING, 20, 30), 0)
    rs.observe("c0", st(SpanState.REPLICATING, 10, 12), 0)
    assert (rs.checkpoint_ts, rs.resolved_ts) == (20, 30)


def test_absent_set_adopts_what_already_runs_and_strays_are_removed():
    rs = ReplicationSet(SPAN, 5)
    assert rs.observe("c0", st(SpanState.REPLICATING, 40), 0) == []
    assert (rs.state, rs.primary, rs.checkpoint_ts) == (R, "c0", 40)
    # A second copy elsewhere is told to stop: never two writers.
    assert rs.observe("c1", st(SpanState.REPLICATING, 40), 0) == remove("c1")
    assert rs.primary == "c0"


def test_lost_stop_request_is_sent_again_once_acknowledged():
    rs = replicating_on("c0")
    rs.remove()
    rs.note_sent("c0", 3)
    assert rs.observe("c0", st(SpanState.REPLICATING, 5), ack=2) == []
    assert rs.observe("c0", st(SpanState.REPLICATING, 5), ack=4) == remove("c0")


def test_prepared_copy_from_an_older_maintainer_is_removed_not_adopted():
    rs = ReplicationSet(SPAN, 5)
    assert rs.observe("c1", st(SpanState.PREPARED, 5), 0) == remove("c1")
    assert rs.state is A
