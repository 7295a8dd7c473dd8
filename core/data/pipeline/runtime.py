"""One changefeed's Spark Structured Streaming query (ARCHITECTURE.md, "Data pipeline on Spark").

The query reads the changefeed's event store through the ``cdcflow`` data
source, keeps the replicated tables (a Spark predicate), and hands every
micro-batch to ``foreachBatch``. There, on the capture's driver, the batch is
planned — its ts range, its DDL, a picklable batch mounter with the schemas
valid in the range (:meth:`~cdcflow.core.data.source.Mounter.for_batch`) —
and the per-row work is left to Spark tasks (:mod:`.tasks`):

* sinks with a :meth:`~cdcflow.core.data.sink.Sink.task_writer` are written
  by Spark tasks: the batch is repartitioned by ``(table_id, key)`` (every
  change of a key in one partition), sorted within each partition by
  ``(commit_ts, start_ts, key)``, and each task mounts, selects columns and
  writes its partition through every such sink's partition writer, in
  parallel; the driver then calls ``commit_batch`` (the DDL) on each;
* a sink without a task writer that writes the batch's frame itself
  (:meth:`~cdcflow.core.data.sink.Sink.write_frame`) gets the mounted records
  as a Spark DataFrame on the driver, with a decoder its tasks turn them into
  rows with: nothing is collected to the driver for it;
* the other sinks get the batch from the driver, in order: raw events are
  mounted by Spark tasks first, then the rows come to the driver — a small
  batch (at most ``collect_rows`` rows) collected and sorted there, a larger
  one sorted by Spark, staged as Parquet under the changefeed's directory and
  read back row group by row group, so the driver never holds it whole.

A source whose mounter gives no batch mounter is mounted on the driver, one
event at a time on the capture's event loop (the way of mounters written
before batch mounting; it does not scale with executors).

Commit order, per batch: every partition of every sink flushed, then every
sink's ``commit_batch`` / ``write_batch`` returned → ``cdcflow_batch_flushed``
→ the event store records the checkpoint → ``on_checkpoint(end_ts)`` (the
maintainer reports it) → Spark commits the batch. A crash anywhere before
Spark's commit replays the batch with the same id (at-least-once; sinks
dedupe by batch id). Chunks of a batch are released only when the next batch
starts, because until then Spark may replay it.

A batch's end ts is this capture's frontier, not the changefeed's: sinks are
told the *changefeed* checkpoint separately (:meth:`ChangefeedPipeline.emit_checkpoint`,
from the maintainer's heartbeats), by a :class:`~cdcflow.core.data.pipeline.checkpoints.CheckpointWriter`
that shares a lock with batch delivery, so a checkpoint never lands between
the writes of a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import pickle
import shutil
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from cdcflow.core.config.settings import DEFAULT_MAX_BATCH_ROWS, DEFAULT_TRIGGER_INTERVAL
from cdcflow.core.data.events import DDLEvent, MicroBatch, RawKVEvent, RowChange, Span, TableName, TableSchema
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice.manifest import read_manifest
from cdcflow.core.data.logservice.records import (
    SPARK_SCHEMA_DDL,
    batch_to_records,
    event_from_record,
    record_batch_rows,
    record_tables,
)
from cdcflow.core.data.logservice.store import EventStore
from cdcflow.core.data.pipeline.backoff import is_retryable, retry_delay
from cdcflow.core.data.pipeline.checkpoints import CheckpointWriter
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.pipeline.datasource import (
    MIN_SPLIT_ROWS,
    CdcflowDataSource,
    offset_chunk,
    offset_ts,
    split_record_batches,
)
from cdcflow.core.data.pipeline.delivery import DEFAULT_PART_ROWS, BatchDelivery
from cdcflow.core.data.pipeline.query import (
    ARROW_ORDER,
    ORDER_COLUMNS,
    Lane,
    lane_placement,
    table_filter_predicate,
    whole_lane_shares,
)
from cdcflow.core.data.pipeline.session import register_source
from cdcflow.core.data.pipeline.tasks import (
    ENCODED_SCHEMA_DDL,
    LANE_ORDER,
    SUMMARY_SCHEMA_DDL,
    ChunkRange,
    ChunkRangesTask,
    EncodeTask,
    LaneHandOff,
    LaneRunsTask,
    LaneTask,
    MountTask,
    OrderedRunsTask,
    RecordDecoder,
    RowPlan,
    RowsTask,
    SortedTask,
    TaskSummary,
    WriteTask,
    check_mounted,
    pass_records,
    raise_task_error,
)
from cdcflow.core.data.sink import BatchFrame, LaneTaskWriter, RowsFunction, Sink, TaskWriter
from cdcflow.core.data.source import Mounter
from cdcflow.core.data.transform import TransformChain
from cdcflow.core.errors import CdcflowError, ConfigInvalidError
from cdcflow.core.metrics import ChangefeedMetrics
from cdcflow.core.plugin.manager import PluginManager

__all__ = [
    "DEFAULT_COLLECT_ROWS",
    "DEFAULT_TASK_ROWS",
    "SNAPSHOT_BATCH_ID",
    "SNAPSHOT_DDL_BATCH_ID",
    "BatchInterruptedError",
    "ChangefeedPipeline",
    "create_table_ddl",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Rows converted (and mounted) per step on the driver.
_CONVERT_ROWS = 4_096
#: Row-group size of staged batches: bounds what the driver reads at once.
_STAGING_ROW_GROUP_BYTES = 8 * 1024 * 1024
#: Batches up to this many rows are collected to the driver; larger ones go through files.
DEFAULT_COLLECT_ROWS = 50_000
#: A batch gets one more task partition per this many rows, up to Spark's parallelism.
DEFAULT_TASK_ROWS = 8_192
#: A batch of at most this many rows, its files known, is handed to ``BatchFrame.map_rows``
#: functions in order by tasks that each read and sort the whole batch and keep their run
#: of it (:class:`OrderedRunsTask`), instead of by Spark's range sort (a sampling job, then
#: a shuffle). Each such task holds the batch's records at once: a larger batch (one of
#: a changefeed without ``max-batch-rows``) is sorted by Spark, which spills.
ORDERED_RUNS_MAX_ROWS = 500_000
#: The batch id of an initial snapshot: no streaming batch has it (Spark numbers them from 0).
SNAPSHOT_BATCH_ID = -1
#: The batch (DDL only, just below the snapshot's ts) that creates the snapshot's tables.
SNAPSHOT_DDL_BATCH_ID = -2
#: TiDB's ActionType of CREATE TABLE.
_CREATE_TABLE = 3


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def create_table_ddl(schema: TableSchema, commit_ts: int) -> DDLEvent:
    """A ``CREATE TABLE IF NOT EXISTS`` of ``schema`` (columns with their ``sql_type``, the
    handle key as primary key) at ``commit_ts``, for DDL-aware sinks to create a table
    whose rows an initial snapshot brings."""
    name = schema.table
    columns = [f"{_quote(c.name)} {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in schema.columns]
    keys = schema.handle_key_columns()
    if keys:
        columns.append(f"PRIMARY KEY ({', '.join(_quote(k) for k in keys)})")
    query = f"CREATE TABLE IF NOT EXISTS {_quote(name.schema)}.{_quote(name.table)} ({', '.join(columns)})"
    table = TableName(name.schema, name.table, name.table_id)
    return DDLEvent(commit_ts, query, table, _CREATE_TABLE, schema_after=schema)


class BatchInterruptedError(Exception):
    """A micro-batch was cut short because its query is being stopped (Spark cancels
    the batch's jobs); Spark did not commit it, so the next start replays it."""


class _DropInterruptedBatches(logging.Filter):
    """py4j logs every exception raised in ``foreachBatch`` as an error with its
    traceback; an interrupted batch on stop is expected, not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, BatchInterruptedError)


_PY4J_FILTER = _DropInterruptedBatches()

#: Stops in progress that keep Spark's stream-execution loggers quiet (see :func:`_stream_errors_off`).
_quiet_stops = 0
_quiet_lock = threading.Lock()
#: The loggers' explicit levels before the first of them (None: none was configured).
_quiet_before: dict[str, Any] = {}


@contextlib.contextmanager
def _stream_errors_off(spark: Any, query: Any) -> Iterator[None]:
    """Keep the ERROR Spark's stream execution logs, with the whole Java trace, when a
    batch fails ("Query ... terminated with error") out of Spark's log while ``query`` is
    being stopped: a batch the stop interrupts fails on purpose (the pipeline logs one
    line of its own, :meth:`ChangefeedPipeline._on_batch`). Only for the stop (the
    loggers are restored after it); a batch that fails otherwise is logged with its
    cause. Stops of several queries at once share one quiet period."""
    global _quiet_stops
    try:
        jvm = spark.sparkContext._jvm
        log4j = jvm.org.apache.logging.log4j
        configurator = log4j.core.config.Configurator
        # Spark's loggers are named after the class whose code logs: the query's own
        # (MicroBatchExecution), where the stream thread reports how the query ended.
        names = {str(query._jsq.streamingQuery().getClass().getName())}
    except Exception:  # noqa: BLE001 - py4j's errors (no log4j 2, not a classic query): nothing to quiet
        yield
        return
    with _quiet_lock:
        if _quiet_stops == 0:
            loggers = log4j.LogManager.getContext(False).getConfiguration().getLoggers()
            for name in names:
                _quiet_before[name] = loggers.get(name).getLevel() if loggers.containsKey(name) else None
                configurator.setLevel(name, log4j.Level.OFF)
        _quiet_stops += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_stops -= 1
            if _quiet_stops == 0:
                context = log4j.LogManager.getContext(False)
                for name, level in _quiet_before.items():
                    if level is None:
                        context.getConfiguration().removeLogger(name)
                    else:
                        configurator.setLevel(name, level)
                context.updateLoggers()
                _quiet_before.clear()


class ChangefeedPipeline:
    """Runs one changefeed's streaming query; see the module docs for the guarantees."""

    def __init__(
        self,
        *,
        changefeed_id: str,
        store: EventStore,
        sinks: Sequence[Sink[Any]],
        spark: Any,
        checkpoint_dir: Path,
        table_filter: TableFilter | None = None,
        plugins: PluginManager | None = None,
        mounter: Mounter | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        trigger_interval: float = DEFAULT_TRIGGER_INTERVAL,
        part_rows: int = DEFAULT_PART_ROWS,
        collect_rows: int = DEFAULT_COLLECT_ROWS,
        work_dir: Path | None = None,
        column_selection: ColumnSelection | None = None,
        on_checkpoint: Callable[[int], None] | None = None,
        task_rows: int = DEFAULT_TASK_ROWS,
        task_partitions: int | None = None,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        metrics: ChangefeedMetrics | None = None,
        transforms: TransformChain | None = None,
    ) -> None:
        self.changefeed_id = changefeed_id
        self.store = store
        self.sinks = list(sinks)
        self.spark = spark
        self.checkpoint_dir = Path(checkpoint_dir)
        self.table_filter = table_filter or TableFilter()
        self.plugins = plugins
        self.mounter = mounter
        self.loop = loop
        self.trigger_interval = trigger_interval
        self.part_rows = part_rows
        self.collect_rows = collect_rows
        self.column_selection = column_selection or ColumnSelection()
        #: The connector's transforms: in the tasks and on the driver alike, rows and DDL.
        self.transforms = transforms or TransformChain()
        self._checked_schemas: set[TableSchema] = set()
        #: Where large sorted batches are staged (must be visible to the driver and executors).
        self.work_dir = Path(work_dir) if work_dir is not None else self.checkpoint_dir.parent / "batches"
        self.on_checkpoint = on_checkpoint
        self.task_rows = max(1, task_rows)
        self.max_batch_rows = max_batch_rows
        #: At most this many partitions per batch (None: Spark's default parallelism).
        self.task_partitions = task_partitions
        #: What the tasks of the last batch written in tasks did, one entry per partition.
        self.last_tasks: list[TaskSummary] = []
        #: The last retryable error a sink raised, while the batch is retried (None once it succeeds).
        self.batch_error: CdcflowError | None = None
        self.batches_flushed = 0
        #: The end offset of the newest micro-batch begun (0: none yet).
        self.batch_end_ts = 0
        self.rows_flushed = 0
        #: Where micro-batches are recorded (None: metrics off).
        self.metrics = metrics
        #: What each sink flushed in the current attempt of a batch: (sink, rows, bytes or None, seconds).
        self._flushes: list[tuple[str, int, int | None, float]] = []
        self._query: Any = None
        self._initial = (0, 0)
        self._stopping = threading.Event()
        #: Held while a batch is written to the sinks, and while a checkpoint is.
        self._delivery_lock = threading.Lock()
        self.checkpoints = CheckpointWriter(changefeed_id, self.sinks, self._delivery_lock)

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        """Start the query (blocking for about a second: call off the event loop)."""
        if self._query is not None:
            return
        self._initial = self._initial_offset()
        logging.getLogger("py4j.clientserver").addFilter(_PY4J_FILTER)  # idempotent
        stream = self.spark.readStream
        # The capture's start has registered it with its session (or does once the initial
        # snapshots held then are delivered: start_spark); a session made elsewhere has it
        # registered here. Registering it again costs nothing.
        register_source(self.spark)
        frame = (
            stream.format(CdcflowDataSource.name())
            .option("path", str(self.store.directory.resolve()))
            .option("maxBatchRows", str(self.max_batch_rows))
            .option("minPartitions", str(self.task_partitions or self.spark.sparkContext.defaultParallelism))
            .load()
            .where(table_filter_predicate(self.table_filter))
        )
        self._query = (
            frame.writeStream.foreachBatch(self._on_batch)
            .option("checkpointLocation", str(self.checkpoint_dir.resolve()))
            .trigger(processingTime=f"{max(1, round(self.trigger_interval * 1000))} milliseconds")
            .queryName(f"cdcflow-{self.changefeed_id}")
            .start()
        )

    def _initial_offset(self) -> tuple[int, int]:
        """Where a new query starts: what the data source's ``initialOffset`` says."""
        ts = self.store.checkpoint_ts
        manifest = read_manifest(self.store.directory)
        return ts, (offset_chunk({"resolved_ts": ts}, manifest) if manifest is not None else 0)

    def stop(self, grace: float = 10.0) -> None:
        """Stop the query. Waits up to ``grace`` seconds for a batch in progress to be
        committed by Spark (so a clean stop does not replay it); a batch still
        running then is interrupted and replayed on the next start. Then the
        newest changefeed checkpoint not written yet is written (one attempt)."""
        query, self._query = self._query, None
        if query is not None:
            deadline = time.monotonic() + grace
            while query.isActive and time.monotonic() < deadline and query.status.get("isTriggerActive"):
                time.sleep(0.05)
            self._stopping.set()
            with _stream_errors_off(self.spark, query):
                query.stop()
        self.checkpoints.stop(grace)

    def emit_checkpoint(self, ts: int) -> None:
        """Tell every sink the changefeed checkpoint ``ts`` (``Sink.write_checkpoint``) soon,
        from the checkpoint writer's thread; a ts not above the last offered is ignored."""
        self.checkpoints.offer(ts)

    @property
    def last_error(self) -> CdcflowError | None:
        """The retryable sink error being retried now (a batch's or a checkpoint's), if any."""
        return self.batch_error or self.checkpoints.last_error

    @property
    def running(self) -> bool:
        return self._query is not None and bool(self._query.isActive)

    def failure(self) -> BaseException | None:
        """The error that ended the query (or the checkpoint writer), or None while
        it runs (or was stopped)."""
        if self.checkpoints.failure is not None:
            return self.checkpoints.failure
        if self._query is None or self._query.isActive:
            return None
        error: BaseException | None = self._query.exception()
        return error

    # -- one micro-batch ------------------------------------------------------------

    def _on_batch(self, frame: Any, batch_id: int) -> None:
        (start_ts, start_chunk), (end_ts, end_chunk) = self._batch_offsets(batch_id)
        self.batch_end_ts = max(self.batch_end_ts, end_ts)
        # Spark started batch N, so every batch before it is committed: their chunks can go.
        self.store.release(start_ts, before_chunk=start_chunk)
        began = time.perf_counter()
        try:
            rows = self._deliver_with_retry(frame, batch_id, (start_ts, start_chunk), (end_ts, end_chunk))
        except Exception as exc:
            if not self._stopping.is_set():
                raise
            log.warning(
                "changefeed %s: batch %d (ts %d..%d) interrupted by the stop (%s); it was not committed "
                "and is replayed on the next start",
                *(self.changefeed_id, batch_id, start_ts, end_ts, _first_line(exc)),
            )
            # Raised without its cause: Spark matches the message of a failed batch
            # with regular expressions, which overflow the stack on a long Java trace.
            message = f"changefeed {self.changefeed_id}: batch {batch_id} interrupted by stop; replayed on restart"
            raise BatchInterruptedError(message) from None
        self.batches_flushed += 1
        self.rows_flushed += rows
        if self.plugins is not None:
            self.plugins.batch_flushed(self.changefeed_id, batch_id, end_ts, rows)
        self.store.checkpoint(end_ts, end_chunk)
        if self.on_checkpoint is not None:
            self.on_checkpoint(end_ts)
        metrics = self.metrics
        if metrics is not None:  # once per batch, after its checkpoint
            for sink, count, nbytes, seconds in self._flushes:
                metrics.sink_flushed(sink, count, nbytes, seconds)
            metrics.batch_done(rows, time.perf_counter() - began)

    def _deliver_with_retry(self, frame: Any, batch_id: int, start: tuple[int, int], end: tuple[int, int]) -> int:
        attempt = 0
        while True:
            try:
                with self._delivery_lock:
                    rows = self._deliver(frame, batch_id, start, end)
            except CdcflowError as exc:
                if not is_retryable(exc) or self._stopping.is_set():
                    if self.metrics is not None and not self._stopping.is_set():
                        self.metrics.error(exc, retried=False)
                    raise
                if self.metrics is not None:
                    self.metrics.error(exc, retried=True)
                self.batch_error = exc
                delay = retry_delay(attempt)
                attempt += 1
                log.warning(
                    "changefeed %s: batch %d failed (%s); retry %d in %.1fs",
                    *(self.changefeed_id, batch_id, exc, attempt, delay),
                )
                if self._stopping.wait(delay):
                    raise
                continue
            self.batch_error = None
            return rows

    def _deliver(self, frame: Any, batch_id: int, start: tuple[int, int], end: tuple[int, int]) -> int:
        (start_ts, start_chunk), (end_ts, end_chunk) = start, end
        ddl = self._transform_ddl(self.store.ddl_between(start_ts, end_ts))
        chunks = self.store.chunks_in(start_chunk, end_chunk)
        expected = sum(chunk.rows for chunk in chunks)
        plan = self._plan(start_ts, end_ts) if expected else None
        directory = self.store.directory.resolve()
        files = tuple(str(directory / chunk.file) for chunk in chunks)
        info = tuple((chunk.span_id, chunk.rows) for chunk in chunks)
        return self._deliver_frame(
            frame, batch_id, start_ts, end_ts, ddl, expected, plan, chunk_files=files, chunk_info=info
        )

    def deliver_snapshot(
        self,
        frame: Any,
        ts: int,
        expected: int,
        spans: Mapping[int, Span],
        batch_id: int = SNAPSHOT_BATCH_ID,
        *,
        files: tuple[str, ...] = (),
    ) -> int:
        """Write an initial snapshot — ``frame``: the records (event store's format) of every
        row as of ``ts``, with commit ts ``ts``, of ``spans`` (id → span) — to every sink as
        one batch with id ``batch_id`` (:data:`SNAPSHOT_BATCH_ID`; a snapshot range placed on
        a cluster has its own, :func:`~cdcflow.core.data.snapshot_ranges.range_batch_id`) and
        ts range ``ts..ts``, mounted with the schema at ``ts``, committed like any batch
        (``commit_batch``, ``cdcflow_batch_flushed``). Called before :meth:`start`; the
        store's checkpoint stays ``ts``. ``files``: the part files ``frame`` reads, which
        tasks may read themselves. Returns the rows written."""
        plan = dataclasses.replace(self._plan(ts - 1, ts), spans=dict(spans))
        creates = self._create_tables(plan, ts - 1)
        with self._delivery_lock:
            if creates:
                # Before the rows, in a batch of its own ending below them: sinks apply a batch's
                # DDL after its rows, and the snapshot's tables must exist before them.
                self._deliver_frame(None, SNAPSHOT_DDL_BATCH_ID, ts - 1, ts - 1, creates, 0, None)
            rows = self._deliver_frame(
                frame, batch_id, ts, ts, (), expected, plan if expected else None, one_ts=True, chunk_files=files
            )
        self.rows_flushed += rows
        if self.plugins is not None:
            self.plugins.batch_flushed(self.changefeed_id, batch_id, ts, rows)
        return rows

    def _create_tables(self, plan: RowPlan, commit_ts: int) -> tuple[DDLEvent, ...]:
        """``CREATE TABLE IF NOT EXISTS`` of every replicated table the snapshot's rows may
        have, with its schema at the snapshot ts (one per table, not per partition)."""
        if plan.mounter is None:
            return ()
        out: dict[tuple[str, str], DDLEvent] = {}
        for schema in plan.mounter.schemas():
            name = schema.table
            if (name.schema, name.table) in out or not self.table_filter.matches(name.schema, name.table):
                continue
            if not any(column.sql_type for column in schema.columns):
                continue  # a source that gives no column types: its tables cannot be created
            out[(name.schema, name.table)] = create_table_ddl(schema, commit_ts)
        return tuple(out.values())

    def _deliver_frame(
        self,
        frame: Any,
        batch_id: int,
        start_ts: int,
        end_ts: int,
        ddl: tuple[Any, ...],
        expected: int,
        plan: RowPlan | None,
        *,
        one_ts: bool = False,
        chunk_files: tuple[str, ...] = (),
        chunk_info: tuple[tuple[int, int], ...] = (),
    ) -> int:
        """Deliver a batch to the sinks (``one_ts``: every row of it has one commit ts and
        each key appears once, as in an initial snapshot's batch; ``chunk_files``: the
        event store's files ``frame`` reads, which tasks may read themselves, and
        ``chunk_info`` each one's span id and rows when known)."""
        # A source that cannot mount in tasks has every sink written from the driver.
        on_driver = plan is not None and self.mounter is not None and plan.mounter is None
        tables = self._tables(plan) if plan is not None and not on_driver else []
        writers = {id(sink): None if on_driver else sink.task_writer(tables) for sink in self.sinks}
        task_sinks = [s for s in self.sinks if writers[id(s)] is not None]
        driver_sinks = [s for s in self.sinks if writers[id(s)] is None]
        head = MicroBatch(self.changefeed_id, batch_id, start_ts, end_ts)
        rows = 0
        self._flushes = []
        if task_sinks:
            began = time.perf_counter()
            task_bytes = 0
            if plan is not None:
                task_writers = tuple(w for w in writers.values() if w is not None)
                by_table = any(sink.task_partitioning() == "table" for sink in task_sinks)
                rows, task_bytes = self._write_in_tasks(
                    frame,
                    plan,
                    head,
                    task_writers,
                    expected,
                    by_table=by_table,
                    one_ts=one_ts,
                    chunk_files=chunk_files,
                    chunk_info=chunk_info,
                )
            tasks_seconds = time.perf_counter() - began
            for sink in task_sinks:
                committed = time.perf_counter()
                sink.commit_batch(MicroBatch(self.changefeed_id, batch_id, start_ts, end_ts, ddl=ddl))
                seconds = tasks_seconds + time.perf_counter() - committed
                self._flushes.append((_sink_name(sink), rows, task_bytes, seconds))
        if driver_sinks and plan is not None and not on_driver:
            driver_sinks, written = self._write_frames(
                frame, plan, head, ddl, driver_sinks, expected, one_ts, chunk_files=chunk_files
            )
            if written is not None:
                rows = written
                if not driver_sinks:
                    return rows
        if driver_sinks or not task_sinks:
            rows = self._deliver_on_driver(frame, plan, head, ddl, driver_sinks, expected, one_ts)
        return rows

    def _write_frames(
        self,
        frame: Any,
        plan: RowPlan,
        head: MicroBatch,
        ddl: tuple[Any, ...],
        sinks: Sequence[Sink[Any]],
        expected: int,
        one_ts: bool = False,
        *,
        chunk_files: tuple[str, ...] = (),
    ) -> tuple[list[Sink[Any]], int | None]:
        """Offer the batch's mounted frame to each sink (``Sink.write_frame``): the sinks that
        declined it, and the rows the last one that took it wrote (None: none took it)."""
        mounted: Any = frame
        ordered: Any = None
        mapper: Callable[[RowsFunction, str], Any] | None = None
        if plan.mounter is not None:
            partitions = self._task_partition_count(expected)
            apart = partitions > 1 and _reads_apart(expected, partitions)

            @functools.cache
            def shares() -> list[list[tuple[str, int, int]]] | None:
                """The batch's files split among the tasks, once per batch."""
                return split_record_batches(chunk_files, partitions) if chunk_files else None

            def read_apart(task: Any, schema: str) -> Any:
                return self._map_read_apart(frame, task, schema, partitions, chunk_files, one_ts, shares())

            def raw_records() -> Any:
                return read_apart(pass_records, SPARK_SCHEMA_DDL) if apart and chunk_files else frame

            # Made when a sink reads them (BatchFrame): a sink that maps rows never does.
            def mounted_rows() -> Any:
                mount = MountTask(plan)
                return read_apart(mount, SPARK_SCHEMA_DDL) if apart else frame.mapInArrow(mount, SPARK_SCHEMA_DDL)

            def rows_sorted() -> Any:
                return self._mounted_in_order(raw_records(), plan)

            mounted = mounted_rows
            if not one_ts:
                ordered = rows_sorted

            def rows_in_order(function: RowsFunction, schema: str) -> Any:
                task = RowsTask(plan, self.column_selection, function)
                if not one_ts and chunk_files and expected <= ORDERED_RUNS_MAX_ROWS:
                    return self._map_ordered_runs(frame, task, schema, partitions, chunk_files)
                if not one_ts:
                    return raw_records().orderBy(*ORDER_COLUMNS).mapInArrow(task, schema)
                return read_apart(task, schema) if apart else frame.mapInArrow(task, schema)

            mapper = rows_in_order

        decoder = RecordDecoder(dict(enumerate(self.store.schemas.all())), self.column_selection, self.transforms)
        rows = BatchFrame(mounted, decoder, expected, one_ts, ordered, mapper)
        batch = MicroBatch(self.changefeed_id, head.batch_id, head.start_ts, head.end_ts, ddl=ddl)
        declined: list[Sink[Any]] = []
        written: int | None = None
        for sink in sinks:
            began = time.perf_counter()
            count = sink.write_frame(batch, rows)
            if count is None:
                declined.append(sink)
                continue
            written = count
            self._flushes.append((_sink_name(sink), count, None, time.perf_counter() - began))
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "changefeed %s: batch %d: %d rows written as a frame by %s in %.3fs",
                    *(self.changefeed_id, head.batch_id, count, type(sink).__name__, time.perf_counter() - began),
                )
        return declined, written

    def _plan(self, start_ts: int, end_ts: int) -> RowPlan:
        """What the tasks of batch ``(start_ts, end_ts]`` need: spans, the batch mounter
        (schemas valid in the range; its schemas registered here, once)."""
        batch_mounter = None
        ids = {}
        if self.mounter is not None:
            batch_mounter = self._on_loop(self.mounter.for_batch(start_ts, end_ts))
            if batch_mounter is not None:
                ids = {schema: self.store.schemas.id_of(schema) for schema in batch_mounter.schemas()}
                self._check_transforms(batch_mounter.schemas())
        return RowPlan(
            self.changefeed_id,
            str(self.store.directory.resolve()),
            self.store.spans_by_id(),
            batch_mounter,
            self.table_filter,
            ids,
            self.transforms,
        )

    def _check_transforms(self, schemas: Sequence[TableSchema]) -> None:
        """Refuse (1001, not retried) transforms that cannot apply to the batch's schemas:
        an unknown column, tables of different columns routed into one."""
        if not self.transforms:
            return
        replicated = [s for s in schemas if self.table_filter.matches(s.table.schema, s.table.table)]
        if all(s in self._checked_schemas for s in replicated):
            return
        known = {(s.table.schema, s.table.table): s for s in [*self._checked_schemas, *replicated]}
        problems = self.transforms.check(list(known.values()))
        if problems:
            text = "; ".join(f"{label}{'.' + field if field else ''}: {message}" for label, field, message in problems)
            raise ConfigInvalidError(
                f"changefeed {self.changefeed_id}: its transforms cannot apply to the source's tables: {text}",
                detail={"problems": [list(p) for p in problems]},
            )
        self._checked_schemas.update(replicated)

    def _transform_ddl(self, events: Iterable[DDLEvent]) -> tuple[DDLEvent, ...]:
        """The batch's DDL as the sinks see it (routed, columns transformed; some left out)."""
        if not self.transforms:
            return tuple(events)
        out = (self.transforms.ddl(e) for e in events)
        return tuple(e for e in out if e is not None)

    def _tables(self, plan: RowPlan) -> list[TableName]:
        """The replicated tables whose rows a batch may hold: every table the store has a
        schema of, and every table the batch mounter may give rows of."""
        schemas = [*self.store.schemas.all(), *(plan.mounter.schemas() if plan.mounter is not None else ())]
        names = {(s.table.schema, s.table.table): s.table for s in schemas}
        tables = [t for t in names.values() if self.table_filter.matches(t.schema, t.table)]
        if not self.transforms:
            return tables
        routed = {(r.schema, r.table): r for r in (self.transforms.table(t) for t in tables)}
        return list(routed.values())

    def _task_partition_count(self, expected: int) -> int:
        limit = self.task_partitions or int(self.spark.sparkContext.defaultParallelism)
        return max(1, min(limit, -(-expected // self.task_rows)))

    def _write_in_tasks(
        self,
        frame: Any,
        plan: RowPlan,
        head: MicroBatch,
        writers: tuple[TaskWriter, ...],
        expected: int,
        *,
        by_table: bool,
        one_ts: bool = False,
        chunk_files: tuple[str, ...] = (),
        chunk_info: tuple[tuple[int, int], ...] = (),
    ) -> tuple[int, int]:
        """Write the batch in Spark tasks: (rows, bytes) the tasks' summaries report.
        ``one_ts``: every row has one commit ts, each key once (an initial snapshot's
        batch; a streaming batch's ts range may be a single ts and still hold rows of
        many, the backlog of a span that joined behind). ``chunk_files``: the event
        store's files of the batch, in order (empty: ``frame`` is not the store's), and
        ``chunk_info`` their spans' ids and rows (empty: not known)."""
        began = time.perf_counter()
        partitions = self._task_partition_count(expected)
        summaries = self._run_tasks(
            frame, plan, head, writers, expected, partitions, by_table, one_ts, chunk_files, chunk_info
        )
        self.last_tasks = summaries
        raise_task_error(summaries)
        rows = sum(s.rows for s in summaries)
        if self.metrics is not None:
            self.metrics.tasks_done(s.finished - s.started for s in summaries)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "changefeed %s: batch %d: %d rows written by %d tasks in %.3fs",
                *(self.changefeed_id, head.batch_id, rows, len(summaries), time.perf_counter() - began),
            )
        return rows, sum(s.bytes for s in summaries)

    def _run_tasks(
        self,
        frame: Any,
        plan: RowPlan,
        head: MicroBatch,
        writers: tuple[TaskWriter, ...],
        expected: int,
        partitions: int,
        by_table: bool,
        one_ts: bool,
        chunk_files: tuple[str, ...],
        chunk_info: tuple[tuple[int, int], ...] = (),
    ) -> list[TaskSummary]:
        """The summaries of the Spark tasks that wrote the batch (see :meth:`_write_in_tasks`)."""
        lanes = tuple(w for w in writers if isinstance(w, LaneTaskWriter))
        if partitions == 1:
            # A batch for one task (a live batch of a few rows, every batch with one task
            # slot) is gathered into it without a shuffle: one Spark stage instead of two,
            # which is most of a small batch's time. A bounded batch's files (known) the
            # task reads itself and sorts in its worker with Arrow, as the ordered runs of
            # a frame-written batch are: one Python worker, no trip through the JVM. A
            # larger one is sorted by Spark, which spills what it cannot hold. An initial
            # snapshot's batch (one ts, each key once) is in its order as read: never sorted.
            write = WriteTask(plan, head, writers, self.column_selection)
            if one_ts:
                one = frame if chunk_files else frame.coalesce(1)  # a task reading the files itself: no frame
                out = self._map_read_apart(one, write, SUMMARY_SCHEMA_DDL, 1, chunk_files, one_ts)
            elif chunk_files and expected <= ORDERED_RUNS_MAX_ROWS:
                out = self._map_read_apart(frame, SortedTask(write), SUMMARY_SCHEMA_DDL, 1, chunk_files, one_ts)
            else:
                grouped = frame.coalesce(1).sortWithinPartitions(*ORDER_COLUMNS)
                out = grouped.mapInArrow(write, SUMMARY_SCHEMA_DDL)
        elif by_table and len(lanes) == len(writers) and one_ts:
            # Every row of the batch has one commit ts (an initial snapshot's, each key
            # once): a lane's order among them is free, so each task writes its rows to
            # their lanes itself, in one step, wherever they were read.
            write = WriteTask(plan, head, writers, self.column_selection)
            if _reads_apart(expected, partitions):
                out = self._map_read_apart(frame, write, SUMMARY_SCHEMA_DDL, partitions, chunk_files, one_ts)
            else:
                out = frame.repartition(partitions, "key").mapInArrow(write, SUMMARY_SCHEMA_DDL)
        elif by_table and len(lanes) == len(writers):
            shares = self._whole_lane_shares(plan, lanes, partitions, chunk_files, chunk_info)
            if shares is None:
                # Mount and encode in parallel, then split by lane (a Kafka partition) to
                # write each lane's parts in order: a table's rows are not bound to one
                # task, its lane is (see LaneTaskWriter). Encoding needs no order: a batch
                # the data source read in a partition per task is encoded where it was
                # read, without a shuffle.
                return self._write_lanes(frame, plan, head, lanes, expected, partitions, chunk_files, one_ts)
            # The batch's tables fall into groups that share no lane and weigh about
            # evenly: each task reads its groups' files, sorts them and writes whole lanes.
            whole = SortedTask(WriteTask(plan, head, writers, self.column_selection))
            out = self._map_read_apart(frame, whole, SUMMARY_SCHEMA_DDL, len(shares), chunk_files, one_ts, shares)
        else:
            keys = ("table_id",) if by_table else ("table_id", "key")
            write = WriteTask(plan, head, writers, self.column_selection)
            if chunk_files and not one_ts and expected <= ORDERED_RUNS_MAX_ROWS:
                # Each task reads the batch's files and keeps the records whose keys hash to
                # it (every change of a key, or every row of a table, in one task), sorted in
                # its worker: the records skip Spark's shuffle and its sort, in the JVM.
                out = self._map_read_hashed(frame, SortedTask(write), partitions, chunk_files, keys)
            else:
                grouped = frame.repartition(partitions, *keys).sortWithinPartitions(*ORDER_COLUMNS)
                out = grouped.mapInArrow(write, SUMMARY_SCHEMA_DDL)
        return [TaskSummary.from_row(row.asDict()) for row in out.collect()]

    def _whole_lane_shares(
        self,
        plan: RowPlan,
        lanes: tuple[LaneTaskWriter, ...],
        partitions: int,
        chunk_files: tuple[str, ...],
        chunk_info: tuple[tuple[int, int], ...],
    ) -> list[list[tuple[str, int, int]]] | None:
        """The batch's files dealt to its tasks so that each lane is written whole by one
        (:func:`~.query.whole_lane_shares`), as ``_map_read_apart`` shares; None when the
        batch is not written so: its files or their spans not known, a table's lanes not
        known, groups too uneven, or a task's share more than it sorts in its worker
        (:data:`ORDERED_RUNS_MAX_ROWS`). A span's table is the one its id names (a
        partition's is the partitioned table), named by the schemas of the store and of
        the batch mounter, transforms applied; a table the filter leaves out has no lanes."""
        if partitions < 2 or not chunk_files or len(chunk_info) != len(chunk_files):
            return None
        names: dict[int, set[TableName]] = {}
        schemas = [*self.store.schemas.all(), *(plan.mounter.schemas() if plan.mounter is not None else ())]
        for schema in schemas:
            table = schema.table
            physical = table.partition_id if table.partition_id is not None else table.table_id
            names.setdefault(physical, set()).add(table)
        lanes_of: dict[TableName, list[Lane] | None] = {}

        def table_lanes(table: TableName) -> list[Lane] | None:
            if table not in lanes_of:
                if not self.table_filter.matches(table.schema, table.table):
                    lanes_of[table] = []
                else:
                    routed = self.transforms.table(table) if self.transforms else table
                    known: list[Lane] | None = []
                    for i, writer in enumerate(lanes):
                        found = writer.table_lanes(routed)
                        if found is None or known is None:
                            known = None
                        else:
                            known += [(i, route, lane) for route, lane in found]
                    lanes_of[table] = known
            return lanes_of[table]

        files: list[tuple[str, int, list[Lane] | None]] = []
        for path, (span_id, rows) in zip(chunk_files, chunk_info, strict=True):
            span = plan.spans.get(span_id)
            # A span no schema names: the tables its records name, when they are rows.
            tables = names.get(span.table_id) if span is not None else None
            found = [table_lanes(t) for t in tables or record_tables(path) or ()]
            known = [lane for f in found if f is not None for lane in f]
            files.append((path, rows, known if found and all(f is not None for f in found) else None))
        dealt = whole_lane_shares(files, partitions)
        if dealt is None:
            return None
        rows_of = {path: n for path, n, _ in files}
        if max(sum(rows_of[p] for p in share) for share in dealt) > ORDERED_RUNS_MAX_ROWS:
            return None
        # The files' footers, read only for a batch written so.
        return [[(path, 0, len(record_batch_rows(path))) for path in share] for share in dealt]

    def _write_lanes(
        self,
        frame: Any,
        plan: RowPlan,
        head: MicroBatch,
        lanes: tuple[LaneTaskWriter, ...],
        expected: int,
        partitions: int,
        chunk_files: tuple[str, ...],
        one_ts: bool,
    ) -> list[TaskSummary]:
        """The two steps of a batch written per lane: encode in ``partitions`` tasks, then
        write each lane's parts in order from one lane task. With the batch's files known,
        tasks read them themselves and hand their parts to the lane tasks there; otherwise
        Spark shuffles them (lanes placed round-robin on the tasks) and sorts them."""
        if chunk_files:
            # Each encoding task reads at least MIN_SPLIT_ROWS rows (a batch of less than two
            # tasks' worth is encoded by one), and the lanes are still shared among all tasks:
            # a batch a little over one task's rows skips the shuffle too.
            readers = max(1, min(partitions, expected // MIN_SPLIT_ROWS))
            return self._hand_off_lanes(frame, plan, head, lanes, partitions, chunk_files, one_ts, readers)
        encode = EncodeTask(plan, lanes, self.column_selection)
        if _reads_apart(expected, partitions):
            encoded = self._map_read_apart(frame, encode, ENCODED_SCHEMA_DDL, partitions, chunk_files, one_ts)
        else:
            encoded = frame.repartition(partitions, "table_id", "key").mapInArrow(encode, ENCODED_SCHEMA_DDL)
        by_lane = encoded.repartition(partitions, lane_placement(partitions)).sortWithinPartitions(*LANE_ORDER)
        out = by_lane.mapInArrow(LaneTask(head, lanes), SUMMARY_SCHEMA_DDL)
        return [TaskSummary.from_row(row.asDict()) for row in out.collect()]

    def _hand_off_lanes(
        self,
        frame: Any,
        plan: RowPlan,
        head: MicroBatch,
        lanes: tuple[LaneTaskWriter, ...],
        partitions: int,
        chunk_files: tuple[str, ...],
        one_ts: bool,
        readers: int,
    ) -> list[TaskSummary]:
        """Encode the batch in ``readers`` tasks that read their share of its files and
        leave their parts as sorted runs per lane in the batch's work directory
        (:class:`LaneHandOff`), then write them from at most ``partitions`` lane tasks,
        given even shares of the lanes by size, each merging its lanes' runs: two Spark
        jobs, no shuffle. The summaries of both; an encoding task's error is raised before
        any lane is written."""
        directory = (self.work_dir / f"lanes-{head.batch_id}").resolve()
        shutil.rmtree(directory, ignore_errors=True)  # a replayed batch's runs are written again
        directory.mkdir(parents=True)
        hand_off = LaneHandOff(str(directory))
        try:
            encode = EncodeTask(plan, lanes, self.column_selection, hand_off)
            encoded = self._map_read_apart(frame, encode, ENCODED_SCHEMA_DDL, readers, chunk_files, one_ts)
            summaries = [
                TaskSummary.from_row(pickle.loads(row.summary))
                for row in encoded.where("writer < 0").select("summary").collect()
            ]
            raise_task_error(summaries)
            shares = hand_off.assign(partitions)
            if not shares:
                return summaries
            write = LaneRunsTask(hand_off, shares, head, lanes)
            out = frame.sparkSession.range(0, len(shares), 1, len(shares)).mapInArrow(write, SUMMARY_SCHEMA_DDL)
            return summaries + [TaskSummary.from_row(row.asDict()) for row in out.collect()]
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _map_read_apart(
        self,
        frame: Any,
        task: Any,
        schema_ddl: str,
        partitions: int,
        chunk_files: tuple[str, ...],
        one_ts: bool,
        shares: list[list[tuple[str, int, int]]] | None = None,
    ) -> Any:
        """``frame.mapInArrow(task, schema_ddl)`` for a batch the data source reads in a
        partition per task; with the batch's files known, the same from tasks that read
        their share of the files themselves, split as the data source splits them, so that
        the records skip the JVM (:class:`ChunkRangesTask`). A streaming batch's tasks leave
        out what the query's table filter leaves out of ``frame``; a snapshot's frame (its
        part files, ``one_ts``) has no filter. ``shares``: ``split_record_batches`` of the
        files into ``partitions``, when made already."""
        if not chunk_files:
            return frame.mapInArrow(task, schema_ddl)
        split = split_record_batches(chunk_files, partitions) if shares is None else shares
        read = ChunkRangesTask(tuple(tuple(share) for share in split), task, None if one_ts else self.table_filter)
        # The frame's session: a micro-batch's has the streaming query's settings.
        return frame.sparkSession.range(0, len(split), 1, len(split)).mapInArrow(read, schema_ddl)

    def _map_read_hashed(
        self, frame: Any, task: Any, partitions: int, chunk_files: tuple[str, ...], columns: tuple[str, ...]
    ) -> Any:
        """``task`` over the batch split into ``partitions`` by the hash of ``columns``, each
        task reading every file of the batch and keeping its own records
        (:attr:`ChunkRangesTask.hashed`): one Spark stage, no shuffle."""
        files = _every_record_batch(chunk_files)
        read = ChunkRangesTask(tuple(files for _ in range(partitions)), task, self.table_filter, hashed=columns)
        return frame.sparkSession.range(0, partitions, 1, partitions).mapInArrow(read, SUMMARY_SCHEMA_DDL)

    def _map_ordered_runs(
        self, frame: Any, task: Any, schema_ddl: str, partitions: int, chunk_files: tuple[str, ...]
    ) -> Any:
        """``task`` over the batch in order, ``partitions`` runs of it in partition order
        (as Spark's range sort of ``frame`` would give them), each task sorting the batch's
        records itself (:class:`OrderedRunsTask`): no sampling job, no shuffle."""
        reader = ChunkRangesTask((_every_record_batch(chunk_files),), pass_records, self.table_filter)
        runs = OrderedRunsTask(reader, partitions, task)
        return frame.sparkSession.range(0, partitions, 1, partitions).mapInArrow(runs, schema_ddl)

    def _deliver_on_driver(
        self,
        frame: Any,
        plan: RowPlan | None,
        head: MicroBatch,
        ddl: tuple[Any, ...],
        sinks: Sequence[Sink[Any]],
        expected: int,
        one_ts: bool = False,
    ) -> int:
        """Mount in tasks, bring the rows to the driver in order, and write them with
        ``write_batch`` (``one_ts``: a batch whose every row has one commit ts and each key
        appears once, as an initial snapshot's, is not sorted: any order is its order)."""
        delivery = BatchDelivery(
            self.changefeed_id, head.batch_id, head.start_ts, head.end_ts, ddl, sinks, part_rows=self.part_rows
        )
        began = time.perf_counter()
        read = 0.0
        nbytes = 0
        raw = frame
        if plan is not None and plan.mounter is not None:
            frame = frame.mapInArrow(MountTask(plan), SPARK_SCHEMA_DDL)
        if expected == 0:
            # No chunk in the range: the frame is empty, and running a Spark job to
            # learn that costs more than the rest of the batch. Sinks still see the batch.
            pass
        elif expected <= self.collect_rows:
            # One Spark job (scan, filter, mount, collect) and a sort of at most collect_rows
            # rows on the driver, instead of Spark's range sort (a sampling job plus a shuffle).
            table = frame.toArrow()
            if table.num_rows and not one_ts:
                table = table.sort_by(list(ARROW_ORDER))
            read = time.perf_counter() - began
            nbytes = table.nbytes
            for batch in table.to_batches(max_chunksize=_CONVERT_ROWS):
                check_mounted(batch)
                delivery.add(self._rows(list(batch_to_records(batch))))
        else:
            ordered = frame if one_ts else self._mounted_in_order(raw, plan)
            staging = self.work_dir / f"batch-{head.batch_id}"
            shutil.rmtree(staging, ignore_errors=True)
            # Small row groups: the driver reads one row group at a time.
            writer = ordered.write.mode("overwrite").option("parquet.block.size", _STAGING_ROW_GROUP_BYTES)
            writer.parquet(str(staging.resolve()))
            read = time.perf_counter() - began
            try:
                for batch in _read_sorted_parquet(staging):
                    nbytes += batch.nbytes
                    check_mounted(batch)
                    delivery.add(self._rows(list(batch_to_records(batch))))
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        convert = time.perf_counter() - began - read - sum(delivery.sink_seconds.values())
        delivery.finish()
        for sink in sinks:
            seconds = delivery.sink_seconds.get(sink.type_name, 0.0)
            self._flushes.append((_sink_name(sink), delivery.row_count, nbytes, seconds))
        if log.isEnabledFor(logging.DEBUG):
            sinks_seconds = ", ".join(f"{name} {seconds:.3f}s" for name, seconds in delivery.sink_seconds.items())
            log.debug(
                "changefeed %s: batch %d: %d rows, Spark %.3fs, convert %.3fs, sinks: %s",
                *(self.changefeed_id, head.batch_id, delivery.row_count, read, convert, sinks_seconds or "none"),
            )
        return delivery.row_count

    @staticmethod
    def _mounted_in_order(raw: Any, plan: RowPlan | None) -> Any:
        """The rows of the records ``raw`` in the batch's order (``ORDER_COLUMNS``: a range
        sort, partitions in order, each sorted). The records are sorted before they are
        mounted: a row keeps its record's order columns, so the order is the same, and the
        sort's sampling job and shuffle move raw records instead of mounting every row
        twice more."""
        ordered = raw.orderBy(*ORDER_COLUMNS)
        if plan is None or plan.mounter is None:
            return ordered
        return ordered.mapInArrow(MountTask(plan), SPARK_SCHEMA_DDL)

    def _rows(self, records: Sequence[Any]) -> list[RowChange]:
        events = [event_from_record(r, self.store.span_of, self.store.schemas) for r in records]
        if any(isinstance(e, RawKVEvent) for e in events):
            mounted = self._mount(events)
            rows = [r for r in mounted if r is not None and self.table_filter.matches(r.table.schema, r.table.table)]
        else:
            rows = [e for e in events if isinstance(e, RowChange)]
        if self.column_selection:
            rows = [self.column_selection.apply(r) for r in rows]
        return self.transforms.apply(rows) if self.transforms else rows

    def _mount(self, events: list[RawKVEvent | RowChange]) -> list[RowChange | None]:
        """Mount on the driver: only for a source whose mounter gives no batch mounter."""
        mounter = self.mounter
        if mounter is None:
            raise CdcflowError(
                f"changefeed {self.changefeed_id}: the source yields raw key-value events but no mounter "
                "was given to the pipeline"
            )

        async def mount_all() -> list[RowChange | None]:
            return [e if isinstance(e, RowChange) else await mounter.mount(e) for e in events]

        return self._on_loop(mount_all())

    def _on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the capture's event loop (where the source lives) and wait."""
        if self.loop is None:
            coroutine.close()
            raise CdcflowError(f"changefeed {self.changefeed_id}: the pipeline has no event loop to reach its source")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    # -- offsets -----------------------------------------------------------------------

    def _batch_offsets(self, batch_id: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """``(start_ts, start_chunk), (end_ts, end_chunk)`` of a batch, from Spark's
        offset log (written before the batch runs)."""
        end = self._logged_offset(batch_id)
        if end is None:
            raise CdcflowError(f"changefeed {self.changefeed_id}: Spark logged no offsets for batch {batch_id}")
        start = self._logged_offset(batch_id - 1) if batch_id > 0 else None
        return (self._initial if start is None else start), end

    def _logged_offset(self, batch_id: int) -> tuple[int, int] | None:
        path = self.checkpoint_dir / "offsets" / str(batch_id)
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return None
        # Format: a version line, the batch metadata, then one offset per source.
        offset = json.loads(lines[2])
        manifest = read_manifest(self.store.directory)
        if manifest is None:
            raise CdcflowError(f"changefeed {self.changefeed_id}: the event store's manifest is gone")
        return offset_ts(offset), offset_chunk(offset, manifest)


def _first_line(error: BaseException, limit: int = 160) -> str:
    """What a short log line says of ``error``: its type and its message's first line
    (of a Java exception raised through py4j, the Java exception's)."""
    java = getattr(error, "java_exception", None)
    lines = str(java if java is not None else error).strip().splitlines()
    if java is not None:
        return lines[0][:limit] if lines else type(error).__name__
    text = lines[0] if lines else ""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _sink_name(sink: Sink[Any]) -> str:
    """The ``sink`` label of a sink's metrics: its type (bounded, unlike URIs)."""
    return str(getattr(sink, "type_name", type(sink).__name__))


def _every_record_batch(chunk_files: Sequence[str]) -> tuple[ChunkRange, ...]:
    """Every record batch of ``chunk_files``, in order: the one share of a task that reads
    the whole batch."""
    whole = split_record_batches(chunk_files, 1)
    return tuple(whole[0]) if whole else ()


def _reads_apart(expected: int, partitions: int) -> bool:
    """Whether a batch of ``expected`` rows is read in ``partitions`` shares, each task its
    own (:meth:`ChangefeedPipeline._map_read_apart`), as the data source splits a batch:
    only when every share holds at least ``MIN_SPLIT_ROWS`` rows."""
    return expected >= partitions * MIN_SPLIT_ROWS


def _read_sorted_parquet(directory: Path) -> Iterator[pa.RecordBatch]:
    """The record batches of a sorted Spark output, in order: part files are
    numbered by range partition, and each is sorted."""
    import pyarrow.parquet as pq

    for path in sorted(directory.glob("part-*.parquet")):
        with pq.ParquetFile(path) as parquet:
            yield from parquet.iter_batches(batch_size=_CONVERT_ROWS)
