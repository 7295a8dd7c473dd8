"""Maintainer manager and maintainer: idempotent commands, coordinator version
checks, deduplicated heartbeats, and the changefeed checkpoint as the minimum over spans."""

from __future__ import annotations

import asyncio
import sys

from cdcflow.core.control.changefeed import ChangeFeedInfo
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


def test_commands_are_idempotent_and_version_checked(tmp_path):
    async def main():
        pm = plugins()
        center = MessageCenter("c1")
        received: list = []

        async def coordinator(message):
            received.append(message)

        center.register(Topic.COORDINATOR, coordinator)
        agent = SpanHost("c1", center, executor_factory, pm, str(tmp_path), lambda: ["c1"])
        manager = MaintainerManager("c1", center, agent, pm, lambda: ["c1"])

        def add(version, epoch):
            return AddMaintainerRequest("c1", "c1", version, "cf", epoch, info(epoch, tmp_path).to_json(), 100)

        center.send("c1", Topic.MAINTAINER_MANAGER, CoordinatorBootstrapRequest("c1", "c1", 5))
        center.send("c1", Topic.MAINTAINER_MANAGER, add(5, 2))
        await asyncio.sleep(0.3)
        first = manager.maintainers["cf"]
        assert isinstance(received[0], CoordinatorBootstrapResponse) and received[0].statuses == ()
        center.send("c1", Topic.MAINTAINER_MANAGER, add(5, 2))  # a repeat
        center.send("c1", Topic.MAINTAINER_MANAGER, add(4, 3))  # a deposed coordinator
        center.send("c1", Topic.MAINTAINER_MANAGER, RemoveMaintainerRequest("c1", "c1", 5, "cf", 1))  # older epoch
        await asyncio.sleep(0.3)
        assert manager.maintainers["cf"] is first and first.epoch == 2

        received.clear()
        await asyncio.sleep(3.1)
        beats = [m for m in received if isinstance(m, MaintainerHeartbeat)]
        assert 2 <= len(beats) <= 4  # unchanged statuses: about once a second, not every poll

        center.send("c1", Topic.MAINTAINER_MANAGER, RemoveMaintainerRequest("c1", "c1", 5, "cf", 2))
        await asyncio.sleep(0.5)
        assert "cf" not in manager.maintainers
        acks = [s for m in received if isinstance(m, MaintainerHeartbeat) for s in m.statuses if s.state == "stopped"]
        assert acks and acks[0].epoch == 2  # CloseAck
        center.send("c1", Topic.MAINTAINER_MANAGER, add(5, 2))  # reordered after the remove
        # a scheduling request of the removed incarnation, still in flight, starts nothing
        late = {"type": "heartbeat-request", "changefeed_id": "cf", "capture_id": "c1", "epoch": 2, "seq": 99}
        center.send("c1", Topic.MAINTAINER_MANAGER, SchedulingMessage("c1", "cf", 2, late, info(2, tmp_path).to_json()))
        await asyncio.sleep(0.3)
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
        await asyncio.sleep(0.05)
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
        for _ in range(600):
            await asyncio.sleep(0.05)
            maintainer, run = manager.maintainers.get("cf"), agent.runs.get("cf")
            if maintainer is None or run is None:
                continue
            executor = run.executor
            assert executor.changefeed_checkpoint <= maintainer.checkpoint_ts  # never ahead of the maintainer
            if len(executor.handed) >= 4:
                break
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
