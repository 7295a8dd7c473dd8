"""The data plane's :class:`~cdcflow.core.data.span_executor.SpanExecutor`: source feeds into
the event store, the event store into the changefeed's Spark query.

One :class:`PipelineSpanExecutor` per changefeed per capture. The maintainer
(through the scheduler) adds and removes spans; each loaded span has a feed
task on the capture's event loop that puts the source's events into the event
store. A *prepared* span (two-phase scheduling, seed 002) is fed and buffered
but not published, so it catches up without writing downstream; adding it
again with ``prepare=False`` makes it part of the span frontier, and the
Spark query delivers its events from the next micro-batch on.

The changefeed checkpoint the maintainer sends with its heartbeats
(:meth:`PipelineSpanExecutor.set_changefeed_checkpoint`) is handed to the
pipeline, which writes it to the sinks off the event loop, never during a
batch's writes (Kafka resolved events); one that arrives before the pipeline
runs is written once it does, and the last one is written when the executor
closes.

With ``initial-snapshot: true`` the pipeline first copies the replicating
spans whose checkpoint is still the changefeed's start ts T (their rows as of
T, read in Spark tasks and delivered as one batch: :mod:`.snapshot`), then
starts the streaming query from T. Spans that reach this capture later at T
(moved here before their capture delivered its snapshot, or added after the
pipeline started) are not copied here: see docs/how-to/start-from-a-full-copy.md.
On a cluster the maintainer places the snapshot's ranges instead
(:mod:`cdcflow.core.data.snapshot_ranges`) and declares the changefeed here
with ``initial_snapshot`` off: a range added to replicate is read and
delivered in the background through a pipeline built with its sinks open but
its query not started (the query starts on it when the tables' spans come,
after every range of the cluster is delivered).

Files live under ``<data-dir>/changefeeds/<changefeed-id>/``: ``store/`` (the
event store), ``spark-checkpoint/`` (the query's checkpoint, and the pipeline's writer
identity that sinks key their records by: :mod:`.writer`) and
``snapshot/`` (the initial snapshot's plan and parts). All survive a
restart. ``changefeed.json`` says which changefeed of the id they are for (its
creation time): a changefeed created again under a removed one's id discards
the previous one's files before it starts (:func:`claim_changefeed_dir`). The
files of a changefeed that no longer exists are reclaimed by the capture's sweep
(:mod:`cdcflow.core.data.pipeline.files`, :mod:`cdcflow.core.control.reclaim`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential

from cdcflow.core.config.loader import Connector
from cdcflow.core.config.settings import (
    ColumnSelectorSettings,
    ServerSettings,
    SparkSettings,
)
from cdcflow.core.data.events import DDLEvent, RawKVEvent, ResolvedEvent, RowChange, Span
from cdcflow.core.data.filter import TableFilter, replicates_ddl
from cdcflow.core.data.logservice.manifest import read_manifest
from cdcflow.core.data.logservice.store import DEFAULT_CHUNK_ROWS, EventStore
from cdcflow.core.data.pipeline.backoff import FIRST_RETRY_DELAY, MAX_RETRY_DELAY, is_retryable
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.pipeline.delivery import DEFAULT_PART_ROWS
from cdcflow.core.data.pipeline.files import OWNER_FILE, changefeed_dir, claim_changefeed_dir, discard_changefeed_data
from cdcflow.core.data.pipeline.runtime import DEFAULT_COLLECT_ROWS, DEFAULT_TASK_ROWS, ChangefeedPipeline
from cdcflow.core.data.pipeline.snapshot import InitialSnapshot
from cdcflow.core.data.pipeline.writer import writer_identity
from cdcflow.core.data.sink import Sink, SinkContext
from cdcflow.core.data.snapshot_ranges import (
    is_snapshot_range,
    range_batch_id,
    range_done_ts,
    range_keys,
    range_name,
)
from cdcflow.core.data.source import SnapshotPlan, Source
from cdcflow.core.data.span_executor import ExecutorContext, SnapshotReport, SpanExecutor, SpanState, SpanStatus
from cdcflow.core.data.transform import TransformChain
from cdcflow.core.errors import BackPressureError
from cdcflow.core.metrics import CaptureMetrics, ChangefeedMetrics, ExecutorStats
from cdcflow.core.plugin.manager import PluginManager

if TYPE_CHECKING:
    from cdcflow.core.data.pipeline.session import SnapshotHold

__all__ = [
    "OWNER_FILE",
    "PipelineContext",
    "PipelineSpanExecutor",
    "changefeed_dir",
    "claim_changefeed_dir",
    "create_span_executor",
    "discard_changefeed_data",
]

log = logging.getLogger(__name__)

#: Launches of the Spark session before its failure is the executor's error.
_SESSION_ATTEMPTS = 3
_SESSION_RETRY_DELAY = 1.0
#: How often a paused feed checks whether the event store has room again.
_BACKPRESSURE_POLL = 0.05
#: Resolved timestamps are applied to the event store at most this often: every
#: application may cut chunks (files, fsyncs), and the query polls less often anyway.
DEFAULT_PUBLISH_INTERVAL = 0.1
#: Seconds without a span joining before an initial snapshot plans its spans.
_SNAPSHOT_SETTLE = 1.0
#: Snapshot ranges read and delivered at once on one capture (Spark runs their parts as it has cores).
_RANGE_THREADS = 4
#: Seconds between cancellations of a stopped snapshot's Spark jobs while its thread ends.
_CANCEL_POLL = 0.5
#: Seconds between two looks at whether Spark is ready while a snapshot is read ahead.
_READ_AHEAD_POLL = 0.05
#: See :attr:`PipelineContext.stall_timeout`.
DEFAULT_STALL_TIMEOUT = 30.0


@dataclass
class _LoadedSpan:
    span: Span
    state: SpanState
    #: The checkpoint the span was (last) added with.
    checkpoint_ts: int
    feed: asyncio.Task[None] | None = None


@dataclass
class _LoadedRange:
    """A snapshot range placed here (:mod:`cdcflow.core.data.snapshot_ranges`): read and
    delivered by ``task`` once it is to replicate; ``done`` once it is in every sink."""

    span: Span
    state: SpanState
    #: The snapshot ts.
    ts: int
    task: asyncio.Task[None] | None = None
    done: bool = False
    snapshot: InitialSnapshot | None = None

    def stopping(self) -> bool:
        """Whether it is being removed (set by the event loop while its read runs)."""
        return self.state is SpanState.STOPPING


@dataclass(frozen=True, slots=True)
class PipelineContext:
    """Everything one changefeed's :class:`PipelineSpanExecutor` runs with.

    :meth:`for_connector` derives it from a validated connector and the
    capture's server settings (what the ``spark`` executor factory does);
    tests and benchmarks build one around their own source and sinks.
    """

    changefeed_id: str
    #: The changefeed's source and sinks; the executor opens and closes them.
    source: Source[Any]
    sinks: Sequence[Sink[Any]]
    _: KW_ONLY
    #: The capture's data directory: the changefeed's files go below it (:func:`changefeed_dir`).
    data_dir: str | Path
    #: The checkpoint the event store starts from (the changefeed's, when it resumes).
    start_ts: int
    #: Handed to sinks (codecs), the Spark session (``cdcflow_spark_conf``) and the
    #: lifecycle hooks (``cdcflow_batch_flushed``); None: no plugins.
    plugins: PluginManager | None = None
    #: A running SparkSession to use; None: the executor starts the capture's own.
    spark: Any = None
    spark_settings: SparkSettings = field(default_factory=SparkSettings)
    #: Bytes of events the feeds and the event store hold in memory before spilling.
    memory_quota: int = 1024**3
    #: Bytes the event store may spill to disk (0: no limit).
    disk_quota: int = 0
    table_filter: TableFilter = field(default_factory=lambda: TableFilter(["*.*"]))
    column_selectors: Sequence[ColumnSelectorSettings] = ()
    #: The connector's transforms (None: none).
    transforms: TransformChain | None = None
    #: Seconds between micro-batches; None: ``spark_settings.trigger_interval``.
    trigger_interval: float | None = None
    #: Rows per part of a batch for sinks that take parts.
    part_rows: int = DEFAULT_PART_ROWS
    #: Batches above this many rows reach the driver through Spark-written sorted files.
    collect_rows: int = DEFAULT_COLLECT_ROWS
    #: A batch gets one more task partition per this many rows, up to Spark's parallelism.
    task_rows: int = DEFAULT_TASK_ROWS
    #: Rows per event-store chunk.
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    #: Seconds between applications of the feeds' resolved ts to the event store.
    publish_interval: float = DEFAULT_PUBLISH_INTERVAL
    #: Seconds a replicating span's feed may stay paused on a full event store while
    #: nothing is published or checkpointed before the executor reports a stall (2002).
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    #: Called with each checkpoint the pipeline reaches (after every sink flushed).
    on_checkpoint: Callable[[int], None] | None = None
    #: What the pipeline records its micro-batches into (the capture's metrics); None: nothing.
    metrics: ChangefeedMetrics | None = None
    #: The changefeed's start ts when it takes an initial snapshot (``initial-snapshot``); 0: none.
    snapshot_ts: int = 0
    #: Which changefeed of this id the files are for (its creation time): a changefeed
    #: removed and created again under the same id finds the previous one's files and
    #: discards them (:func:`claim_changefeed_dir`). None: whatever the directory holds.
    created_at: float | None = None

    @classmethod
    def for_connector(
        cls,
        connector: Connector,
        server: ServerSettings,
        *,
        start_ts: int,
        plugins: PluginManager | None = None,
        spark: Any = None,
        on_checkpoint: Callable[[int], None] | None = None,
        metrics: CaptureMetrics | None = None,
        changefeed_start_ts: int = 0,
        created_at: float | None = None,
    ) -> PipelineContext:
        """The context of ``connector`` on this capture, resuming from ``start_ts``.
        Instantiates the connector's source and sinks. ``changefeed_start_ts``: the
        changefeed's own start ts, the ts of its initial snapshot when it takes one."""
        settings = connector.settings
        return cls(
            connector.name,
            cast("Source[Any]", connector.source.instantiate()),
            [cast("Sink[Any]", choice.instantiate()) for choice in connector.sinks],
            data_dir=server.data_dir,
            start_ts=start_ts,
            plugins=plugins,
            spark=spark,
            spark_settings=server.spark,
            memory_quota=settings.memory_quota,
            disk_quota=settings.spill_disk_quota,
            table_filter=settings.filter.table_filter(),
            column_selectors=settings.filter.column_selectors,
            transforms=connector.transform_chain(),
            on_checkpoint=on_checkpoint,
            metrics=metrics.changefeed(connector.name) if metrics is not None else None,
            snapshot_ts=changefeed_start_ts if settings.initial_snapshot else 0,
            created_at=created_at,
        )


