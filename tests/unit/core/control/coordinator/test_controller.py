"""The controller's rules: every allowed and forbidden transition, and
properties over random event sequences (duplicates, reordering, stale epochs)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.control.changefeed import (
    ALLOWED_TRANSITIONS,
    ChangeFeedInfo,
    ChangefeedState,
    ChangeFeedStatus,
    InvalidTransitionError,
    check_transition,
)
from cdcflow.core.control.coordinator.controller import AddMaintainer, Controller, RemoveMaintainer
from cdcflow.core.control.messaging.messages import MaintainerStatus
from cdcflow.core.errors import UnsupportedProtocolError

S = ChangefeedState


@pytest.mark.parametrize(("old", "new"), list(itertools.product(S, S)))
def test_every_transition_is_allowed_or_refused(old, new):
    if (old, new) in ALLOWED_TRANSITIONS:
        check_transition("cf", old, new)
    else:
        with pytest.raises(InvalidTransitionError):
            check_transition("cf", old, new)


def test_seed_constraints():
    assert {new for old, new in ALLOWED_TRANSITIONS if old is S.FAILED} == {S.REMOVED}
    assert (S.NORMAL, S.PAUSED) in ALLOWED_TRANSITIONS and (S.PAUSED, S.NORMAL) in ALLOWED_TRANSITIONS
    assert (S.WARNING, S.FAILED) in ALLOWED_TRANSITIONS
    assert all((s, S.WARNING) in ALLOWED_TRANSITIONS for s in (S.NORMAL, S.PAUSED))


def running(captures=("a", "b")) -> tuple[Controller, ChangeFeedInfo]:
    c = Controller(heartbeat_timeout=10)
    c.on_captures(list(captures), 0)
    info = ChangeFeedInfo("cf", {"type": "list"}, [{"type": "list"}], error_stuck_duration=100)
    d = c.create(info, ChangeFeedStatus(100, 100), 0)
    assert [type(x) for x in d.commands] == [AddMaintainer]
    return c, c.changefeeds["cf"].info


def beat(c: Controller, epoch: int, ckpt: int, now: float, capture=None, error=None):
    cap = capture or c.changefeeds["cf"].capture or "a"
    return c.on_heartbeat(cap, [MaintainerStatus("cf", epoch, "working", ckpt, ckpt, error)], now)


def test_retryable_error_warning_then_restart_with_new_epoch_then_normal():
    c, info = running()
    d = beat(c, info.epoch, 110, 1, error={"retryable": "RETRY", "severity": "WARN", "code": 2001})
    rt = c.changefeeds["cf"]
    assert rt.info.state is S.WARNING and any(isinstance(x, RemoveMaintainer) for x in d.commands)
    assert rt.retry_at is not None
    restart_at = rt.retry_at
    d = c.tick(restart_at)
    assert rt.info.epoch == info.epoch + 1 and any(isinstance(x, AddMaintainer) for x in d.commands)
    beat(c, rt.info.epoch, 120, restart_at + 1)
    assert rt.info.state is S.NORMAL and rt.status.checkpoint_ts == 120


def test_warning_becomes_failed_after_stuck_duration():
    c, info = running()
    beat(c, info.epoch, 110, 1, error={"retryable": "RETRY"})
    c.tick(102)
    assert c.changefeeds["cf"].info.state is S.FAILED


def test_fatal_error_fails_and_failed_cannot_resume():
    c, info = running()
    beat(c, info.epoch, 110, 1, error=UnsupportedProtocolError("x").to_dict())
    assert c.changefeeds["cf"].info.state is S.FAILED
    with pytest.raises(InvalidTransitionError, match="can only be removed"):
        c.resume("cf", 2)
    assert c.remove("cf", 3).removed == ["cf"]


def test_heartbeat_timeout_moves_maintainer():
    c, info = running()
    first = c.changefeeds["cf"].capture
    d = c.tick(11)
    rt = c.changefeeds["cf"]
    assert rt.capture != first and rt.info.epoch > info.epoch
    assert rt.info.error is not None and rt.info.error["code"] == 4002
    assert any(isinstance(x, AddMaintainer) and x.capture == rt.capture for x in d.commands)


def test_capture_loss_moves_maintainer_without_warning():
    c, info = running()
    gone = c.changefeeds["cf"].capture
    c.on_captures([x for x in ("a", "b") if x != gone], 1)
    rt = c.changefeeds["cf"]
    assert rt.capture not in (None, gone) and rt.info.state is S.NORMAL and rt.info.epoch == info.epoch + 1


events = st.one_of(
    st.tuples(st.just("beat"), st.integers(0, 6), st.integers(0, 500), st.sampled_from(["a", "b", "c"])),
    st.tuples(st.just("error"), st.integers(0, 6), st.booleans(), st.sampled_from(["a", "b"])),
    st.tuples(st.sampled_from(["pause", "resume", "tick", "drop-b", "add-b"]), st.integers(0, 50)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(events, max_size=40))
def test_random_event_sequences_keep_invariants(seq):
    c, _ = running()
    now = 0.0
    last_ckpt = 100
    states = [S.NORMAL]
    for event in seq:
        now += 1
        rt = c.changefeeds["cf"]
        before = rt.info.state
        epoch = rt.info.epoch
        kind = event[0]
        try:
            if kind == "beat":
                d = beat(c, event[1], event[2], now, capture=event[3])
            elif kind == "error":
                err = {"retryable": "NONE" if event[2] else "RETRY"}
                d = beat(c, event[1], 0, now, capture=event[3], error=err)
            elif kind == "pause":
                d = c.pause("cf", now)
            elif kind == "resume":
                d = c.resume("cf", now)
            elif kind == "tick":
                now += event[1]
                d = c.tick(now)
            elif kind == "drop-b":
                d = c.on_captures(["a"], now)
            else:
                d = c.on_captures(["a", "b"], now)
        except InvalidTransitionError:
            assert rt.info.state is before  # refused, never half-applied
            continue
        after = rt.info.state
        if after is not before:
            states.append(after)
        # checkpoints never go back, and only heartbeats of the current epoch move them
        assert rt.status.checkpoint_ts >= last_ckpt
        if kind == "beat" and event[1] != epoch:
            assert rt.status.checkpoint_ts == last_ckpt
        last_ckpt = rt.status.checkpoint_ts
        # commands never start an old incarnation; at most one add per batch
        adds = [x for x in d.commands if isinstance(x, AddMaintainer)]
        assert len(adds) <= 1 and all(x.epoch == rt.info.epoch for x in adds)
        assert rt.info.epoch >= epoch
        if not rt.info.state.runs:
            assert rt.capture is None
    for old, new in itertools.pairwise(states):
        assert (old, new) in ALLOWED_TRANSITIONS


def test_close_ack_of_a_pause_carries_the_final_checkpoint():
    c, info = running()
    capture = c.changefeeds["cf"].capture
    c.pause("cf", 1)
    d = c.on_heartbeat(capture, [MaintainerStatus("cf", info.epoch, "stopped", 150, 150)], 2)
    assert d.checkpoints["cf"].checkpoint_ts == 150 and not d.commands
    d = c.on_heartbeat(capture, [MaintainerStatus("cf", info.epoch - 1, "stopped", 900, 900)], 3)
    assert not d.checkpoints  # an older incarnation's ack moves nothing


def test_block_status_is_recorded_and_its_error_handled():
    from cdcflow.core.control.messaging.messages import BlockStatusRequest

    c, info = running()
    capture = c.changefeeds["cf"].capture
    c.on_block_status(capture, BlockStatusRequest(capture, "cf", info.epoch, "1 span(s) run nowhere"), 1)
    assert c.changefeeds["cf"].block_reason == "1 span(s) run nowhere"
    error = {"retryable": "LATER", "code": 2002}
    c.on_block_status(capture, BlockStatusRequest(capture, "cf", info.epoch, "back pressure", error=error), 2)
    assert c.changefeeds["cf"].info.state is S.WARNING
