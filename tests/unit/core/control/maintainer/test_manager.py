"""Maintainer manager and maintainer: idempotent commands, coordinator version
checks, deduplicated heartbeats, and the changefeed checkpoint as the minimum over spans."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
from itertools import pairwise

from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.control.maintainer import manager as manager_module
from cdcflow.core.control.maintainer.maintainer import Maintainer
from cdcflow.core.control.maintainer.manager import MaintainerManager
from cdcflow.core.control.maintainer.placement import Placement
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import (
    AddMaintainerRequest,
    CoordinatorBootstrapRequest,
    CoordinatorBootstrapResponse,
    MaintainerHeartbeat,
    RemoveMaintainerRequest,
    SchedulingMessage,
    Topic,
)
from cdcflow.core.control.scheduling import Watermark
from cdcflow.core.control.span_host import SpanHost
from cdcflow.core.data.events import Span
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until
from cdcflow.core.testing.inprocess import InProcessSpanExecutor, executor_factory
from cdcflow.plugins.schedulers.round_robin import RoundRobinConfig, RoundRobinScheduler
from tests import ticker_source


def plugins() -> PluginManager:
    pm = PluginManager.default(autoload=False)
    pm.register(sys.modules[ticker_source.__name__])
    return pm


def info(epoch: int, tmp) -> ChangeFeedInfo:
    return ChangeFeedInfo(
        "cf",
        {"type": "ticker", "interval": 100.0},  # no progress: statuses stay the same
        [{"type": "file", "path": str(tmp), "protocol": "json"}],
        epoch=epoch,
    )


def test_commands_are_idempotent_and_version_checked(tmp_path, monkeypatch):
    async def main():
        pm = plugins()
        center = MessageCenter("c1")
        received: list = []
        polls = 0  # rounds of the manager's heartbeat loop
        beats: list[tuple[int, MaintainerHeartbeat]] = []  # every heartbeat, with the round that sent it

        async def coordinator(message):
            received.append(message)
            if isinstance(message, MaintainerHeartbeat):
                beats.append((polls, message))

        center.register(Topic.COORDINATOR, coordinator)
        agent = SpanHost("c1", center, executor_factory, pm, str(tmp_path), lambda: ["c1"])
        manager = MaintainerManager("c1", center, agent, pm, lambda: ["c1"])
        send_block_status = manager._send_block_status

        def counted():  # called once per round of the heartbeat loop, just before its heartbeat is sent
            nonlocal polls
            polls += 1
            send_block_status()

        manager._send_block_status = counted

        def add(version, epoch):
            return AddMaintainerRequest("c1", "c1", version, "cf", epoch, info(epoch, tmp_path).to_json(), 100)

        async def handled():
            """Every command sent so far was handled: the manager handles its commands one at a
            time in order, so once a bootstrap request sent after them is answered, they all were."""
            answers = sum(isinstance(m, CoordinatorBootstrapResponse) for m in received)
            center.send("c1", Topic.MAINTAINER_MANAGER, CoordinatorBootstrapRequest("c1", "c1", 5))
            await until(
                lambda: sum(isinstance(m, CoordinatorBootstrapResponse) for m in received) > answers,
                message="the answer to a bootstrap request sent after the commands",
            )

        center.send("c1", Topic.MAINTAINER_MANAGER, CoordinatorBootstrapRequest("c1", "c1", 5))
        center.send("c1", Topic.MAINTAINER_MANAGER, add(5, 2))
        await until(lambda: "cf" in manager.maintainers and received, observe=lambda: (manager.maintainers, received))
        first = manager.maintainers["cf"]
        assert isinstance(received[0], CoordinatorBootstrapResponse) and received[0].statuses == ()
        center.send("c1", Topic.MAINTAINER_MANAGER, add(5, 2))  # a repeat
        center.send("c1", Topic.MAINTAINER_MANAGER, add(4, 3))  # a deposed coordinator
        center.send("c1", Topic.MAINTAINER_MANAGER, RemoveMaintainerRequest("c1", "c1", 5, "cf", 1))  # older epoch
        await handled()
        assert manager.maintainers["cf"] is first and first.epoch == 2

        # Unchanged statuses: re-sent once every HEARTBEAT_EVERY, not on every poll. Counted in
        # polls, not seconds: each poll waits at least POLL, so a full heartbeat is due again
        # after at most this many polls (one more for a poll that wakes exactly on time).
        assert manager_module.HEARTBEAT_EVERY > manager_module.POLL  # so a poll is not always due
        due_within = math.ceil(manager_module.HEARTBEAT_EVERY / manager_module.POLL) + 1
        seen = len(beats)
        await until(lambda: len(beats) >= seen + 4, message="four more heartbeats")
        sent_at = [p for p, _ in beats[seen:]]
        assert all(b - a <= due_within for a, b in pairwise(sent_at)), sent_at
        with monkeypatch.context() as patch:
            patch.setattr(manager_module, "HEARTBEAT_EVERY", 3600.0)  # no full heartbeat is due now
            start = polls
            await until(lambda: polls > start)  # by then, a heartbeat sent before has arrived
            before, start = len(beats), polls
            last = {s.changefeed_id: s for _, beat in beats for s in beat.statuses}
            await until(lambda: polls >= start + due_within, message=f"{due_within} polls")
            for _, beat in beats[before:]:  # a status that changed meanwhile is sent, an unchanged one not
                for status in beat.statuses:
                    assert status != last.get(status.changefeed_id), status
                    last[status.changefeed_id] = status

        center.send("c1", Topic.MAINTAINER_MANAGER, RemoveMaintainerRequest("c1", "c1", 5, "cf", 2))

        def close_acks():
            heartbeats = [m for m in received if isinstance(m, MaintainerHeartbeat)]
            return [s for m in heartbeats for s in m.statuses if s.state == "stopped"]

        await until(close_acks, message="a heartbeat with the CloseAck")
        assert "cf" not in manager.maintainers
        acks = close_acks()
        assert acks and acks[0].epoch == 2  # CloseAck
        center.send("c1", Topic.MAINTAINER_MANAGER, add(5, 2))  # reordered after the remove
        # a scheduling request of the removed incarnation, still in flight, starts nothing
        late = {"type": "heartbeat-request", "changefeed_id": "cf", "capture_id": "c1", "epoch": 2, "seq": 99}
        center.send("c1", Topic.MAINTAINER_MANAGER, SchedulingMessage("c1", "cf", 2, late, info(2, tmp_path).to_json()))
        await handled()
        assert "cf" not in manager.maintainers
        assert "cf" not in manager.host.runs
        await manager.close()
        await center.close()

    asyncio.run(main())


def test_progress_comes_from_the_watermark_never_goes_back_and_ignores_other_epochs(tmp_path):
    async def main():
        center = MessageCenter("c1")
        m = Maintainer("c1", center, info(2, tmp_path), 100, plugins(), lambda: ["c1", "c2"])
        spans = [Span(1, b"a", b"b"), Span(2, b"b", b"c")]
        m.placement = Placement(RoundRobinScheduler(RoundRobinConfig()), "cf", 2, spans)
        sent: list[SchedulingMessage] = []

        async def agent(message):
            sent.append(message)

        center.register(Topic.MAINTAINER_MANAGER, agent)
        m._tick()
        await until(lambda: sent, message="the requests of a tick")
        assert sent and all(s.info is not None and s.epoch == 2 for s in sent)  # requests carry the declaration
        assert m.checkpoint_ts == 100 and m.block_reason  # nothing replicates yet: blocked, no progress

        m._advance(Watermark(130, 140))
        assert (m.checkpoint_ts, m.resolved_ts) == (130, 140)
        m._advance(Watermark(120, 120))  # lower: ignored
        assert (m.checkpoint_ts, m.resolved_ts) == (130, 140)
        m.on_scheduling(SchedulingMessage("c2", "cf", 1, error={"code": 2001}))  # another incarnation
        assert m.error is None
        m.on_scheduling(SchedulingMessage("c2", "cf", 2, error={"code": 2001, "retryable": "RETRY"}))
        assert m.status().state == "failed" and m.status().error["code"] == 2001
        await center.close()

    asyncio.run(main())


def test_the_agent_passes_the_newest_barrier_of_the_newest_epoch_to_the_executor(tmp_path):
    async def main():
        center = MessageCenter("c1")
        agent = SpanHost("c1", center, executor_factory, plugins(), str(tmp_path), lambda: ["c1"])

        def heartbeat(epoch, barrier):
            payload = {"type": "heartbeat-request", "changefeed_id": "cf", "capture_id": "c1", "epoch": epoch}
            return SchedulingMessage("c1", "cf", epoch, payload, info(epoch, tmp_path).to_json(), barrier_ts=barrier)

        await agent.on_request(heartbeat(2, 100))  # the executor starts with the barrier
        executor = agent.runs["cf"].executor
        assert executor.barrier_ts == 100
        await agent.on_request(SchedulingMessage("c1", "cf", 2, barrier_ts=150))  # a barrier alone
        assert executor.barrier_ts == 150
        await agent.on_request(SchedulingMessage("c1", "cf", 2, barrier_ts=120))  # a late copy
        await agent.on_request(SchedulingMessage("c1", "cf", 1, barrier_ts=500))  # an older maintainer
        assert executor.barrier_ts == 150
        await agent.on_request(heartbeat(3, 90))  # a new maintainer starts lower: its barrier holds
        assert agent.runs["cf"].executor is executor and executor.barrier_ts == 90
        await agent.close()
        await center.close()

    asyncio.run(main())


class RecordingExecutor(InProcessSpanExecutor):
    """The in-process executor, noting what it holds whenever a changefeed checkpoint arrives."""

    def __init__(self, context):
        super().__init__(context)
        #: (checkpoint handed, spans loaded here, their lowest own checkpoint)
        self.handed: list[tuple[int, int, int | None]] = []

    async def set_changefeed_checkpoint(self, ts):
        statuses = [self.status(s) for s in self.spans()]
        self.handed.append((ts, len(statuses), min((s.checkpoint_ts for s in statuses), default=None)))
        await super().set_changefeed_checkpoint(ts)


def test_the_changefeed_checkpoint_reaches_the_executor_with_heartbeats(tmp_path):
    """Maintainer → heartbeat request → span agent → executor → sinks, over the message center.

    Spans join one per tick: while one is absent the maintainer withholds progress and the
    executor holds the start checkpoint; then it follows the maintainer's checkpoint, never
    above it, never above a span's own checkpoint, never back."""

    async def main():
        pm = plugins()
        center = MessageCenter("c1")

        async def coordinator(message):
            pass

        center.register(Topic.COORDINATOR, coordinator)
        agent = SpanHost("c1", center, RecordingExecutor, pm, str(tmp_path), lambda: ["c1"])
        manager = MaintainerManager("c1", center, agent, pm, lambda: ["c1"])
        live = ChangeFeedInfo(
            "cf",
            {"type": "ticker", "interval": 0.05, "tables": 3},
            [{"type": "file", "path": str(tmp_path / "out"), "protocol": "json"}],
            scheduler={"type": "two-phase", "max-adds-per-tick": 1},
        )
        start = 100
        center.send("c1", Topic.MAINTAINER_MANAGER, CoordinatorBootstrapRequest("c1", "c1", 1))
        center.send("c1", Topic.MAINTAINER_MANAGER, AddMaintainerRequest("c1", "c1", 1, "cf", 1, live.to_json(), start))
        executor = None

        def followed() -> bool:
            """Whether four checkpoints reached the executor; on every poll, it is never ahead."""
            nonlocal executor
            maintainer, run = manager.maintainers.get("cf"), agent.runs.get("cf")
            if maintainer is None or run is None:
                return False
            executor = run.executor
            assert executor.changefeed_checkpoint <= maintainer.checkpoint_ts  # never ahead of the maintainer
            return len(executor.handed) >= 4

        try:
            await until(followed, timeout=30, interval=0.05, observe=lambda: executor and executor.handed)
        finally:
            await manager.close()
            await center.close()
        assert executor is not None
        handed = executor.handed
        assert len(handed) >= 4, handed  # it followed the maintainer's checkpoint
        assert handed[0] == (start, 0, None)  # the first heartbeat: the start checkpoint, before any span
        ts = [t for t, _, _ in handed]
        assert ts == sorted(set(ts))  # only forward, each once
        later = handed[1:]
        assert all(n == 3 for _, n, _ in later)  # nothing past the start while a span was absent
        assert all(t <= lowest for t, _, lowest in later)  # never past a span's own checkpoint
        assert executor.changefeed_checkpoint == ts[-1]  # written to the sinks

    asyncio.run(main())


