import asyncio
import itertools

from cdcflow.core.control.scheduling import (
    AddSpan,
    Agent,
    CaptureLiveness,
    DispatchTableRequest,
    DispatchTableResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    RemoveSpan,
)
from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SpanState
from cdcflow.core.testing.scheduling import MemorySpanExecutor

SPAN = Span(1, b"a", b"b")
_SEQ = itertools.count(1)


def _agent(**kw):
    return Agent("cf", "c1", MemorySpanExecutor(**kw))


def _run(agent, *msgs):
    return asyncio.run(agent.handle(list(msgs)))


def _add(epoch, secondary, ts=10):
    return DispatchTableRequest("cf", "c1", epoch, AddSpan(SPAN, ts, is_secondary=secondary), seq=next(_SEQ))


def _remove(epoch):
    return DispatchTableRequest("cf", "c1", epoch, RemoveSpan(SPAN), seq=next(_SEQ))


def _hb(epoch, cf="cf", capture="c1", checkpoint=0):
    return HeartbeatRequest(cf, capture, epoch, seq=next(_SEQ), checkpoint_ts=checkpoint)


def test_two_phase_add_reports_prepared_then_replicating():
    agent = _agent()
    [r] = _run(agent, _add(1, True))
    assert isinstance(r, DispatchTableResponse) and r.status.state is SpanState.PREPARED
    [r] = _run(agent, _add(1, False, ts=15))
    assert r.status.state is SpanState.REPLICATING and r.status.checkpoint_ts == 15


def test_slow_prepare_is_reported_when_it_finishes():
    agent = _agent(prepare_polls=2)
    [r] = _run(agent, _add(1, True))
    assert r.status.state is SpanState.PREPARING
    assert SPAN in agent.pending
    polled = _run(agent)  # the poll of the same call already made progress
    polled += _run(agent)
    assert [m.status.state for m in polled] == [SpanState.PREPARED]
    assert agent.pending == {}


def test_remove_reports_last_checkpoint_and_blocks_re_add_until_stopped():
    agent = _agent(stop_polls=2)
    _run(agent, _add(1, False))
    agent.executor.advance(42)
    [r] = _run(agent, _remove(1))
    assert r.status.state is SpanState.STOPPING
    # The add is not started while stopping; the same call's poll then finishes the stop.
    [refused, done] = _run(agent, _add(1, True))
    assert refused.status.state is SpanState.STOPPING
    assert done.status.state is SpanState.STOPPED and done.status.checkpoint_ts == 42
    assert agent.executor.spans() == []


def test_stale_epoch_and_misrouted_requests_are_dropped():
    agent = _agent()
    _run(agent, _hb(5))
    assert _run(agent, _add(4, True)) == []
    assert _run(agent, _hb(5, cf="other")) == []
    assert _run(agent, _hb(5, capture="c2")) == []
    assert agent.executor.spans() == []


def test_duplicates_and_overtaken_requests_are_dropped_and_acked_seq_reported():
    agent = _agent()
    prepare, late, remove = _add(1, True), _add(1, False), _remove(1)
    [r] = _run(agent, prepare)
    assert r.ack == prepare.seq
    _run(agent, remove)
    assert _run(agent, late) == []  # overtaken by the remove: never resurrects the span
    assert _run(agent, remove) == []  # a duplicate
    [hb] = _run(agent, _hb(1))
    assert hb.spans == () and hb.ack > remove.seq and hb.seq > r.seq


def test_heartbeat_lists_loaded_spans_and_liveness():
    agent = _agent()
    _run(agent, _add(1, False))
    agent.set_stopping()
    [hb] = _run(agent, _hb(1))
    assert isinstance(hb, HeartbeatResponse)
    assert [s.span for s in hb.spans] == [SPAN] and hb.liveness is CaptureLiveness.STOPPING


def test_prepare_after_replicating_never_steps_back():
    agent = _agent()
    _run(agent, _add(1, False))
    [r] = _run(agent, _add(1, True))
    assert r.status.state is SpanState.REPLICATING


def test_heartbeats_hand_the_changefeed_checkpoint_to_the_executor_only_forward():
    agent = _agent()
    _run(agent, _hb(1))  # a maintainer that knows no checkpoint yet: nothing handed
    assert agent.executor.changefeed_checkpoints == []
    _run(agent, _hb(1, checkpoint=100))
    _run(agent, _hb(1, checkpoint=100))  # a repeat
    stale = _hb(1, checkpoint=150)
    _run(agent, _hb(1, checkpoint=120))
    assert _run(agent, stale) == []  # overtaken: its checkpoint is dropped with it
    _run(agent, _hb(2, checkpoint=110))  # a new maintainer from an older persisted checkpoint
    _run(agent, _hb(2, checkpoint=130))
    assert _run(agent, _hb(1, checkpoint=500)) == []  # the old maintainer, late
    assert agent.executor.changefeed_checkpoints == [100, 120, 130]
