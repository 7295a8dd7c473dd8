"""The span agent on every capture: runs the spans maintainers place here.

It holds one :class:`~cdcflow.core.executor.SpanExecutor` per changefeed
incarnation (epoch), made by the capture's executor factory, and reports the
spans' progress to the maintainer that placed them (on MaintainerTopic) on
change and at least every second. A request of an older epoch than the one
running is ignored; a newer epoch replaces the executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from cdcflow.core.config.model import ServerSettings
from cdcflow.core.coordinator.spec import connector_for
from cdcflow.core.errors import CdcflowError, MaintainerCrashError
from cdcflow.core.executor import SpanExecutor, SpanState
from cdcflow.core.executor_factory import ExecutorContext, ExecutorFactory
from cdcflow.core.maintainer.placement import span_from_json, span_to_json
from cdcflow.core.messaging.center import MessageCenter
from cdcflow.core.messaging.messages import AddSpanRequest, RemoveSpanRequest, SpanReport, SpanStatusReport, Topic
from cdcflow.core.model import ChangeFeedInfo
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["SpanAgent"]

log = logging.getLogger(__name__)
REPORT_INTERVAL = 0.25


@dataclass
class _Run:
    epoch: int
    executor: SpanExecutor
    maintainer_capture: str
    last_report: tuple[SpanReport, ...] | None = None
    last_sent: float = 0.0
    spans: set[str] = field(default_factory=set)


class SpanAgent:
    def __init__(
        self,
        capture_id: str,
        center: MessageCenter,
        factory: ExecutorFactory,
        plugins: PluginManager,
        data_dir: str,
        live_captures: Callable[[], list[str]],
        server: ServerSettings | None = None,
    ) -> None:
        self.live_captures = live_captures
        self.server = server
        self.capture_id = capture_id
        self.center = center
        self.factory = factory
        self.plugins = plugins
        self.data_dir = data_dir
        self.runs: dict[str, _Run] = {}
        self._task = asyncio.create_task(self._report_loop(), name=f"span-agent-{capture_id}")

    async def on_add(self, req: AddSpanRequest) -> None:
        run = self.runs.get(req.changefeed_id)
        if run is not None and req.epoch < run.epoch:
            return
        if run is not None and req.epoch > run.epoch:
            await self._close(req.changefeed_id)
            run = None
        if run is None:
            info = ChangeFeedInfo.from_json(req.info)
            try:
                connector = connector_for(info, self.plugins)
                context = ExecutorContext(
                    info, connector, self.capture_id, self.plugins, self.data_dir, req.checkpoint_ts, self.server
                )
                executor = self.factory(context)
            except CdcflowError as exc:
                self._send_error(req, exc)
                return
            run = self.runs[req.changefeed_id] = _Run(req.epoch, executor, req.sender)
        run.maintainer_capture = req.sender
        try:
            await run.executor.add_span(span_from_json(req.span), req.checkpoint_ts, prepare=req.prepare)
        except CdcflowError as exc:
            self._send_error(req, exc)

    def _send_error(self, req: AddSpanRequest, exc: CdcflowError) -> None:
        report = SpanStatusReport(self.capture_id, req.changefeed_id, req.epoch, (), exc.to_dict())
        self.center.send(req.sender, Topic.MAINTAINER, report)

    async def on_remove(self, req: RemoveSpanRequest) -> None:
        run = self.runs.get(req.changefeed_id)
        if run is None or req.epoch < run.epoch:
            return
        await run.executor.remove_span(span_from_json(req.span))
        if not run.executor.spans():
            await self._close(req.changefeed_id)

    async def remove_changefeed(self, changefeed_id: str, epoch: int) -> None:
        """Stop every span of the changefeed's incarnations up to ``epoch``."""
        run = self.runs.get(changefeed_id)
        if run is not None and run.epoch <= epoch:
            await self._close(changefeed_id)

    async def _close(self, changefeed_id: str) -> None:
        run = self.runs.pop(changefeed_id, None)
        if run is not None:
            try:
                await run.executor.close()
            except Exception:
                log.exception("closing the executor of changefeed %s failed", changefeed_id)

    async def _report_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(REPORT_INTERVAL)
            now = loop.time()
            live = self.live_captures()
            for cf, run in list(self.runs.items()):
                if live and run.maintainer_capture not in live:
                    # the maintainer's capture is gone; its successor starts with a newer epoch
                    await self._close(cf)
                    continue
                reports = tuple(
                    SpanReport(span_to_json(st.span), st.state.value, st.checkpoint_ts, st.resolved_ts)
                    for st in (run.executor.status(span) for span in run.executor.spans())
                    if st.state is not SpanState.ABSENT
                )
                failure = run.executor.error()
                error = None
                if failure is not None:
                    error = (
                        failure
                        if isinstance(failure, CdcflowError)
                        else MaintainerCrashError(f"changefeed {cf}: span executor failed: {failure!r}")
                    ).to_dict()
                if reports == run.last_report and error is None and now - run.last_sent < 1.0:
                    continue
                run.last_report, run.last_sent = reports, now
                self.center.send(
                    run.maintainer_capture,
                    Topic.MAINTAINER,
                    SpanStatusReport(self.capture_id, cf, run.epoch, reports, error),
                )

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for cf in list(self.runs):
            await self._close(cf)
