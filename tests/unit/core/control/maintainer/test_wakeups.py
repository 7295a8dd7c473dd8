"""A span's new checkpoint travels on at once: the maintainer ticks when a response moves
a span's checkpoint (not TICK later), and its manager sends the heartbeat when the
maintainer's checkpoint moved (not POLL later). Repeats wake nothing, so the ticks that
answer a wake-up cannot wake each other in a loop."""

from __future__ import annotations

import asyncio

from cdcflow.core.control.maintainer import maintainer as maintainer_module
from cdcflow.core.control.maintainer import manager as manager_module
from cdcflow.core.control.maintainer.maintainer import Maintainer
from cdcflow.core.control.maintainer.manager import MaintainerManager
from cdcflow.core.control.maintainer.placement import Placement, encode
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import (
    AddMaintainerRequest,
    CoordinatorBootstrapRequest,
    MaintainerHeartbeat,
    SchedulingMessage,
    Topic,
)
from cdcflow.core.control.scheduling import DispatchTableResponse, HeartbeatResponse
from cdcflow.core.control.span_host import SpanHost
from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SpanState, SpanStatus
from cdcflow.core.testing import until
from cdcflow.core.testing.inprocess import executor_factory
from cdcflow.plugins.schedulers.round_robin import RoundRobinConfig, RoundRobinScheduler
from tests.unit.core.control.maintainer.test_manager import info, plugins

S1, S2 = Span(1, b"a", b"b"), Span(2, b"b", b"c")


def beat(epoch: int, *statuses: SpanStatus, capture: str = "c1") -> dict:
    return encode(HeartbeatResponse("cf", capture, epoch, statuses))


def replicating(span: Span, checkpoint: int) -> SpanStatus:
    return SpanStatus(span, SpanState.REPLICATING, checkpoint, checkpoint)


def test_a_response_tells_whether_it_moves_a_span_checkpoint():
    placement = Placement(RoundRobinScheduler(RoundRobinConfig()), "cf", 2, [S1, S2])
    assert placement.receive(beat(2, replicating(S1, 110), replicating(S2, 100)))  # both new
    assert not placement.receive(beat(2, replicating(S1, 110), replicating(S2, 100)))  # a repeat
    assert not placement.receive(beat(2, replicating(S1, 105)))  # lower: not a move
    assert placement.receive(beat(2, replicating(S2, 120)))  # one span moved
    assert not placement.receive(beat(1, replicating(S1, 500)))  # another epoch: dropped
    response = DispatchTableResponse("cf", "c1", 2, replicating(S1, 130))
    assert placement.receive(encode(response))  # a dispatch response's status counts too


def test_a_moved_span_checkpoint_wakes_the_maintainer_and_a_repeat_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(maintainer_module, "TICK", 3600.0)  # only a wake-up can tick again

    async def main():
        center = MessageCenter("c1")
        requests: list[SchedulingMessage] = []

        async def agent(message):
            requests.append(message)

        center.register(Topic.MAINTAINER_MANAGER, agent)
        m = Maintainer("c1", center, info(2, tmp_path), 100, plugins(), lambda: ["c1"])
        ticks = 0
        tick = m._tick

        def counted(**kwargs):
            nonlocal ticks
            ticks += 1
            tick(**kwargs)

        m._tick = counted  # type: ignore[method-assign]
        m.start()
        try:
            await until(lambda: ticks >= 1 and requests, message="the first tick's requests")
            assert m.placement is not None
            span = m.placement.spans[0]
            seen = ticks
            m.on_scheduling(SchedulingMessage("c1", "cf", 2, beat(2, replicating(span, 100))))
            await until(lambda: ticks > seen, message="a tick woken by the span's first checkpoint")
            seen = ticks
            m.on_scheduling(SchedulingMessage("c1", "cf", 2, beat(2, replicating(span, 100))))
            assert not m._wake.is_set()  # a repeat: no tick before TICK
            m.on_scheduling(SchedulingMessage("c1", "cf", 2, beat(2, replicating(span, 150))))
            await until(lambda: ticks > seen, message="a tick woken by the span's moved checkpoint")
        finally:
            assert m._task is not None
            m._task.cancel()
            await asyncio.gather(m._task, return_exceptions=True)
            await center.close()

    asyncio.run(main())


def test_a_tick_that_moves_the_checkpoint_tells_the_manager(tmp_path):
    async def main():
        center = MessageCenter("c1")
        requests: list[SchedulingMessage] = []

        async def agent(message):
            requests.append(message)

        center.register(Topic.MAINTAINER_MANAGER, agent)
        m = Maintainer("c1", center, info(2, tmp_path), 100, plugins(), lambda: ["c1"])
        m.placement = Placement(RoundRobinScheduler(RoundRobinConfig()), "cf", 2, [S1])
        told: list[int] = []
        m.on_progress = lambda: told.append(m.checkpoint_ts)
        seq = 0

        async def answer(checkpoint: int) -> None:
            """Tick, then answer the tick's requests as the agent would (S1 replicating)."""
            nonlocal seq
            sent = len(requests)
            m._tick()
            await until(lambda: len(requests) > sent, message="the tick's requests")
            for request in requests[sent:]:
                assert request.payload is not None
                ack = request.payload["seq"]
                seq += 1
                status = replicating(S1, checkpoint)
                if request.payload["type"] == "heartbeat-request":
                    response = encode(HeartbeatResponse("cf", "c1", 2, (status,), seq=seq, ack=ack))
                else:
                    response = encode(DispatchTableResponse("cf", "c1", 2, status, seq=seq, ack=ack))
                m.on_scheduling(SchedulingMessage("c1", "cf", 2, response))

        await answer(100)  # places S1; it replicates from the start checkpoint
        await answer(100)
        assert m.checkpoint_ts == 100 and told == []  # nothing moved
        await answer(130)
        await answer(130)
        assert m.checkpoint_ts == 130 and told == [130]  # the tick that moved it told the manager, once
        await center.close()

    asyncio.run(main())


def test_a_moved_checkpoint_is_sent_to_the_coordinator_without_waiting_for_the_poll(tmp_path, monkeypatch):
    monkeypatch.setattr(manager_module, "POLL", 3600.0)  # only a wake-up sends a heartbeat

    async def main():
        pm = plugins()
        center = MessageCenter("c1")
        beats: list[MaintainerHeartbeat] = []

        async def coordinator(message):
            if isinstance(message, MaintainerHeartbeat):
                beats.append(message)

        center.register(Topic.COORDINATOR, coordinator)
        host = SpanHost("c1", center, executor_factory, pm, str(tmp_path), lambda: ["c1"])
        manager = MaintainerManager("c1", center, host, pm, lambda: ["c1"])
        try:
            center.send("c1", Topic.MAINTAINER_MANAGER, CoordinatorBootstrapRequest("c1", "c1", 1))
            center.send(
                "c1",
                Topic.MAINTAINER_MANAGER,
                AddMaintainerRequest("c1", "c1", 1, "cf", 2, info(2, tmp_path).to_json(), 100),
            )
            await until(lambda: manager.coordinator_id and "cf" in manager.maintainers, message="the maintainer")
            m = manager.maintainers["cf"]
            assert m.on_progress is not None
            m.checkpoint_ts = 170  # as a tick that moved the watermark leaves it
            m.on_progress()
            await until(
                lambda: any(s.checkpoint_ts == 170 for b in beats for s in b.statuses),
                message="a heartbeat with the moved checkpoint",
            )
        finally:
            await manager.close()
            await center.close()

    asyncio.run(main())
