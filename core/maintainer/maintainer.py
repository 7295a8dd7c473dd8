"""The maintainer: one per changefeed, on one capture (seed 000, seed 002).

It lists the changefeed's spans (through the source plugin and the table
filter) and ticks the changefeed's scheduler plugin (through
:mod:`~cdcflow.core.maintainer.placement`), which places the spans on the
captures' agents and reports the watermark: the minimum checkpoint and
resolved ts over spans, withheld while a span runs nowhere. The maintainer's
checkpoint and resolved ts only move forward.

Its heartbeat requests carry its checkpoint to every capture (the executors
hand it to their sinks: Kafka resolved events). That value is safe to promise
consumers: it is either the checkpoint the changefeed started from (flushed
by the previous run, or the start ts) or a watermark, the minimum of the
spans' checkpoints, each of which moves only once every sink of the capture
running the span flushed its rows. It is sent as soon as a tick computes it,
not after the coordinator persisted it (``CheckpointTsMessage``): persisting
decides where a restart resumes, not whether rows were written, and the
persisted value is never above it.

Errors of the source, the scheduler or an executor are kept as the
maintainer's error and reported in its status; the coordinator decides what
they mean for the changefeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from cdcflow.core.coordinator.spec import connector_for
from cdcflow.core.errors import CdcflowError, MaintainerCrashError, NotAvailableError
from cdcflow.core.events import Span
from cdcflow.core.maintainer.placement import Placement
from cdcflow.core.messaging.center import MessageCenter
from cdcflow.core.messaging.messages import MaintainerStatus, SchedulingMessage, Topic
from cdcflow.core.model import ChangeFeedInfo
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.scheduling import Scheduler, SpanReplication, Watermark
from cdcflow.core.source import Source

__all__ = ["Maintainer"]

log = logging.getLogger(__name__)
TICK = 0.1


class Maintainer:
    def __init__(
        self,
        capture_id: str,
        center: MessageCenter,
        info: ChangeFeedInfo,
        checkpoint_ts: int,
        plugins: PluginManager,
        live_captures: Callable[[], list[str]],
    ) -> None:
        self.capture_id = capture_id
        self.center = center
        self.info = info
        self.plugins = plugins
        self.live_captures = live_captures
        self.checkpoint_ts = checkpoint_ts
        self.resolved_ts = checkpoint_ts
        self.state = "working"
        self.error: dict[str, Any] | None = None
        self.placement: Placement | None = None
        self._task: asyncio.Task[None] | None = None
        #: What blocks progress now (BlockStatus), "" when nothing does.
        self.block_reason = ""

    @property
    def changefeed_id(self) -> str:
        return self.info.id

    @property
    def epoch(self) -> int:
        return self.info.epoch

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"maintainer-{self.info.id}-{self.epoch}")

    def status(self) -> MaintainerStatus:
        total = len(self.placement.spans) if self.placement else 0
        replicating = self.placement.replicating() if self.placement else 0
        return MaintainerStatus(
            self.info.id, self.epoch, self.state, self.checkpoint_ts, self.resolved_ts, self.error, total, replicating
        )

    async def _run(self) -> None:
        try:
            self.placement = await self._list_spans()
            while True:
                self._tick()
                await asyncio.sleep(TICK)
        except asyncio.CancelledError:
            raise
        except CdcflowError as exc:
            self._fail(exc.to_dict())
        except Exception as exc:
            log.exception("maintainer of %s crashed", self.info.id)
            self._fail(MaintainerCrashError(f"maintainer of changefeed {self.info.id} crashed: {exc!r}").to_dict())

    def _fail(self, error: dict[str, Any]) -> None:
        self.error = error
        self.state = "failed"

    async def _list_spans(self) -> Placement:
        connector = connector_for(self.info, self.plugins)
        source: Source[Any] = connector.source.instantiate()  # type: ignore[assignment]
        scheduler: Scheduler[Any] = connector.scheduler.instantiate()  # type: ignore[assignment]
        table_filter = connector.settings.filter.table_filter()
        await source.open()
        try:
            spans = [
                span
                for table in await source.list_tables()
                if table_filter.matches(table.schema, table.table)
                for span in await source.spans_for(table)
            ]
        finally:
            await source.close()
        return Placement(scheduler, self.info.id, self.epoch, spans)

    def _tick(self, *, stopping: bool = False) -> None:
        assert self.placement is not None
        requests, watermark = self.placement.tick(self.checkpoint_ts, self.live_captures(), stopping=stopping)
        if watermark is not None and not stopping:
            self._advance(watermark)
        info = self.info.to_json()
        # Heartbeats carry the changefeed checkpoint to every capture's sinks (see the
        # module docs for why it is safe to promise downstream).
        for capture, payload in self.placement.outgoing(requests, self.checkpoint_ts):
            message = SchedulingMessage(self.capture_id, self.info.id, self.epoch, payload, info)
            self.center.send(capture, Topic.MAINTAINER_MANAGER, message)
        absent = self.placement.absent()
        self.block_reason = f"{absent} span(s) not replicating: waiting for a capture to run them" if absent else ""

    def _advance(self, watermark: Watermark) -> None:
        """The watermark moves progress forward, never back."""
        self.checkpoint_ts = max(self.checkpoint_ts, watermark.checkpoint_ts)
        self.resolved_ts = max(self.resolved_ts, watermark.resolved_ts, self.checkpoint_ts)

    def on_scheduling(self, message: SchedulingMessage) -> None:
        """An agent's response (or its executor's error) for this changefeed."""
        if message.epoch != self.epoch or self.placement is None:
            return
        if message.error is not None:
            self._fail(message.error)
        elif message.payload is not None:
            self.placement.receive(message.payload)

    def move_table(self, table_id: int, target_capture: str) -> list[Span]:
        """Queue a move of the table's spans (``Scheduler.move_table``); the next ticks carry it out."""
        return self._scheduler().move_table(table_id, target_capture)

    def replication_status(self) -> list[SpanReplication]:
        """Every span's scheduling status (``Scheduler.replication_status``)."""
        return self._scheduler().replication_status()

    def _scheduler(self) -> Scheduler[Any]:
        if self.placement is None:
            raise NotAvailableError(
                f"changefeed {self.info.id} is still listing its spans; retry in a moment",
                detail={"changefeed_id": self.info.id},
            )
        return self.placement.scheduler

    def on_checkpoint(self, checkpoint_ts: int) -> None:
        """The coordinator persisted ``checkpoint_ts`` (CheckpointTsMessage): nothing at
        or below it will be asked for again. The persisted value comes from this
        maintainer's (or an earlier incarnation's) flushed checkpoints, so the
        heartbeats may carry it on to the sinks."""
        self.checkpoint_ts = max(self.checkpoint_ts, min(checkpoint_ts, self.resolved_ts))

    async def close(self) -> MaintainerStatus:
        """Stop the maintainer and ask the agents to remove its spans; the returned status is the CloseAck."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.placement is not None:
            with contextlib.suppress(CdcflowError):
                self._tick(stopping=True)
        self.state = "stopped"
        return self.status()
