"""The maintainer: one per changefeed, on one capture (seed 000, seed 002).

It lists the changefeed's spans (through the source plugin and the table
filter), asks the scheduler plugin where each runs (through
:mod:`~cdcflow.core.maintainer.placement`), sends the span agents their
spans, and computes the changefeed's checkpoint and resolved ts as the
minimum over the spans' reports. Both only move forward, and neither moves
while a span runs nowhere or has not reported yet.

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
from cdcflow.core.errors import CdcflowError, MaintainerCrashError
from cdcflow.core.events import Span
from cdcflow.core.maintainer.placement import Placement, span_from_json, span_to_json
from cdcflow.core.messaging.center import MessageCenter
from cdcflow.core.messaging.messages import (
    AddSpanRequest,
    MaintainerStatus,
    RemoveSpanRequest,
    SpanStatusReport,
    Topic,
)
from cdcflow.core.model import ChangeFeedInfo
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.scheduling import Scheduler
from cdcflow.core.source import Source

__all__ = ["Maintainer"]

log = logging.getLogger(__name__)
TICK = 0.25
#: Re-send a span's add request when its agent has not reported it for this long.
RESEND_AFTER = 2.0


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
        self._progress: dict[Span, tuple[str, int, int]] = {}
        self._sent_at: dict[Span, float] = {}
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
        total = len(self.placement.where) if self.placement else 0
        return MaintainerStatus(
            self.info.id,
            self.epoch,
            self.state,
            self.checkpoint_ts,
            self.resolved_ts,
            self.error,
            total,
            len(self._progress),
        )

    async def _run(self) -> None:
        try:
            self.placement = await self._list_spans()
            while True:
                self._schedule()
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
        return Placement(scheduler, spans)

    def _schedule(self) -> None:
        assert self.placement is not None
        live = self.live_captures()
        self.placement.forget_captures(live)
        for span in list(self._progress):
            if self._progress[span][0] != self.placement.where.get(span):
                del self._progress[span]
        for move in self.placement.plan(live):
            if move.source is not None:
                self._send_remove(move.source, move.span)
            self._progress.pop(move.span, None)
            if move.target is not None:
                self._send_add(move.target, move.span)
        absent = sum(1 for capture in self.placement.where.values() if capture is None)
        self.block_reason = f"{absent} span(s) run nowhere: no live capture to place them on" if absent else ""
        loop = asyncio.get_running_loop()
        for span, capture in self.placement.where.items():
            if capture is not None and span not in self._progress and loop.time() - self._sent_at[span] > RESEND_AFTER:
                self._send_add(capture, span)

    def _send_add(self, capture: str, span: Span) -> None:
        self._sent_at[span] = asyncio.get_running_loop().time()
        request = AddSpanRequest(
            self.capture_id, self.info.id, self.epoch, self.info.to_json(), span_to_json(span), self.checkpoint_ts
        )
        self.center.send(capture, Topic.MAINTAINER_MANAGER, request)

    def _send_remove(self, capture: str, span: Span) -> None:
        self.center.send(
            capture,
            Topic.MAINTAINER_MANAGER,
            RemoveSpanRequest(self.capture_id, self.info.id, self.epoch, span_to_json(span)),
        )

    def on_report(self, report: SpanStatusReport) -> None:
        """Progress of this changefeed's spans on one capture."""
        if report.epoch != self.epoch or self.placement is None:
            return
        if report.error is not None:
            self._fail(report.error)
            return
        for item in report.spans:
            span = span_from_json(item.span)
            if self.placement.where.get(span) == report.sender:
                self._progress[span] = (report.sender, item.checkpoint_ts, item.resolved_ts)
        self._advance()

    def _advance(self) -> None:
        """Checkpoint and resolved ts: the minimum over spans, only when every span reported."""
        assert self.placement is not None
        if not self.placement.where or len(self._progress) < len(self.placement.where):
            return
        checkpoint = min(p[1] for p in self._progress.values())
        resolved = min(p[2] for p in self._progress.values())
        self.checkpoint_ts = max(self.checkpoint_ts, checkpoint)
        self.resolved_ts = max(self.resolved_ts, resolved, self.checkpoint_ts)

    def on_checkpoint(self, checkpoint_ts: int) -> None:
        """The coordinator persisted ``checkpoint_ts`` (CheckpointTsMessage); nothing below it
        will be asked for again. Kept for executors that release buffered data."""
        self.checkpoint_ts = max(self.checkpoint_ts, min(checkpoint_ts, self.resolved_ts))

    async def close(self) -> MaintainerStatus:
        """Stop the maintainer and every span it placed; the returned status is the CloseAck."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.placement is not None:
            for span, capture in self.placement.where.items():
                if capture is not None:
                    self._send_remove(capture, span)
        self.state = "stopped"
        return self.status()
