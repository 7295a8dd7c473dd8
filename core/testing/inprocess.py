"""An in-process span executor for tests and for plugin authors: it runs a
changefeed's source feeds straight into its sinks on the capture's event loop.

It is what :func:`cdcflow.core.testing.drive` does, behind the
:class:`~cdcflow.core.data.span_executor.SpanExecutor` interface, so that the control
plane can be exercised end to end (checkpoints really advance) without Spark.
This module is a built-in plugin: it registers the executor as ``in-process``
(``cdcflow server --executor in-process``).
It is not cdcflow's data pipeline: no event store, no spilling, no
parallelism beyond the event loop.

Per span, rows are buffered until the span's resolved ts passes them (raw
key-value changes of a source that yields them are mounted then, with the
source's :class:`~cdcflow.core.data.source.Mounter`, one at a time), then
written to every sink as one micro-batch; the span's checkpoint is that
resolved ts once every sink returned, and observers hear of it as of a
pipeline batch (``cdcflow_batch_flushed``). Batch ids increase per executor, so a
restarted changefeed may write a range again under new ids (sinks see an
at-least-once replay, which their contract makes idempotent). Since its batch ids
start at 0, each executor is a writer of its own to the sinks
(``SinkContext.writer_id``, a new id per executor): a sink that recognises replays
by (changefeed, writer, batch id) never takes one executor's batch for another's
(two captures of a cluster, or the same capture before a restart).

The changefeed checkpoint from the maintainer's heartbeats
(:meth:`~cdcflow.core.data.span_executor.SpanExecutor.set_changefeed_checkpoint`) is
written to every sink (``Sink.write_checkpoint``) at once, on the event loop,
where batches are written too, so the two never interleave; a sink error is
the executor's error, like a batch's.

Two-phase scheduling: a span added with ``prepare=True`` runs its feed and
buffers rows but writes nothing (state ``PREPARED``); added again with
``prepare=False`` it drops what is at or below the given checkpoint (the
previous capture wrote it) and writes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.data.events import DDLEvent, MicroBatch, RawKVEvent, ResolvedEvent, RowChange, Span
from cdcflow.core.data.filter import replicates_ddl
from cdcflow.core.data.sink import Sink, SinkContext
from cdcflow.core.data.source import Mounter, Source
from cdcflow.core.data.span_executor import (
    ExecutorContext,
    ExecutorRegistrar,
    SpanExecutor,
    SpanState,
    SpanStatus,
)
from cdcflow.core.plugin.hookspec import hookimpl

__all__ = ["EXECUTOR_NAME", "InProcessSpanExecutor", "cdcflow_register_executors", "executor_factory"]

#: The name ``--executor`` takes for this executor.
EXECUTOR_NAME = "in-process"


@dataclass
class _SpanRun:
    checkpoint_ts: int
    resolved_ts: int
    task: asyncio.Task[None] | None = None
    rows: list[RowChange] = field(default_factory=list)
    ddl: list[DDLEvent] = field(default_factory=list)
    #: Raw key-value changes (a source that yields them), mounted once resolved.
    raw: list[RawKVEvent] = field(default_factory=list)
    #: Phase one of two-phase scheduling: feed and buffer, write nothing.
    prepared_only: bool = False


class InProcessSpanExecutor(SpanExecutor):
    """Feeds → sinks in process. See the module docstring."""

    def __init__(self, context: ExecutorContext) -> None:
        self.context = context
        self.source: Source[Any] = context.connector.source.instantiate()  # type: ignore[assignment]
        self.sinks: list[Sink[Any]] = [s.instantiate() for s in context.connector.sinks]  # type: ignore[misc]
        self.table_filter = context.connector.settings.filter.table_filter()
        self._spans: dict[Span, _SpanRun] = {}
        self._removed: dict[Span, int] = {}
        self._opened = False
        self._error: BaseException | None = None
        self._batch_ids = itertools.count()
        #: This executor's writer identity (its batch ids are its own; see the module docs).
        self.writer_id = uuid.uuid4().hex
        self.barrier_ts: int | None = None
        #: The newest changefeed checkpoint written to the sinks (0: none yet).
        self.changefeed_checkpoint = 0
        self._wanted_checkpoint = 0
        self._mounter: Mounter | None = None

    async def _open(self, restart_ts: int) -> None:
        if self._opened:
            return
        await self.source.open()
        if self.source.yields_raw_kv:
            await self.source.prepare_mounter(restart_ts)
            self._mounter = self.source.mounter()
        for sink in self.sinks:
            sink.open(
                SinkContext(
                    self.context.changefeed_id,
                    restart_ts=restart_ts,
                    plugins=self.context.plugins,
                    writer_id=self.writer_id,
                )
            )
        self._opened = True
        self._write_checkpoint()

    async def add_span(self, span: Span, checkpoint_ts: int, *, prepare: bool) -> bool:
        current = self._spans.get(span)
        if current is not None:
            if current.prepared_only and not prepare:
                self._promote(current, checkpoint_ts)
            return True
        self._removed.pop(span, None)
        await self._open(checkpoint_ts)
        run = _SpanRun(checkpoint_ts, checkpoint_ts, prepared_only=prepare)
        self._spans[span] = run
        run.task = asyncio.create_task(self._pump(span, run), name=f"span-{self.context.changefeed_id}-{span}")
        return True

    async def _pump(self, span: Span, run: _SpanRun) -> None:
        try:
            async for event in self.source.feed(span, run.checkpoint_ts):
                if isinstance(event, RowChange):
                    if event.commit_ts > run.checkpoint_ts:
                        run.rows.append(event)
                elif isinstance(event, DDLEvent):
                    if event.commit_ts > run.checkpoint_ts and replicates_ddl(self.table_filter, event):
                        run.ddl.append(event)
                elif isinstance(event, RawKVEvent):
                    if event.commit_ts > run.checkpoint_ts:
                        run.raw.append(event)
                elif isinstance(event, ResolvedEvent) and event.ts > run.resolved_ts:
                    await self._mount(run, event.ts)
                    run.resolved_ts = event.ts
                    self._flush(run)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported through error(), not lost
            self._error = exc

    async def _mount(self, run: _SpanRun, resolved_ts: int) -> None:
        """Mount the span's raw changes up to ``resolved_ts`` (the schemas below it are known
        by then), one at a time on the event loop, as the pipeline's driver-side fallback does."""
        if not run.raw:
            return
        if self._mounter is None:
            raise RuntimeError(f"source {self.source.type_name} yields raw key-value changes but has no mounter")
        ready = [e for e in run.raw if e.commit_ts <= resolved_ts]
        run.raw = [e for e in run.raw if e.commit_ts > resolved_ts]
        for event in ready:
            row = await self._mounter.mount(event)
            if row is not None and self.table_filter.matches(row.table.schema, row.table.table):
                run.rows.append(row)

    def _promote(self, run: _SpanRun, checkpoint_ts: int) -> None:
        """Phase two: write from ``checkpoint_ts`` on; what is at or below it was written elsewhere."""
        run.checkpoint_ts = max(run.checkpoint_ts, checkpoint_ts)
        run.resolved_ts = max(run.resolved_ts, run.checkpoint_ts)
        run.rows = [r for r in run.rows if r.commit_ts > run.checkpoint_ts]
        run.ddl = [d for d in run.ddl if d.commit_ts > run.checkpoint_ts]
        run.raw = [e for e in run.raw if e.commit_ts > run.checkpoint_ts]
        run.prepared_only = False
        self._flush(run)

    def _flush(self, run: _SpanRun) -> None:
        if run.prepared_only:
            return
        end = run.resolved_ts if self.barrier_ts is None else min(run.resolved_ts, self.barrier_ts)
        if end <= run.checkpoint_ts:
            return
        rows = sorted((r for r in run.rows if r.commit_ts <= end), key=RowChange.sort_key)
        ddl = tuple(d for d in run.ddl if d.commit_ts <= end)
        run.rows = [r for r in run.rows if r.commit_ts > end]
        run.ddl = [d for d in run.ddl if d.commit_ts > end]
        batch = MicroBatch(self.context.changefeed_id, next(self._batch_ids), run.checkpoint_ts, end, tuple(rows), ddl)
        for sink in self.sinks:
            sink.write_batch(batch)
        self.context.plugins.batch_flushed(self.context.changefeed_id, batch.batch_id, end, len(rows))
        run.checkpoint_ts = end

    async def remove_span(self, span: Span) -> int | None:
        run = self._spans.pop(span, None)
        if run is None:
            return self._removed.get(span, 0)  # not loaded here: nothing to wait for
        if run.task is not None:
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run.task
        self._removed[span] = run.checkpoint_ts
        return run.checkpoint_ts

    def status(self, span: Span) -> SpanStatus:
        run = self._spans.get(span)
        if run is None:
            return SpanStatus(span, SpanState.ABSENT, 0, 0)
        state = SpanState.PREPARED if run.prepared_only else SpanState.REPLICATING
        return SpanStatus(span, state, run.checkpoint_ts, run.resolved_ts)

    def spans(self) -> list[Span]:
        return list(self._spans)

    async def set_barrier(self, ts: int) -> None:
        self.barrier_ts = ts
        try:
            for run in self._spans.values():
                self._flush(run)  # what waited for the barrier goes now, not at the next resolved ts
        except Exception as exc:  # noqa: BLE001 - reported through error(), as a feed's would be
            self._error = exc

    async def set_changefeed_checkpoint(self, ts: int) -> None:
        self._wanted_checkpoint = max(self._wanted_checkpoint, ts)
        self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        ts = self._wanted_checkpoint
        if ts <= self.changefeed_checkpoint or not self._opened or self._error is not None:
            return  # not open yet: written once the sinks are
        try:
            for sink in self.sinks:
                sink.write_checkpoint(ts)
        except Exception as exc:  # noqa: BLE001 - reported through error(), not lost
            self._error = exc
            return
        self.changefeed_checkpoint = ts

    def error(self) -> BaseException | None:
        return self._error

    async def close(self) -> None:
        for span in list(self._spans):
            await self.remove_span(span)
        if self._opened:
            for sink in self.sinks:
                sink.close()
            await self.source.close()
            self._opened = False


def executor_factory(context: ExecutorContext) -> SpanExecutor:
    """The ``in-process`` executor factory."""
    return InProcessSpanExecutor(context)


@hookimpl
def cdcflow_register_executors(registry: ExecutorRegistrar) -> None:
    registry.add(
        EXECUTOR_NAME,
        executor_factory,
        summary="The test kit's: source feeds straight into the sinks on the event loop, no Spark.",
    )
