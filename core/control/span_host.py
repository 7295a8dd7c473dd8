"""The span host on every capture: runs the spans maintainers place here.

For each changefeed with spans here it keeps a scheduling
:class:`~cdcflow.core.control.scheduling.Agent` around one
:class:`~cdcflow.core.data.span_executor.SpanExecutor` (made by the capture's executor
factory from the changefeed declaration that requests carry). The agent
answers the maintainer's heartbeat and dispatch requests and drops duplicate,
overtaken and stale-epoch ones; the executor survives a maintainer moving to
another capture, so a new maintainer adopts the running spans. Every tick
(250 ms) pending tasks progress and responses go to the capture of the
maintainer that sent the newest request. An executor error is reported to it
instead (the maintainer, then the coordinator, decide what it means).

A newer maintainer whose requests declare the changefeed with
``initial_snapshot`` the other way than the executor was made with (the
snapshot taken by each capture for its spans, or its ranges placed on the
cluster: :mod:`cdcflow.core.control.maintainer.maintainer`) gets a fresh
executor, as one after an executor error does.

Requests carry the changefeed's barrier (``SchedulingMessage.barrier_ts``);
the agent passes it to the executor before it acts on the request, so a span
it adds never publishes past it: the newest epoch's barrier replaces an older
one, and within an epoch a late copy never moves it back.

The changefeed's agent here is closed when its last span is removed, when the
changefeed's maintainer is removed (pause, remove, restart) and when the
maintainer's capture is gone from the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cdcflow.core.config.settings import ServerSettings
from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.control.coordinator.spec import connector_for
from cdcflow.core.control.maintainer.placement import decode, encode
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import SchedulingMessage, Topic
from cdcflow.core.control.scheduling import Agent, AgentMessage, DispatchTableRequest, HeartbeatRequest, RemoveSpan
from cdcflow.core.data.span_executor import ExecutorContext, ExecutorFactory, SpanExecutor
from cdcflow.core.errors import CdcflowError, MaintainerCrashError
from cdcflow.core.metrics import CaptureMetrics
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["SpanHost"]

log = logging.getLogger(__name__)
TICK = 0.25


@dataclass
class _Run:
    agent: Agent
    executor: SpanExecutor
    maintainer_capture: str
    epoch: int
    error_sent: bool = False
    #: The newest barrier taken, as (epoch, ts): the executor publishes nothing above ts.
    barrier: tuple[int, int] | None = None
    #: Whether the executor was made to take an initial snapshot of its own spans.
    initial_snapshot: bool = False


class SpanHost:
    def __init__(
        self,
        capture_id: str,
        center: MessageCenter,
        factory: ExecutorFactory,
        plugins: PluginManager,
        data_dir: str,
        live_captures: Callable[[], list[str]],
        server: ServerSettings | None = None,
        metrics: CaptureMetrics | None = None,
    ) -> None:
        self.capture_id = capture_id
        self.metrics = metrics
        self.center = center
        self.factory = factory
        self.plugins = plugins
        self.data_dir = data_dir
        self.live_captures = live_captures
        self.server = server
        self.runs: dict[str, _Run] = {}
        #: The newest maintainer epoch removed per changefeed: later requests of it or
        #: older ones (still in flight when it was removed) must not start spans again.
        self._removed: dict[str, int] = {}
        #: Executors closing, by changefeed (their files may still be written meanwhile).
        self._closing: dict[str, int] = {}
        self._task = asyncio.create_task(self._tick_loop(), name=f"span-host-{capture_id}")

    async def on_request(self, message: SchedulingMessage) -> None:
        """A maintainer's heartbeat or dispatch request (or a new barrier alone)."""
        if message.payload is None:
            run = self.runs.get(message.changefeed_id)
            if run is not None and message.epoch >= run.epoch:
                await self._take_barrier(run, message)
            return
        request = decode(message.payload)
        if not isinstance(request, HeartbeatRequest | DispatchTableRequest):
            return
        if message.epoch <= self._removed.get(message.changefeed_id, 0):
            return
        run = self.runs.get(message.changefeed_id)
        if run is not None and message.epoch > run.epoch and self._replaced(run, message):
            await self._close(message.changefeed_id)  # a new incarnation starts on a fresh executor
            run = None
        if run is None:
            if message.info is None or isinstance(getattr(request, "task", None), RemoveSpan):
                return  # nothing runs here to remove
            run = self._start(message, request)
            if run is None:
                return
        if message.epoch >= run.epoch:
            run.maintainer_capture, run.epoch = message.sender, message.epoch
            await self._take_barrier(run, message)  # before an add: the span never publishes past it
        self._send(message.changefeed_id, run, await run.agent.handle([request]))
        removed = isinstance(request, DispatchTableRequest) and isinstance(request.task, RemoveSpan)
        if removed and not run.executor.spans() and not run.agent.pending:
            await self._close(message.changefeed_id)

    @staticmethod
    def _replaced(run: _Run, message: SchedulingMessage) -> bool:
        """Whether a newer maintainer's request needs a fresh executor: the running one
        failed, or it was made for the other way of taking the initial snapshot (its
        own spans, or the ranges the maintainer places on the cluster)."""
        if run.executor.error() is not None:
            return True
        if message.info is None:
            return False
        return bool(message.info.get("initial_snapshot", False)) != run.initial_snapshot

    @staticmethod
    async def _take_barrier(run: _Run, message: SchedulingMessage) -> None:
        """Pass the maintainer's barrier to the executor: a newer epoch's replaces the
        last one; within an epoch it only moves forward (a late copy is ignored)."""
        ts = message.barrier_ts
        if ts is None:
            return
        if run.barrier is not None and (message.epoch, ts) <= run.barrier:
            return
        run.barrier = (message.epoch, ts)
        await run.executor.set_barrier(ts)

    def _start(self, message: SchedulingMessage, request: HeartbeatRequest | DispatchTableRequest) -> _Run | None:
        assert message.info is not None
        info = ChangeFeedInfo.from_json(message.info)
        start_ts = request.task.checkpoint_ts if isinstance(request, DispatchTableRequest) else 0  # type: ignore[union-attr]
        try:
            connector = connector_for(info, self.plugins)
            context = ExecutorContext(
                info, connector, self.capture_id, self.plugins, self.data_dir, start_ts, self.server, self.metrics
            )
            executor = self.factory(context)
        except CdcflowError as exc:
            reply = SchedulingMessage(self.capture_id, message.changefeed_id, message.epoch, error=exc.to_dict())
            self.center.send(message.sender, Topic.MAINTAINER, reply)
            return None
        run = _Run(Agent(message.changefeed_id, self.capture_id, executor), executor, message.sender, message.epoch)
        run.initial_snapshot = info.initial_snapshot
        self.runs[message.changefeed_id] = run
        return run

    def _send(self, changefeed_id: str, run: _Run, responses: Sequence[AgentMessage]) -> None:
        for response in responses:
            reply = SchedulingMessage(self.capture_id, changefeed_id, run.epoch, encode(response))
            self.center.send(run.maintainer_capture, Topic.MAINTAINER, reply)

    async def remove_changefeed(self, changefeed_id: str, epoch: int) -> None:
        """Stop the changefeed's spans here (its maintainer of ``epoch`` or older was removed)."""
        self._removed[changefeed_id] = max(epoch, self._removed.get(changefeed_id, 0))
        run = self.runs.get(changefeed_id)
        if run is not None and run.epoch <= epoch:
            await self._close(changefeed_id)

    def changefeeds_here(self) -> set[str]:
        """The changefeeds with an executor on this capture, running or closing: the
        capture's sweep leaves their files alone (:mod:`cdcflow.core.control.reclaim`)."""
        return set(self.runs) | set(self._closing)

    async def _close(self, changefeed_id: str) -> None:
        run = self.runs.pop(changefeed_id, None)
        if run is not None:
            self._closing[changefeed_id] = self._closing.get(changefeed_id, 0) + 1
            try:
                await run.executor.close()
                log.info("changefeed %s: its executor on capture %s is closed", changefeed_id, self.capture_id)
            except Exception:
                log.exception("closing the executor of changefeed %s failed", changefeed_id)
            finally:
                left = self._closing.pop(changefeed_id) - 1
                if left:
                    self._closing[changefeed_id] = left

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            live = self.live_captures()
            for cf, run in list(self.runs.items()):
                if live and run.maintainer_capture not in live:
                    await self._close(cf)  # no maintainer left to report to; a new one re-adds from the checkpoint
                    continue
                failure = run.executor.error()
                if failure is not None:
                    if not run.error_sent:
                        run.error_sent = True
                        error = (
                            failure
                            if isinstance(failure, CdcflowError)
                            else MaintainerCrashError(f"changefeed {cf}: span executor failed: {failure!r}")
                        ).to_dict()
                        reply = SchedulingMessage(self.capture_id, cf, run.epoch, error=error)
                        self.center.send(run.maintainer_capture, Topic.MAINTAINER, reply)
                    continue
                self._send(cf, run, await run.agent.handle([]))

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for cf in list(self.runs):
            await self._close(cf)