#: What the snapshot phase runs with: its files, the plan and the spans it reads (by id).
_SnapshotWork = tuple[InitialSnapshot, SnapshotPlan, dict[int, Span]]


class PipelineSpanExecutor(SpanExecutor):
    """Runs one changefeed's spans on this capture (see the module docs)."""

    def __init__(self, context: PipelineContext) -> None:
        self.context = context
        self.changefeed_id = changefeed_id = context.changefeed_id
        self.source = source = context.source
        self.sinks = list(context.sinks)
        self.plugins = context.plugins
        self.spark_settings = context.spark_settings
        self._spark = context.spark
        self._on_checkpoint = context.on_checkpoint
        self.metrics = context.metrics
        self.directory = changefeed_dir(context.data_dir, changefeed_id)
        if context.created_at is not None:
            claim_changefeed_dir(self.directory, changefeed_id, context.created_at)
        store_dir = self.directory / "store"
        if read_manifest(store_dir) is None:
            # A Spark checkpoint without its event store would point at chunks that are gone.
            shutil.rmtree(self.directory / "spark-checkpoint", ignore_errors=True)
        # The feeds' share of the quota (what they hold before the event store), the store the rest.
        feed_memory = source.limit_memory(context.memory_quota, self.directory / "feed-spill")
        self.store = EventStore(
            store_dir,
            changefeed_id,
            start_ts=context.start_ts,
            memory_quota=context.memory_quota - feed_memory,
            disk_quota=context.disk_quota,
            chunk_rows=context.chunk_rows,
            cut_rows=self.spark_settings.max_batch_rows,
            auto_spill=False,  # spilled from a thread, off the event loop (see _make_room)
        )
        self.table_filter = context.table_filter
        self.column_selection = ColumnSelection(context.column_selectors)
        self.trigger_interval = (
            context.trigger_interval if context.trigger_interval is not None else self.spark_settings.trigger_interval
        )
        self.part_rows = context.part_rows
        self.collect_rows = context.collect_rows
        self.task_rows = context.task_rows
        self.pipeline: ChangefeedPipeline | None = None
        #: Whether a feed is paused because the event store is full (backpressure).
        self.paused = False
        self.feed_errors: dict[Span, BaseException] = {}
        self._spans: dict[Span, _LoadedSpan] = {}
        self._removed: dict[Span, int] = {}
        self._source_open = False
        self._pipeline_lock = asyncio.Lock()
        #: The pipeline's start, in the background (Spark takes seconds to tens of seconds).
        self._starting: asyncio.Task[None] | None = None
        self._start_error: BaseException | None = None
        self._closing = asyncio.Event()
        self.publish_interval = context.publish_interval
        self.stall_timeout = context.stall_timeout
        self._pending_resolved: dict[Span, int] = {}
        #: The newest resolved ts each feed delivered (what ``stats`` reports of the source).
        self._feed_resolved: dict[Span, int] = {}
        self._publisher: asyncio.Task[None] | None = None
        # Store work that writes files (cuts, spills) runs in a thread while this
        # lock is held; feeds take it to put events, so the event loop never
        # waits on the store's own lock behind disk I/O.
        self._store_io = asyncio.Lock()
        #: The newest changefeed checkpoint from the maintainer (0: none yet).
        self.changefeed_checkpoint = 0
        self.snapshot_ts = context.snapshot_ts
        #: The initial snapshot of this run (None: none taken here).
        self.snapshot: InitialSnapshot | None = None
        #: Held while this run's initial snapshot may be taken (see _ensure_pipeline).
        self._snapshot_hold: SnapshotHold | None = None
        #: Snapshot ranges placed here (a changefeed's snapshot shared by a cluster).
        self._ranges: dict[Span, _LoadedRange] = {}
        self._range_error: BaseException | None = None
        #: A pipeline built (sinks open) to deliver snapshot ranges, its query not started yet.
        self._built: ChangefeedPipeline | None = None
        self._build_lock = threading.Lock()
        #: Threads of their own for the ranges' reads and deliveries, which wait on Spark for
        #: as long as a range takes: in the event loop's default pool they would starve the
        #: capture's other work there (its metastore session's keepalive among it).
        self._range_threads: ThreadPoolExecutor | None = None

    # -- SpanExecutor ----------------------------------------------------------------

    async def add_span(self, span: Span, checkpoint_ts: int, *, prepare: bool) -> bool:
        if is_snapshot_range(span):
            return await self._add_range(span, checkpoint_ts, prepare=prepare)
        loaded = self._spans.get(span)
        if loaded is not None and loaded.state is SpanState.STOPPING:
            return False
        if loaded is None:
            await self._open_source(checkpoint_ts)
            self._removed.pop(span, None)
            state = SpanState.PREPARING if prepare else SpanState.REPLICATING
            loaded = _LoadedSpan(span, state, checkpoint_ts)
            async with self._store_io:
                feed_from = self.store.add_span(span, checkpoint_ts, replicating=not prepare)
            loaded.feed = asyncio.create_task(self._feed(span, feed_from), name=f"feed {span}")
            self._spans[span] = loaded
            if self._publisher is None:
                self._publisher = asyncio.create_task(self._publish_resolved(), name=f"publish {self.changefeed_id}")
        elif not prepare and loaded.state is not SpanState.REPLICATING:
            async with self._store_io:
                self.store.add_span(span, checkpoint_ts, replicating=True)
            loaded.checkpoint_ts = max(loaded.checkpoint_ts, checkpoint_ts)
            loaded.state = SpanState.REPLICATING
        if not prepare:
            self._start_pipeline_soon()
            return True
        return self._refresh_prepared(loaded) is SpanState.PREPARED

    async def remove_span(self, span: Span) -> int | None:
        if is_snapshot_range(span):
            return await self._remove_range(span)
        loaded = self._spans.pop(span, None)
        if loaded is None:
            return self._removed.get(span)
        final = self.status_of(loaded).checkpoint_ts
        if loaded.feed is not None:
            loaded.feed.cancel()
            await asyncio.gather(loaded.feed, return_exceptions=True)
        self._pending_resolved.pop(span, None)
        self._feed_resolved.pop(span, None)
        async with self._store_io:
            await asyncio.to_thread(self.store.remove_span, span)
        self._removed[span] = final
        return final

    def status(self, span: Span) -> SpanStatus:
        read = self._ranges.get(span)
        if read is not None:
            resolved = range_done_ts(read.ts) if read.done else read.ts
            return SpanStatus(span, read.state, read.ts, resolved)
        loaded = self._spans.get(span)
        if loaded is None:
            final = self._removed.get(span)
            if final is not None:
                return SpanStatus(span, SpanState.STOPPED, final, final)
            return SpanStatus(span, SpanState.ABSENT, 0, 0)
        return self.status_of(loaded)

    def status_of(self, loaded: _LoadedSpan) -> SpanStatus:
        checkpoint = loaded.checkpoint_ts
        if loaded.state is SpanState.REPLICATING:
            # The pipeline's checkpoint covers the span once the batches carrying its
            # events up to the published ts it joined behind are flushed.
            if self.store.covers(loaded.span):
                checkpoint = max(checkpoint, self.store.checkpoint_ts)
            else:
                # Joined behind: its catch-up moves it batch by batch.
                checkpoint = max(checkpoint, self.store.caught_up_ts(loaded.span))
        else:
            self._refresh_prepared(loaded)
        resolved = max(checkpoint, self.store.resolved_ts(loaded.span))
        return SpanStatus(loaded.span, loaded.state, checkpoint, resolved)

    def spans(self) -> list[Span]:
        return [*self._spans, *self._ranges]

    def snapshot_reports(self) -> list[SnapshotReport]:
        """The snapshot of this capture's own spans once its read started, and every
        snapshot range placed here whose read started (a range delivered before this
        executor started reports done, with the rows its ``done`` file names)."""
        reports = []
        own = self.snapshot.progress if self.snapshot is not None else None
        if own is not None:
            reports.append(own.report())
        for read in list(self._ranges.values()):
            snapshot = read.snapshot
            if snapshot is None:
                continue
            if snapshot.progress is not None:
                reports.append(snapshot.progress.report(read.span))
            elif read.done:
                rows = snapshot.delivered_rows()
                reports.append(SnapshotReport(read.span, "part", "done", 1, 1, rows, rows, time.time()))
        return reports

    def stats(self) -> ExecutorStats:
        store = self.store.stats()
        states: dict[str, int] = {}
        for loaded in self._spans.values():
            states[loaded.state.value] = states.get(loaded.state.value, 0) + 1
        return ExecutorStats(
            source=str(getattr(self.source, "type_name", type(self.source).__name__)),
            checkpoint_ts=self.store.checkpoint_ts,
            resolved_ts=store.published_ts,
            spans_by_state=states,
            rows_read=store.events_in,
            bytes_read=store.bytes_in,
            memory_bytes=store.memory_bytes,
            memory_quota_bytes=self.store.memory_quota,
            spilled_bytes=store.spill_bytes,
            chunk_bytes=store.chunk_bytes,
            chunks_pending=store.chunks,
            dropped_duplicates=store.dropped_duplicates,
            feed=self.source.feed_stats() if self._source_open else None,
            source_resolved_ts=min(
                (self._feed_resolved.get(s.span, 0) for s in self._spans.values() if s.state is SpanState.REPLICATING),
                default=0,
            ),
            batch_end_ts=self.pipeline.batch_end_ts if self.pipeline is not None else 0,
        )

    async def set_barrier(self, ts: int) -> None:
        async with self._store_io:
            await asyncio.to_thread(self.store.set_barrier, ts)

    async def set_changefeed_checkpoint(self, ts: int) -> None:
        if ts <= self.changefeed_checkpoint:
            return
        self.changefeed_checkpoint = ts
        if self.pipeline is not None:
            self.pipeline.emit_checkpoint(ts)  # written from the pipeline's own thread

    async def close(self) -> None:
        self._closing.set()  # a start being retried gives up
        for span in list(self._ranges):
            await self._remove_range(span, closing=True)
        if self._starting is not None:
            # A start in progress cannot be interrupted (it runs in a thread): its snapshot's
            # Spark jobs are cancelled (the parts read so far stay), then it is let end.
            while not self._starting.done():
                if self.snapshot is not None:
                    self.snapshot.cancel(self._spark)
                await asyncio.wait([self._starting], timeout=_CANCEL_POLL)
            await asyncio.gather(self._starting, return_exceptions=True)
            self._starting = None
        pipeline, self.pipeline = self.pipeline, None
        if pipeline is not None:
            await asyncio.to_thread(pipeline.stop)
        built, self._built = self._built, None
        if pipeline is None and built is not None:
            pipeline = built  # delivered snapshot ranges only: its sinks are closed below
        if self._range_threads is not None:
            self._range_threads.shutdown(wait=False, cancel_futures=True)
            self._range_threads = None
        tasks = [s.feed for s in self._spans.values() if s.feed is not None]
        if self._publisher is not None:
            tasks.append(self._publisher)
            self._publisher = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._spans.clear()
        self.store.close()
        if pipeline is not None:
            for sink in self.sinks:
                sink.close()
        if self._source_open:
            await self.source.close()
            self._source_open = False

    # -- progress and health -----------------------------------------------------------

    @property
    def checkpoint_ts(self) -> int:
        """Everything at or below this ts is flushed by every sink (for the spans published so far)."""
        return self.store.checkpoint_ts

    def error(self) -> BaseException | None:
        """Why replication is stuck: the query's failure, a feed's error, or the sink
        error being retried (a CdcflowError whose ``retryable`` says so); None when healthy."""
        if self.pipeline is not None:
            failure = self.pipeline.failure()
            if failure is not None:
                return failure
            if self.pipeline.last_error is not None:
                return self.pipeline.last_error
        if self._start_error is not None:
            return self._start_error
        if self._range_error is not None:
            return self._range_error
        return next(iter(self.feed_errors.values()), None)

    # -- internals ---------------------------------------------------------------------

    def _refresh_prepared(self, loaded: _LoadedSpan) -> SpanState:
        # Prepared = caught up: the feed has resolved past the span's checkpoint.
        if loaded.state is SpanState.PREPARING and self.store.resolved_ts(loaded.span) > loaded.checkpoint_ts:
            loaded.state = SpanState.PREPARED
        return loaded.state

    async def _open_source(self, checkpoint_ts: int) -> None:
        if not self._source_open:
            await self.source.open()
            # After a restart the pipeline mounts the stored events again from the released
            # ts on, though the feeds resume from the published ts: the mounter must decode
            # them with the schema of their own commit ts (a fresh store has nothing below
            # the span's checkpoint).
            released = self.store.released_ts
            try:
                await self.source.prepare_mounter(min(checkpoint_ts, released) if released else checkpoint_ts)
            except BaseException:
                await self.source.close()
                raise
            self._source_open = True

    def _start_pipeline_soon(self) -> None:
        """Start the pipeline in the background, once.

        The span is replicating as soon as it is in the store's frontier; its
        checkpoint moves only when a batch that covers it is flushed. Not
        waiting for Spark here keeps the agent answering heartbeats (resolved
        ts, other spans joining) while the session starts: spans that join
        before the first batch are covered by it."""
        if self._starting is None and self.pipeline is None:
            self._starting = asyncio.create_task(self._ensure_pipeline(), name=f"start {self.changefeed_id}")

    async def _ensure_pipeline(self) -> None:
        """Start the pipeline; a retryable error (a sink that cannot reach its downstream:
        2001) is retried with exponential backoff until it succeeds or the executor closes.
        Meanwhile it is the executor's error (the changefeed shows Warning)."""
        async with self._pipeline_lock:
            loop = asyncio.get_running_loop()
            retrying = AsyncRetrying(
                retry=retry_if_exception(lambda exc: is_retryable(exc) and not self._closing.is_set()),
                wait=wait_exponential(multiplier=FIRST_RETRY_DELAY, max=MAX_RETRY_DELAY),
                sleep=self._pause,
                before_sleep=self._start_failed,
                reraise=True,
            )
            # From before the snapshot is planned until it is delivered (_start_pipeline
            # releases it then) or the start ends: the capture's start warms Spark's read
            # planner only after it.
            self._snapshot_hold = self._hold_for_snapshot()
            try:
                async for attempt in retrying:
                    with attempt:
                        if self.pipeline is not None or self._closing.is_set():
                            return
                        snapshot = await self._snapshot_work()
                        self.pipeline = await asyncio.to_thread(self._try_start, loop, snapshot)
                        self._start_error = None
            except Exception as exc:
                if not self._closing.is_set():
                    log.exception("changefeed %s: the Spark pipeline did not start", self.changefeed_id)
                self._start_error = exc
                return
            finally:
                self._release_snapshot_hold()
            pipeline = self.pipeline
            if pipeline is not None and self.changefeed_checkpoint:
                pipeline.emit_checkpoint(self.changefeed_checkpoint)  # arrived while Spark started

    def _snapshot_pending(self) -> bool:
        """Whether this run may still take its initial snapshot: the changefeed asks for
        one and the store's checkpoint has not passed its ts."""
        return bool(self.snapshot_ts) and self.store.checkpoint_ts <= self.snapshot_ts

    def _hold_for_snapshot(self) -> SnapshotHold | None:
        """A :class:`~cdcflow.core.data.pipeline.session.SnapshotHold` while this run may
        still take its initial snapshot, else None."""
        from cdcflow.core.data.pipeline.session import SnapshotHold

        return SnapshotHold() if self._snapshot_pending() else None

    def _release_snapshot_hold(self) -> None:
        hold, self._snapshot_hold = self._snapshot_hold, None
        if hold is not None:
            hold.release()

    def _start_failed(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        self._start_error = exc
        if self.metrics is not None and exc is not None:
            self.metrics.error(exc, retried=True)
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "changefeed %s: the pipeline did not start (%s); retry %d in %.1fs",
            *(self.changefeed_id, exc, state.attempt_number, delay),
        )

    async def _pause(self, seconds: float) -> None:
        """Tenacity's sleep between start attempts, cut short when the executor closes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    async def _snapshot_work(self) -> _SnapshotWork | None:
        """The initial snapshot to take before streaming, or None.

        Taken while the changefeed asks for one, this capture's pipeline has not
        passed its ts T and it is not marked done: of the plan kept from an earlier
        run, or else of the replicating spans whose checkpoint is T (the source
        plans it here, on the event loop)."""
        if not self._snapshot_pending():
            return None
        ts = self.snapshot_ts
        snapshot = InitialSnapshot(self.directory, self.changefeed_id, ts, self.plugins)
        self.snapshot = snapshot
        if snapshot.done:
            return None
        kept = snapshot.plan()
        if kept is not None:
            return snapshot, *kept
        trigger = self.source.trigger_span()
        await self._spans_settled(trigger)
        wanted = {
            loaded.span
            for loaded in self._spans.values()
            if loaded.state is SpanState.REPLICATING and loaded.checkpoint_ts == ts and loaded.span != trigger
        }
        spans = {i: span for i, span in self.store.spans_by_id().items() if span in wanted}
        if not spans:
            return None
        plan = await self.source.snapshot_plan(spans, ts)
        await asyncio.to_thread(snapshot.keep_plan, plan, spans)
        return snapshot, plan, spans

    async def _spans_settled(self, trigger: Span | None) -> None:
        """Wait until every span loaded here replicates and none was added for a moment:
        the maintainer places a changefeed's spans at once, and the two-phase scheduler
        has each catch up (prepare) first, so the first replicating span starts the
        pipeline before the others joined."""
        quiet_since, seen = time.monotonic(), set(self._spans)
        while not self._closing.is_set():
            current = set(self._spans)
            if current != seen:
                quiet_since, seen = time.monotonic(), current
            waiting = [s for s, x in self._spans.items() if s != trigger and x.state is not SpanState.REPLICATING]
            if not waiting and time.monotonic() - quiet_since >= _SNAPSHOT_SETTLE:
                return
            await asyncio.sleep(0.1)

    def _try_start(self, loop: asyncio.AbstractEventLoop, snapshot: _SnapshotWork | None) -> ChangefeedPipeline:
        try:
            return self._start_pipeline(loop, snapshot)
        except BaseException:
            # What a failed start holds (a half-opened sink's connections) is released.
            for sink in self.sinks:
                try:
                    sink.close()
                except Exception:
                    log.exception("changefeed %s: closing sink %s failed", self.changefeed_id, type(sink).__name__)
            raise

    def _start_pipeline(self, loop: asyncio.AbstractEventLoop, snapshot: _SnapshotWork | None) -> ChangefeedPipeline:
        if snapshot is None:
            pipeline = self._build_pipeline(loop)
            self._built = None
        else:
            files, plan, spans = snapshot
            with files.exclusive():
                pipeline = self._build_reading_ahead(loop, files, plan)
                self._built = None
                self._take_snapshot(pipeline, files, plan, spans)
            self._release_snapshot_hold()  # delivered: the stream's planner may start
        pipeline.start()
        return pipeline

    def _build_reading_ahead(
        self, loop: asyncio.AbstractEventLoop, snapshot: InitialSnapshot, plan: SnapshotPlan
    ) -> ChangefeedPipeline:
        """Build the pipeline (Spark's session start, the sinks opened) while this capture
        reads the snapshot's parts itself, as many at once as Spark runs tasks here
        (:class:`~cdcflow.core.data.pipeline.snapshot.ReadAhead`),
        and keep reading until Spark runs tasks without waiting for its Python workers
        (or every part is read). The caller holds the snapshot's files."""
        from cdcflow.core.data.pipeline.session import local_task_slots, spark_ready

        reading_ahead = self.spark_settings.snapshot_read_ahead and not snapshot.done
        ahead = None
        if reading_ahead and not spark_ready(self._spark):
            # As many parts at once as Spark's read would run tasks (on this machine's cores).
            ahead = snapshot.read_ahead(plan, readers=local_task_slots(self.spark_settings.master))
        try:
            pipeline = self._build_pipeline(loop)
            while ahead is not None and not ahead.finished and not self._closing.is_set():
                if spark_ready(self._spark):
                    break
                time.sleep(_READ_AHEAD_POLL)
        finally:
            if ahead is not None:
                ahead.stop()
        return pipeline

    def _build_pipeline(self, loop: asyncio.AbstractEventLoop) -> ChangefeedPipeline:
        """The changefeed's pipeline with its sinks open, its query not started: the one
        built to deliver snapshot ranges, or a new one."""
        with self._build_lock:
            if self._built is not None:
                return self._built
            self._built = self._new_pipeline(loop)
            return self._built

    def _new_pipeline(self, loop: asyncio.AbstractEventLoop) -> ChangefeedPipeline:
        if self._spark is None:
            self._spark = self._start_session()
        checkpoint_dir = self.directory / "spark-checkpoint"
        # Batch ids are the query's, scoped to its checkpoint directory: so is the writer.
        writer = writer_identity(checkpoint_dir)
        context = SinkContext(
            self.changefeed_id,
            restart_ts=self.store.checkpoint_ts,
            plugins=self.plugins,
            spark=self._spark,
            writer_id=writer.id,
            writer_inherits=writer.inherits,
        )
        for sink in self.sinks:
            sink.open(context)
        pipeline = ChangefeedPipeline(
            changefeed_id=self.changefeed_id,
            store=self.store,
            sinks=self.sinks,
            spark=self._spark,
            checkpoint_dir=checkpoint_dir,
            table_filter=self.table_filter,
            column_selection=self.column_selection,
            transforms=self.context.transforms,
            plugins=self.plugins,
            mounter=self.source.mounter(),
            loop=loop,
            trigger_interval=self.trigger_interval,
            part_rows=self.part_rows,
            collect_rows=self.collect_rows,
            task_rows=self.task_rows,
            max_batch_rows=self.spark_settings.max_batch_rows,
            on_checkpoint=self._on_checkpoint,
            metrics=self.metrics,
        )
        return pipeline

    def _take_snapshot(
        self, pipeline: ChangefeedPipeline, snapshot: InitialSnapshot, plan: SnapshotPlan, spans: dict[int, Span]
    ) -> None:
        """Read the parts not read yet, deliver the whole snapshot as one batch, mark it done
        (every Spark job of it in the snapshot's job group, which :meth:`close` cancels).
        The caller holds the snapshot's files (:meth:`InitialSnapshot.exclusive`)."""
        with snapshot.jobs(self._spark):
            if snapshot.done:
                return
            rows = snapshot.read(self._spark, plan)
            frame, files = snapshot.frame(self._spark), snapshot.part_files()
            written = pipeline.deliver_snapshot(frame, snapshot.ts, rows, spans, files=files)
            snapshot.delivered(written)

    # -- snapshot ranges ----------------------------------------------------------------

    async def _add_range(self, span: Span, ts: int, *, prepare: bool) -> bool:
        """A snapshot range: prepared at once (there is nothing to catch up); told to
        replicate, it is read and delivered in the background."""
        read = self._ranges.get(span)
        if read is not None and read.state is SpanState.STOPPING:
            return False
        if read is None:
            await self._open_source(ts)
            self._removed.pop(span, None)
            read = _LoadedRange(span, SpanState.PREPARED, ts)
            self._ranges[span] = read
        if not prepare and read.task is None:
            read.state = SpanState.REPLICATING
            read.task = asyncio.create_task(self._read_range(read), name=f"snapshot {span}")
        return True

    async def _remove_range(self, span: Span, *, closing: bool = False) -> int | None:
        """Stop reading the range: its Spark job is cancelled (the parts read so far stay
        read). Stopped once its read or delivery in progress ended (None until then), so
        that no delivery of it can follow its removal; when the executor closes, at once."""
        read = self._ranges.get(span)
        if read is None:
            return self._removed.get(span)
        read.state = SpanState.STOPPING
        if read.task is not None and not read.task.done():
            if read.snapshot is not None:
                # Again on every call: a job the range's thread started since is cancelled too.
                read.snapshot.cancel(self._spark)
            if not closing:
                return None
            # The task ends once the range's thread did (see _read_range), never before.
            read.task.cancel()
            await asyncio.gather(read.task, return_exceptions=True)
        del self._ranges[span]
        self._removed[span] = read.ts
        return read.ts

    async def _read_range(self, read: _LoadedRange) -> None:
        """Plan the range (kept, so a restart reads the same parts), read the parts not
        read yet, deliver them as one batch of the range's own id; retried with backoff
        while the error is retryable."""
        keys = range_keys(read.span)
        snapshot = InitialSnapshot(self.directory, self.changefeed_id, read.ts, range_name=range_name(read.span))
        read.snapshot = snapshot
        loop = asyncio.get_running_loop()
        delay = FIRST_RETRY_DELAY
        while not self._closing.is_set() and not read.stopping():
            try:
                if not snapshot.done:
                    kept = snapshot.plan()
                    if kept is None:
                        spans = {0: keys}
                        plan = await self.source.snapshot_plan(spans, read.ts)
                        await asyncio.to_thread(snapshot.keep_plan, plan, spans)
                    else:
                        plan, spans = kept
                    if self._range_threads is None:
                        self._range_threads = ThreadPoolExecutor(_RANGE_THREADS, thread_name_prefix="snapshot-range")
                    work = loop.run_in_executor(self._range_threads, self._deliver_range, loop, read, plan, spans)
                    try:
                        await asyncio.shield(work)
                    except asyncio.CancelledError:
                        await self._stop_snapshot_jobs(snapshot, work)
                        raise
                if read.stopping():
                    return
                read.done = True
                self._range_error = None
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closing.is_set() or read.stopping():
                    return
                self._range_error = exc
                if not is_retryable(exc):
                    log.exception("changefeed %s: snapshot range %s failed", self.changefeed_id, keys)
                    return
                log.warning(
                    "changefeed %s: snapshot range %s: %s; retry in %.1fs", self.changefeed_id, keys, exc, delay
                )
                await self._pause(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)

    async def _stop_snapshot_jobs(self, snapshot: InitialSnapshot, work: asyncio.Future[None]) -> None:
        """Cancel the Spark jobs of ``snapshot`` until ``work`` — the thread reading and
        delivering it — ended. Cancelling the asyncio task that awaits the thread does not
        stop the thread, nor the Spark job it waits on in the JVM: left running, that job
        would read the snapshot's part files while a later read or delivery of the range
        deletes them (``FAILED_READ_FILE.FILE_NOT_EXIST``), and its delivery would write to
        sinks being closed. The cancelled job fails its thread at once."""
        while not work.done():
            snapshot.cancel(self._spark)  # again each time: a job started since is cancelled too
            await asyncio.wait([work], timeout=_CANCEL_POLL)
        if not work.cancelled() and work.exception() is not None:
            log.info(
                "changefeed %s: snapshot at %d%s stopped; its Spark jobs were cancelled (parts read so far stay read)",
                *(self.changefeed_id, snapshot.ts, f", range {snapshot.range_name}" if snapshot.range_name else ""),
            )

    def _deliver_range(
        self, loop: asyncio.AbstractEventLoop, read: _LoadedRange, plan: SnapshotPlan, spans: dict[int, Span]
    ) -> None:
        snapshot = read.snapshot
        assert snapshot is not None
        # The range's files held: an earlier read of it in this process that is still ending
        # goes first. Every Spark job of the range in its job group (cancelled when the range
        # is removed).
        from cdcflow.core.data.pipeline.session import SnapshotHold

        with snapshot.exclusive(), SnapshotHold():
            if read.stopping():
                return
            pipeline = self.pipeline or self._build_reading_ahead(loop, snapshot, plan)
            self._deliver_range_read(pipeline, read, snapshot, plan, spans)

    def _deliver_range_read(
        self,
        pipeline: ChangefeedPipeline,
        read: _LoadedRange,
        snapshot: InitialSnapshot,
        plan: SnapshotPlan,
        spans: dict[int, Span],
    ) -> None:
        """Read the range's parts not read yet and deliver them as one batch of the range's
        own id, unless the range is being removed. The caller holds the range's files."""
        with snapshot.jobs(self._spark):
            if read.stopping() or snapshot.done:
                return
            rows = snapshot.read(self._spark, plan)
            if read.stopping():
                return  # removed while it was read: its new capture delivers it
            frame, files = snapshot.frame(self._spark), snapshot.part_files()
            written = pipeline.deliver_snapshot(frame, snapshot.ts, rows, spans, range_batch_id(read.span), files=files)
            snapshot.delivered(written)

    def _start_session(self) -> Any:
        """The capture's SparkSession, retried: launching Spark's JVM while other
        threads of the capture work (gRPC, store I/O) now and then fails at once
        with JAVA_GATEWAY_EXITED, and a second launch succeeds."""
        from cdcflow.core.data.pipeline.session import spark_session

        for attempt in range(1, _SESSION_ATTEMPTS + 1):
            try:
                return spark_session(self.spark_settings, self.plugins)
            except Exception as exc:
                if attempt == _SESSION_ATTEMPTS:
                    raise
                log.warning("changefeed %s: Spark did not start (%s); retrying", self.changefeed_id, exc)
                time.sleep(_SESSION_RETRY_DELAY)
        raise AssertionError("unreachable")

    async def _feed(self, span: Span, start_ts: int) -> None:
        store = self.store
        try:
            async for event in self.source.feed(span, start_ts):
                if isinstance(event, ResolvedEvent):
                    if event.span == span:
                        # Applied by _publish_resolved: many resolved ts coalesce into one cut.
                        self._pending_resolved[span] = event.ts
                        self._feed_resolved[span] = event.ts
                elif isinstance(event, DDLEvent):
                    if replicates_ddl(self.table_filter, event):
                        store.put_ddl(event)
                elif isinstance(event, RawKVEvent | RowChange):
                    if store.memory_full:
                        await self._make_room(span)
                    async with self._store_io:
                        store.put(span, event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("changefeed %s: the feed of %s failed", self.changefeed_id, span)
            self.feed_errors[span] = exc
            if self.metrics is not None:
                self.metrics.error(exc, retried=False)

    async def _publish_resolved(self) -> None:
        """Apply the feeds' latest resolved ts to the event store, every ``publish_interval``.

        Events are put as they arrive, so a resolved ts applied later still
        follows every event it covers."""
        while True:
            await asyncio.sleep(self.publish_interval)
            pending, self._pending_resolved = self._pending_resolved, {}
            pending = {span: ts for span, ts in pending.items() if span in self._spans}
            if pending:
                async with self._store_io:
                    await asyncio.to_thread(self._apply_resolved, pending)

    def _apply_resolved(self, pending: dict[Span, int]) -> None:
        for span, ts in pending.items():
            self.store.resolve(span, ts)

    async def _make_room(self, span: Span) -> None:
        """Spill (in a thread); when the disk quota forbids it, pause this feed
        (backpressure) until publishing or a checkpoint frees room.

        A full store frees room only when a cut publishes or a checkpoint releases
        chunks. When neither happens for ``stall_timeout`` seconds while the span
        replicates, the quotas cannot hold what the feeds must buffer before the
        next cut (paused feeds cannot deliver the resolved ts that would allow
        it): the feed's error becomes a BackPressureError (2002), so that the
        changefeed says so in its state instead of stalling silently. It is
        withdrawn if progress resumes."""
        progress: tuple[int, int] | None = None
        since = time.monotonic()
        try:
            while True:
                async with self._store_io:
                    if await asyncio.to_thread(self.store.spill):
                        return
                self.paused = True
                now = time.monotonic()
                current = (self.store.published_ts, self.store.checkpoint_ts)
                if current != progress:
                    progress, since = current, now
                    if isinstance(self.feed_errors.get(span), _StoreStalledError):
                        del self.feed_errors[span]
                elif now - since >= self.stall_timeout and span not in self.feed_errors and self._replicating(span):
                    error = self._stalled(now - since)
                    log.error("%s", error)
                    self.feed_errors[span] = error
                await asyncio.sleep(_BACKPRESSURE_POLL)
        finally:
            self.paused = False

    def _replicating(self, span: Span) -> bool:
        loaded = self._spans.get(span)
        return loaded is not None and loaded.state is SpanState.REPLICATING

    def _stalled(self, seconds: float) -> _StoreStalledError:
        stats = self.store.stats()
        memory, disk = self.store.memory_quota, self.store.disk_quota
        return _StoreStalledError(
            f"changefeed {self.changefeed_id}: no progress for {seconds:.0f}s: the event store's memory "
            f"quota ({memory} bytes for the store) is full and spill-disk-quota ({disk} bytes) leaves no "
            "room to spill, so the feeds are paused and nothing can be published. Raise memory-quota or "
            "spill-disk-quota (0: no disk limit), then resume the changefeed",
            detail={
                "changefeed_id": self.changefeed_id,
                "memory_quota": memory,
                "spill_disk_quota": disk,
                "memory_bytes": stats.memory_bytes,
                "disk_bytes": stats.disk_bytes,
                "published_ts": stats.published_ts,
            },
        )


class _StoreStalledError(BackPressureError):
    """The event store is full, cannot spill, and nothing was published for the stall timeout."""


def create_span_executor(context: ExecutorContext) -> PipelineSpanExecutor:
    """The ``spark`` executor factory: the pipeline executor of the context's
    connector on this capture, resuming from ``context.start_ts``.

    Its files go below the capture's data directory (``context.data_dir``);
    the Spark settings come from ``context.server`` (defaults without). The
    event store and the Spark checkpoint are kept per changefeed id, not per
    epoch, so a restarted incarnation resumes from them.
    """
    server = (context.server or ServerSettings()).model_copy(update={"data_dir": str(context.data_dir)})
    return PipelineSpanExecutor(
        PipelineContext.for_connector(
            context.connector,
            server,
            start_ts=context.start_ts,
            plugins=context.plugins,
            metrics=context.metrics,
            changefeed_start_ts=context.info.start_ts,
            created_at=context.info.created_at,
        )
    )