def test_a_new_maintainer_declaring_the_snapshot_the_other_way_gets_a_fresh_executor(tmp_path):
    """A maintainer that places the snapshot ranges on the cluster declares the changefeed with
    initial_snapshot off; one that lets each capture copy its spans, on. An executor made one way
    is kept by a newer maintainer declaring it the same way, and closed for one declaring it the
    other way, which starts a fresh one (else spans could be copied twice, or not at all). The
    ticker source refuses initial-snapshot, so here the fresh start fails and its error goes to
    the maintainer, as for any changefeed whose executor cannot be made."""

    async def main():
        center = MessageCenter("c1")
        errors: list[SchedulingMessage] = []

        async def maintainer(message: SchedulingMessage) -> None:
            if message.error is not None:
                errors.append(message)

        center.register(Topic.MAINTAINER, maintainer)
        host = SpanHost("c1", center, executor_factory, plugins(), str(tmp_path), lambda: ["c1"])

        def heartbeat(epoch, snapshot):
            declared = dataclasses.replace(info(epoch, tmp_path), initial_snapshot=snapshot).to_json()
            payload = {"type": "heartbeat-request", "changefeed_id": "cf", "capture_id": "c1", "epoch": epoch}
            return SchedulingMessage("c1", "cf", epoch, payload, declared)

        await host.on_request(heartbeat(2, False))
        first = host.runs["cf"]
        assert not first.initial_snapshot
        await host.on_request(heartbeat(3, False))  # declared the same way: kept
        assert host.runs["cf"] is first
        await host.on_request(heartbeat(4, True))  # the other way: closed, a fresh start tried
        assert "cf" not in host.runs
        await until(lambda: errors, timeout=10, interval=0.05)
        assert "initial-snapshot" in str(errors[0].error)
        await host.close()
        await center.close()

    asyncio.run(main())
