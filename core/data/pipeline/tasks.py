"""The per-row work of a micro-batch, in Spark tasks.

The driver plans a batch (offsets, DDL, the schemas its rows need) and hands
Spark one of two picklable functions for ``mapInArrow``; Spark runs it in its
Python workers, once per partition, in parallel:

* :class:`WriteTask` — records of one partition (all changes of the keys
  hashed there, in ``(commit_ts, start_ts, key)`` order) are mounted into
  rows, filtered, reduced to the selected columns, transformed (the
  connector's :class:`~cdcflow.core.data.transform.TransformChain`) and written through each
  sink's :class:`~cdcflow.core.data.sink.PartitionWriter`, then flushed; the
  task returns one summary row (rows written, worker pid, an error);
* :class:`MountTask` — raw key-value records are mounted into row records
  (the event store's record format, with schema ids the driver registered
  beforehand), for sinks that are written from the driver or that write the
  batch's frame themselves (:meth:`~cdcflow.core.data.sink.Sink.write_frame`,
  whose tasks decode the records with a :class:`RecordDecoder`).

A task may read its partition's records itself instead of getting them from
Spark: :class:`ChunkRangesTask` hands a task the record batches of some of
the event store's chunk files (or of an initial snapshot's part files), read
in the Python worker, so that the records never pass through the JVM (for a
batch whose first step needs no shuffle of its input; or for one split by key,
every task reading the whole batch and keeping the keys that hash to it:
:attr:`ChunkRangesTask.hashed`).

A :class:`~cdcflow.core.errors.CdcflowError` raised in a task (a row that
does not decode, a downstream that cannot be reached) is returned to the
driver pickled, whole, instead of failing the Spark job: the driver raises
it again, so it reaches the changefeed's state with its code, not as a
Spark stack trace. Anything else fails the task, which Spark may retry.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import heapq
import logging
import operator
import os
import pickle
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.core.data.codec import EncodedMessage, make_encoded_message
from cdcflow.core.data.events import InsertRun, MicroBatch, RawKVEvent, RowChange, Span, TableName, TableSchema
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice.records import (
    KIND_RAW,
    KIND_ROW,
    Record,
    SchemaRegistry,
    batch_to_records,
    event_from_record,
    raw_events,
    read_record_batches,
    record_from_event,
    records_to_batch,
)
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.pipeline.query import ARROW_ORDER, ORDER_COLUMNS, deal_largest_first
from cdcflow.core.data.sink import LaneTaskWriter, LaneWriter, PartitionWriter, RowDecoder, RowsFunction, TaskWriter
from cdcflow.core.data.source import BatchMounter
from cdcflow.core.data.transform import TransformChain
from cdcflow.core.errors import CdcflowError

__all__ = [
    "ENCODED_SCHEMA",
    "ENCODED_SCHEMA_DDL",
    "ERROR_KIND",
    "LANE_ORDER",
    "SUMMARY_SCHEMA",
    "SUMMARY_SCHEMA_DDL",
    "ChunkRangesTask",
    "EncodeTask",
    "LaneHandOff",
    "LaneRunsTask",
    "LaneTask",
    "MountTask",
    "RecordDecoder",
    "RowPlan",
    "RowsTask",
    "TaskSummary",
    "WriteTask",
    "check_mounted",
    "freeze_worker_heap",
    "pass_records",
    "paused_collector",
    "raise_task_error",
    "record_shares",
]

log = logging.getLogger(__name__)

#: The ``kind`` of a record that carries a pickled error instead of an event (MountTask).
ERROR_KIND = -1

#: What a WriteTask returns: one row per partition.
SUMMARY_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("rows", pa.int64()),
        ("pid", pa.int32()),
        ("started", pa.float64()),
        ("finished", pa.float64()),
        ("error", pa.binary()),
        ("bytes", pa.int64()),
    ]
)
SUMMARY_SCHEMA_DDL = "partition INT, rows BIGINT, pid INT, started DOUBLE, finished DOUBLE, error BINARY, bytes BIGINT"

#: Rows handed to the partition writers at a time.
_WRITE_ROWS = 4_096


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """What one partition's task did (``error``: the CdcflowError it stopped on; ``bytes``:
    the Arrow size of the records it read, which the driver counts as the bytes its sinks got)."""

    partition: int
    rows: int
    pid: int
    started: float
    finished: float
    error: CdcflowError | None
    bytes: int = 0

    @classmethod
    def from_row(cls, row: Mapping[str, object] | Sequence[object]) -> TaskSummary:
        partition, rows, pid, started, finished, error, nbytes = (
            [row[k] for k in SUMMARY_SCHEMA.names] if isinstance(row, Mapping) else list(row)
        )
        return cls(
            int(partition),  # type: ignore[call-overload]
            int(rows),  # type: ignore[call-overload]
            int(pid),  # type: ignore[call-overload]
            float(started),  # type: ignore[arg-type]
            float(finished),  # type: ignore[arg-type]
            pickle.loads(error) if error else None,  # type: ignore[arg-type]
            int(nbytes or 0),  # type: ignore[call-overload]
        )


def raise_task_error(summaries: Iterable[TaskSummary]) -> None:
    """Raise the error of the lowest partition that stopped on one (the others
    may have failed because of the same downstream)."""
    failed = sorted((s for s in summaries if s.error is not None), key=lambda s: s.partition)
    if failed:
        error = failed[0].error
        assert error is not None
        raise error


class _FrozenSchemaIds:
    """Schema ids registered by the driver for a batch; a task never registers new ones."""

    def __init__(self, ids: Mapping[TableSchema, int]) -> None:
        self._ids = ids

    def id_of(self, schema: TableSchema | None) -> int:
        if schema is None:
            return -1
        try:
            return self._ids[schema]
        except KeyError:
            raise CdcflowError(
                f"a mounted row of {schema.table} has a schema its batch mounter did not declare "
                "(BatchMounter.schemas must list every schema its rows carry)"
            ) from None


@dataclass(frozen=True)
class RowPlan:
    """How a task turns the event store's records into rows (shipped with every task)."""

    changefeed_id: str
    #: The event store's directory: row records name their schema by id in its registry.
    store_dir: str
    spans: Mapping[int, Span]
    mounter: BatchMounter | None
    table_filter: TableFilter
    #: Ids of the schemas ``mounter`` may give rows (registered by the driver).
    schema_ids: Mapping[TableSchema, int] = field(default_factory=dict)
    #: The connector's transforms, applied to rows after mounting and column selection.
    transforms: TransformChain = field(default_factory=TransformChain)

    def registry(self) -> SchemaRegistry:
        return SchemaRegistry(Path(self.store_dir) / "schemas.pkl")

    def lazy_registry(self) -> _LazyRegistry:
        """The registry, read from the store on the first row record (raw records need none)."""
        return _LazyRegistry(self)

    def mount(self, event: RawKVEvent) -> RowChange | None:
        """``event`` as a row of a replicated table, or None."""
        if self.mounter is None:
            raise CdcflowError(
                f"changefeed {self.changefeed_id}: the source yields raw key-value events but gave no batch mounter"
            )
        row = self.mounter.mount(event)
        if row is None or not self.table_filter.matches(row.table.schema, row.table.table):
            return None
        return row

    def mount_many(self, events: Sequence[RawKVEvent]) -> list[RowChange | None]:
        """:meth:`mount` of each event, the mounter decoding them together."""
        if self.mounter is None:
            raise CdcflowError(
                f"changefeed {self.changefeed_id}: the source yields raw key-value events but gave no batch mounter"
            )
        matches = self.table_filter.matches
        decided: dict[int, tuple[TableName, bool]] = {}  # by the rows' table name object, mostly one per table
        out: list[RowChange | None] = []
        for row in self.mounter.mount_many(events):
            if row is None:
                out.append(None)
                continue
            table = row.table
            hit = decided.get(id(table))
            if hit is None or hit[0] is not table:
                hit = decided[id(table)] = (table, matches(table.schema, table.table))
            out.append(row if hit[1] else None)
        return out

    def rows(self, batches: Iterable[pa.RecordBatch]) -> Iterator[list[RowChange]]:
        """The rows of ``batches``, in their order, a list per record batch."""
        registry = self.lazy_registry()
        span_of = self.spans.__getitem__
        for batch in batches:
            if batch.num_rows and pc.all(pc.equal(batch.column("kind"), KIND_RAW)).as_py():
                yield [row for row in self.mount_many(raw_events(batch, span_of)) if row is not None]
                continue
            events = [event_from_record(record, span_of, registry) for record in batch_to_records(batch)]
            raw = [e for e in events if isinstance(e, RawKVEvent)]
            if not raw:
                yield [e for e in events if isinstance(e, RowChange)]
                continue
            mounted = iter(self.mount_many(raw))
            rows: list[RowChange] = []
            for e in events:
                row = next(mounted) if isinstance(e, RawKVEvent) else e
                if row is not None:
                    rows.append(row)
            yield rows

    def runs(self, batches: Iterable[pa.RecordBatch]) -> Iterator[list[RowChange] | InsertRun]:
        """:meth:`rows`, but a record batch of raw puts of one span at one commit ts (an
        initial snapshot's, as its parts hold them) that the mounter takes together comes
        as one :class:`~cdcflow.core.data.events.InsertRun` instead of a list of rows."""
        mounter = self.mounter
        for batch in batches:
            run = _insert_run(mounter, self.spans, batch) if mounter is not None else None
            if run is None:
                yield from self.rows((batch,))
            elif self.table_filter.matches(run.table.schema, run.table.table):
                yield run

    def mounted_records(self, batch: pa.RecordBatch) -> list[Record]:
        """The records of ``batch`` with every raw record mounted into a row record."""
        ids = _FrozenSchemaIds(self.schema_ids)
        records = list(batch_to_records(batch))
        raw: list[RawKVEvent] = []
        for record in records:
            if record[3] == KIND_RAW:
                event = event_from_record(record, self.spans.__getitem__, _NO_SCHEMAS)
                assert isinstance(event, RawKVEvent)
                raw.append(event)
        mounted = iter(self.mount_many(raw) if raw else ())
        out: list[Record] = []
        for record in records:
            if record[3] != KIND_RAW:
                out.append(record)
                continue
            row = next(mounted)
            if row is not None:
                out.append(record_from_event(row, record[4], ids))
        return out


def _insert_run(mounter: BatchMounter, spans: Mapping[int, Span], batch: pa.RecordBatch) -> InsertRun | None:
    """``batch`` mounted as one run when it holds raw puts only (no old values), all of
    one span and one commit and start ts, and the mounter takes them together."""
    if not batch.num_rows:
        return None
    column = batch.column
    for name in ("commit_ts", "start_ts", "span_id", "kind", "op"):
        bounds = pc.min_max(column(name))
        if column(name).null_count or bounds["min"] != bounds["max"]:
            return None
    old = column("old_value")
    if column("op")[0].as_py() != "put" or column("kind")[0].as_py() != KIND_RAW:
        return None
    if old.null_count != len(old) and pc.max(pc.binary_length(old)).as_py():
        return None
    span = spans.get(column("span_id")[0].as_py())
    if span is None:
        return None
    commit_ts, start_ts = column("commit_ts")[0].as_py(), column("start_ts")[0].as_py()
    return mounter.mount_inserts(span, column("key").to_pylist(), column("value").to_pylist(), commit_ts, start_ts)


class _LazyRegistry:
    """A task's view of the store's schema registry, loaded when first asked."""

    def __init__(self, plan: RowPlan) -> None:
        self._plan = plan
        self._registry: SchemaRegistry | None = None

    def get(self, schema_id: int) -> TableSchema | None:
        if self._registry is None:
            self._registry = self._plan.registry()
        return self._registry.get(schema_id)


class _NoSchemas:
    """Raw records carry no schema."""

    def get(self, schema_id: int) -> TableSchema | None:
        return None


_NO_SCHEMAS = _NoSchemas()


@dataclass(frozen=True)
class MountTask:
    """``mapInArrow`` function: raw records → row records (the event store's record schema)."""

    plan: RowPlan

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker_heap()
        try:
            with paused_collector():
                for batch in batches:
                    records = self.plan.mounted_records(batch)
                    if records:
                        yield records_to_batch(records)
        except CdcflowError as exc:
            yield records_to_batch([(0, 0, b"", ERROR_KIND, 0, 0, None, "", "", "", pickle.dumps(exc), b"", -1)])


@dataclass(frozen=True)
class RowsTask:
    """``mapInArrow`` function: raw records mounted (filtered, columns selected, transformed)
    and handed to ``function`` as lists of rows in the same Python pass, for
    ``BatchFrame.map_rows``: the rows are never encoded as records between."""

    plan: RowPlan
    column_selection: ColumnSelection
    function: RowsFunction

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.function(_prepared_rows(self.plan, self.column_selection, batches))


def pass_records(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function (a :class:`ChunkRangesTask`'s task): the records as read."""
    return batches


#: Record batches (row groups of a Parquet part) ``first`` up to ``stop`` (excluded) of one
#: file: ``(path, first, stop)``.
ChunkRange = tuple[str, int, int]


@dataclass(frozen=True)
class ChunkRangesTask:
    """``mapInArrow`` function over ``spark.range(n, numPartitions=n)``: the task of row
    ``i`` reads the record batches of ``shares[i]`` from the event store's chunk files
    (Arrow IPC; or an initial snapshot's part files, Parquet, by row group) and hands
    them to ``task`` (an :class:`EncodeTask`, say) as if Spark had read them.

    What it saves against the ``cdcflow`` data source's read: every record's trip
    through the JVM (the source's Python reader to Spark's rows, those rows to Arrow for
    the task's worker), and the Python worker that plans the read. The task reads the
    same files the source would, so it needs what the source needs: the store's
    directory readable where the task runs."""

    shares: tuple[tuple[ChunkRange, ...], ...]
    task: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
    #: The changefeed's table filter, as the streaming query's predicate applies it: row
    #: records of other tables are left out (raw records pass; they are filtered once
    #: mounted). None: every record, as a snapshot's frame reads its parts.
    table_filter: TableFilter | None = None
    #: Record columns (``table_id``, ``key``) by whose hash the shares split the records
    #: they read (:func:`record_shares`): share ``i`` keeps those hashed to ``i``, so shares
    #: that read the same files hold every record of a key (or of a table) in one task, as
    #: Spark's ``repartition`` by those columns would, without the shuffle. Empty: each
    #: share keeps every record it reads.
    hashed: tuple[str, ...] = ()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.task(self._records(batches))

    def _records(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for share in batch.column(0).to_pylist():
                yield from self.read(share)

    def read(self, share: int) -> Iterator[pa.RecordBatch]:
        """The records of ``shares[share]``, the table filter applied."""
        for path, first, stop in self.shares[share]:
            for read in read_record_batches(path, first, stop):
                records = read if self.table_filter is None else self._replicated(read)
                if self.hashed:
                    records = records.filter(pa.array(record_shares(records, self.hashed, len(self.shares)) == share))
                yield records

    def _replicated(self, records: pa.RecordBatch) -> pa.RecordBatch:
        kinds = records.column("kind")
        if pc.all(pc.equal(kinds, KIND_RAW)).as_py():
            return records  # a TiKV source's records: all raw
        assert self.table_filter is not None
        matches = self.table_filter.matches
        decided: dict[tuple[str | None, str | None], bool] = {}
        keep: list[bool] = []
        names = zip(records.column("schema_name").to_pylist(), records.column("table_name").to_pylist(), strict=True)
        for kind, name in zip(kinds.to_pylist(), names, strict=True):
            if kind == KIND_RAW:
                keep.append(True)
                continue
            kept = decided.get(name)
            if kept is None:
                schema, table = name
                kept = decided[name] = schema is not None and table is not None and matches(schema, table)
            keep.append(kept)
        return records.filter(pa.array(keep, pa.bool_()))


#: Multiplier of :func:`record_shares`' polynomial hash of bytes (the 64-bit FNV prime).
_HASH_PRIME = np.uint64(0x100000001B3)
#: Its powers ``_HASH_PRIME ** (i + 1)`` modulo 2 ** 64, as far as a key has needed them.
_hash_powers = np.cumprod(np.full(64, _HASH_PRIME, dtype=np.uint64), dtype=np.uint64)


def record_shares(records: pa.RecordBatch, columns: Sequence[str], shares: int) -> np.ndarray:
    """For each record, which of ``shares`` shares takes it: a 64-bit hash of its ``columns``
    (integers, or bytes: a polynomial over each value's bytes), mixed and taken modulo
    ``shares``. The same records give the same shares in every process (no seed), so tasks
    that read a batch apart split it alike; records equal in ``columns`` share a share."""
    hashed = np.zeros(records.num_rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name in columns:
            column = records.column(name)
            if pa.types.is_integer(column.type):
                values = column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64)
            else:
                values = _bytes_hashes(column)
            hashed = hashed * _HASH_PRIME + values
        # SplitMix64's finalizer: every bit of the sum reaches the low bits the modulo keeps.
        hashed ^= hashed >> np.uint64(30)
        hashed *= np.uint64(0xBF58476D1CE4E5B9)
        hashed ^= hashed >> np.uint64(27)
        hashed *= np.uint64(0x94D049BB133111EB)
        hashed ^= hashed >> np.uint64(31)
    return hashed % np.uint64(shares)


def _bytes_hashes(column: pa.Array) -> np.ndarray:
    """Each value's bytes ``b`` as ``sum(b[i] * P ** (i + 1)) + len(b)`` modulo 2 ** 64 (P:
    :data:`_HASH_PRIME`), nulls as empty, for the whole column at once."""
    global _hash_powers
    column = column.cast(pa.large_binary()).fill_null(b"")
    count = len(column)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)[column.offset : column.offset + count + 1]
    lengths = np.diff(offsets)
    hashes = lengths.astype(np.uint64)
    if not count or not lengths.any():
        return hashes
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]].astype(np.uint64)
    starts = offsets[:-1] - offsets[0]
    if lengths.max() > len(_hash_powers):
        _hash_powers = np.cumprod(np.full(int(lengths.max()), _HASH_PRIME, dtype=np.uint64), dtype=np.uint64)
    positions = np.arange(len(data)) - np.repeat(starts, lengths)
    filled = lengths > 0
    with np.errstate(over="ignore"):
        hashes[filled] += np.add.reduceat(data * _hash_powers[positions], starts[filled])
    return hashes


#: Records a :class:`SortedTask` or an :class:`OrderedRunsTask` hands on at a time.
_RUN_BATCH_ROWS = 8_192


@dataclass(frozen=True)
class SortedTask:
    """``mapInArrow`` function: hands ``task`` its partition's records in the micro-batch's
    order (:data:`~.query.ORDER_COLUMNS`), sorted in the task's worker, in record batches
    of at most 8,192 rows. For a partition small enough to hold at once (a bounded batch
    written by one task): it saves Spark's sort, and with :class:`ChunkRangesTask` in
    front, the records' trip through the JVM."""

    task: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        held = [batch for batch in batches if batch.num_rows]
        if held:
            held = pa.Table.from_batches(held).sort_by(list(ARROW_ORDER)).to_batches(max_chunksize=_RUN_BATCH_ROWS)
        return self.task(iter(held))


@dataclass(frozen=True)
class OrderedRunsTask:
    """``mapInArrow`` function over ``spark.range(n, numPartitions=n)``: the task of row
    ``i`` reads every record of the batch (``reader``'s one share: the batch's chunk files),
    sorts them in the batch's order (:data:`~.query.ARROW_ORDER`) in its worker, and hands
    ``task`` the ``i``-th of ``n`` runs of as many records each. Together the tasks hold
    the batch in order, partition after partition, as Spark's range sort would leave it,
    without the sort's sampling job and shuffle: each task reads the batch once and sorts
    it, which only pays for a batch that fits a worker's memory a few times over (a
    bounded batch of a catch-up)."""

    reader: ChunkRangesTask
    runs: int
    task: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.task(self._runs(batches))

    def _runs(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for run in batch.column(0).to_pylist():
                read = [records for records in self.reader.read(0) if records.num_rows]
                if not read:
                    continue
                records = pa.Table.from_batches(read)
                count = records.num_rows
                first, stop = run * count // self.runs, (run + 1) * count // self.runs
                if stop > first:
                    order = pc.sort_indices(records.select(list(ORDER_COLUMNS)), sort_keys=list(ARROW_ORDER))
                    yield from records.take(order[first:stop]).to_batches(max_chunksize=_RUN_BATCH_ROWS)


def check_mounted(batch: pa.RecordBatch) -> None:
    """Raise the error a MountTask returned in ``batch``, if any."""
    kinds = batch.column(3)
    if pc.any(pc.equal(kinds, ERROR_KIND)).as_py():
        for record in batch_to_records(batch):
            if record[3] == ERROR_KIND:
                raise pickle.loads(record[10])


def _no_span(span_id: int) -> Span:
    raise CdcflowError(f"a raw record of span {span_id} reached a sink unmounted")


@dataclass(frozen=True)
class RecordDecoder(RowDecoder):
    """Row records (as MountTask yields them) → rows, with the column selection applied."""

    #: The event store's schemas by id (a snapshot of its registry, shipped with tasks).
    schemas: Mapping[int, TableSchema]
    column_selection: ColumnSelection = field(default_factory=ColumnSelection)
    transforms: TransformChain = field(default_factory=TransformChain)

    def rows(self, batch: pa.RecordBatch) -> list[RowChange]:
        check_mounted(batch)
        rows: list[RowChange] = []
        for record in batch_to_records(batch):
            if record[3] != KIND_ROW:
                continue
            row = event_from_record(record, _no_span, self.schemas)
            assert isinstance(row, RowChange)
            rows.append(self.column_selection.apply(row) if self.column_selection else row)
        return self.transforms.apply(rows) if self.transforms else rows


def _task_partition() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def freeze_worker_heap() -> None:
    """In a Spark task's Python worker: move what the worker holds as the task starts
    (PySpark's, pyarrow's and cdcflow's modules, classes and caches; the garbage of
    earlier tasks collected first) out of the cyclic collector's reach (``gc.freeze``).

    A task makes row objects by the thousand, and their allocations set off the
    collector's full passes, each of which walked every object the worker holds: a
    third of the CPU of mounting rows into the Spark sink's columns in a process with
    those modules imported (rows per CPU-second 46K, 64K frozen). Frozen objects are
    still freed when their last reference goes; only a cycle among them that later
    becomes garbage is not, and what is frozen is what a worker keeps between tasks.
    Outside a Spark task (a test, a benchmark calling a task in its own process) it
    does nothing: a driver's heap is not frozen."""
    from pyspark import TaskContext

    if TaskContext.get() is None or not gc.isenabled():
        return
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def paused_collector() -> Iterator[None]:
    """In a Spark task's Python worker: the cyclic collector off while the task makes its
    rows (re-enabled after; nested pauses leave it to the outermost).

    A task allocates a few container objects per row (a run's images, their encoded
    parts), none of them in a cycle: they are freed when their last reference goes, yet
    their allocations start a young-generation collection every 700, which walks the
    parts a run still holds and promotes them: 6 % of a snapshot delivery task's CPU
    with the worker's heap frozen (:func:`freeze_worker_heap`). What a task leaves in a
    cycle is collected once the collector runs again. Outside a Spark task, or with the
    collector off already, it changes nothing."""
    from pyspark import TaskContext

    if TaskContext.get() is None or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Measured:
    """The record batches of a task's input, their Arrow size counted (per batch, not per row)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self.bytes = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self._batches:
            self.bytes += batch.nbytes
            yield batch


def _prepared_rows(
    plan: RowPlan, column_selection: ColumnSelection, batches: Iterable[pa.RecordBatch]
) -> Iterator[list[RowChange]]:
    """The rows the sinks get of ``batches``: mounted, filtered, columns selected, transformed."""
    freeze_worker_heap()
    with paused_collector():
        for mounted in plan.rows(batches):
            rows = [column_selection.apply(r) for r in mounted] if column_selection else mounted
            if plan.transforms:
                rows = plan.transforms.apply(rows)
            if rows:
                yield rows


def _prepared_runs(
    plan: RowPlan, column_selection: ColumnSelection, batches: Iterable[pa.RecordBatch]
) -> Iterator[list[RowChange] | InsertRun]:
    """:func:`_prepared_rows`, with :meth:`RowPlan.runs` where rows are handed on as mounted
    (no column selection, no transforms: a run is its rows unchanged)."""
    if column_selection or plan.transforms:
        return _prepared_rows(plan, column_selection, batches)
    return _mounted_runs(plan, batches)


def _mounted_runs(plan: RowPlan, batches: Iterable[pa.RecordBatch]) -> Iterator[list[RowChange] | InsertRun]:
    freeze_worker_heap()
    with paused_collector():
        yield from (run for run in plan.runs(batches) if len(run))


def _summary(partition: int, rows: int, started: float, error: bytes, nbytes: int) -> dict[str, object]:
    return {
        "partition": partition,
        "rows": rows,
        "pid": os.getpid(),
        "started": started,
        "finished": time.time(),
        "error": error,
        "bytes": nbytes,
    }


@dataclass(frozen=True)
class WriteTask:
    """``mapInArrow`` function: one partition's records → rows → every sink's partition writer."""

    plan: RowPlan
    #: The batch's head: changefeed id, batch id and ts range (no rows, no DDL).
    head: MicroBatch
    writers: tuple[TaskWriter, ...]
    column_selection: ColumnSelection

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _task_partition()
        started = time.time()
        count, error = 0, b""
        measured = _Measured(batches)
        opened: list[PartitionWriter] = []
        try:
            for rows in _prepared_runs(self.plan, self.column_selection, measured):
                if not opened:
                    opened = [writer.open(self.head, partition) for writer in self.writers]
                for i in range(0, len(rows), _WRITE_ROWS):
                    if isinstance(rows, InsertRun):
                        run = rows.slice(i, i + _WRITE_ROWS)
                        for writer in opened:
                            writer.write_inserts(run)
                        continue
                    chunk = rows[i : i + _WRITE_ROWS]
                    for writer in opened:
                        writer.write(chunk)
                count += len(rows)
            for writer in opened:
                writer.flush()
        except CdcflowError as exc:
            error = pickle.dumps(exc)
        finally:
            for writer in opened:
                with contextlib.suppress(Exception):
                    writer.close()
        yield pa.RecordBatch.from_pylist(
            [_summary(partition, count, started, error, measured.bytes)], schema=SUMMARY_SCHEMA
        )


#: What an :class:`EncodeTask` yields and a :class:`LaneTask` reads: one record per part
#: (``writer``: the index of its task writer; its row's order and the part's rank among
#: its row's parts), and one per encoding task (``writer`` -1) carrying its summary.
ENCODED_SCHEMA = pa.schema(
    [
        ("writer", pa.int32()),
        ("route", pa.string()),
        ("lane", pa.int32()),
        ("commit_ts", pa.int64()),
        ("start_ts", pa.int64()),
        ("key", pa.binary()),
        ("seq", pa.int32()),
        ("part_key", pa.binary()),
        ("part_value", pa.binary()),
        ("summary", pa.binary()),
    ]
)
ENCODED_SCHEMA_DDL = (
    "writer INT, route STRING, lane INT, commit_ts BIGINT, start_ts BIGINT, key BINARY, seq INT,"
    " part_key BINARY, part_value BINARY, summary BINARY"
)
#: The order a lane task gets its parts in: commit order across its lanes, which is each
#: lane's order (a lane's parts are a subsequence). Commit ts first, so that Spark's sort
#: settles almost every comparison on its 8-byte prefix, not on the whole row.
LANE_ORDER = ("commit_ts", "start_ts", "key", "seq")
#: What a LaneTask reads of each part.
_LANE_COLUMNS = ("writer", "route", "lane", "commit_ts", "part_key", "part_value", "summary")
#: The parts an EncodeTask hands Spark at a time.
_ENCODED_ROWS = 8_192
#: The parts an EncodeTask holds before it writes them as runs (:class:`LaneHandOff`).
_RUN_PARTS = 65_536


def _add_parts(
    columns: list[list[object]],
    writer: int,
    rows: Sequence[RowChange],
    parts: list[tuple[int, str, int, EncodedMessage]],
) -> None:
    """Append ``parts`` (of writer ``writer``) to the columns of :data:`ENCODED_SCHEMA`."""
    index = [p[0] for p in parts]
    if len(parts) == len(rows):
        seq = [0] * len(parts)  # one part per row
    else:
        seen: dict[int, int] = {}
        seq = []
        for i in index:
            seq.append(seen.setdefault(i, -1) + 1)
            seen[i] += 1
    columns[0] += [writer] * len(parts)
    columns[1] += [p[1] for p in parts]
    columns[2] += [p[2] for p in parts]
    columns[3] += [rows[i].commit_ts for i in index]
    columns[4] += [rows[i].start_ts for i in index]
    columns[5] += [rows[i].key for i in index]
    columns[6] += seq
    columns[7] += [p[3].key for p in parts]
    columns[8] += [p[3].value for p in parts]
    columns[9] += [None] * len(parts)


@dataclass(frozen=True)
class LaneHandOff:
    """Where the encoding tasks of a batch leave their parts for the lane tasks, when
    every task can read the event store's directory (as a batch read apart needs): a
    directory per lane holding runs — Arrow IPC files of :data:`ENCODED_SCHEMA`, each
    sorted by :data:`LANE_ORDER` — named by the encoding task's partition and the run's
    number. A retried encoding task writes the same runs again, each file replaced
    whole. The parts skip Spark's shuffle (the JVM neither converts, writes, reads nor
    sorts them), and the driver, seeing every lane's size before any is written, gives
    the lane tasks even shares of them (:meth:`assign`), which hashing lanes to tasks
    does not: two busy lanes land on one task as often as not."""

    directory: str

    def lane_dir(self, writer: int, route: str, lane: int) -> Path:
        digest = hashlib.blake2b(route.encode(), digest_size=12).hexdigest()
        return Path(self.directory) / f"{writer}-{lane}-{digest}"

    def write_runs(self, columns: list[list[object]], partition: int, run: int) -> None:
        """Write ``columns`` (parts, any order) as one sorted run per lane."""
        numbers: dict[tuple[int, str, int], int] = {}
        of: list[int] = []
        lanes = zip(cast(list[int], columns[0]), cast(list[str], columns[1]), cast(list[int], columns[2]), strict=True)
        for lane in lanes:
            number = numbers.get(lane)
            if number is None:
                number = numbers[lane] = len(numbers)
            of.append(number)
        arrays = [pa.array(c, t.type) for c, t in zip(columns, ENCODED_SCHEMA, strict=True)]
        table = pa.Table.from_arrays([*arrays, pa.array(of, pa.int32())], names=[*ENCODED_SCHEMA.names, "_lane"])
        ordered = table.sort_by([("_lane", "ascending"), *((c, "ascending") for c in LANE_ORDER)]).drop_columns("_lane")
        start = 0
        counts = Counter(of)
        for lane, number in numbers.items():  # numbered in order of appearance: sorted alike
            count = counts[number]
            path = self.lane_dir(*lane) / f"{partition:05d}-{run:05d}.arrow"
            path.parent.mkdir(parents=True, exist_ok=True)
            written = path.with_suffix(".tmp")
            with pa.OSFile(str(written), "wb") as sink, pa.ipc.new_file(sink, ENCODED_SCHEMA) as out:
                out.write_table(ordered.slice(start, count), max_chunksize=_ENCODED_ROWS)
            os.replace(written, path)
            start += count

    def assign(self, tasks: int) -> tuple[tuple[str, ...], ...]:
        """The lanes (their directories' names) of each of at most ``tasks`` lane tasks:
        the largest lane first, each to the task with the fewest bytes so far."""
        sizes = {
            lane.name: sum(run.stat().st_size for run in lane.glob("*.arrow"))
            for lane in Path(self.directory).iterdir()
            if lane.is_dir()
        }
        return tuple(tuple(names) for _, names in deal_largest_first(sizes, tasks))

    def parts(self, lanes: Sequence[str]) -> Iterator[tuple[int, int, bytes, int, int, str, int, bytes, bytes]]:
        """The parts of ``lanes`` (as :meth:`assign` names them), lane after lane, each
        lane's runs merged into :data:`LANE_ORDER`: ``(commit_ts, start_ts, key, seq,
        writer, route, lane, part_key, part_value)``. One lane's runs are open at a time."""
        for lane in lanes:
            runs = sorted((Path(self.directory) / lane).glob("*.arrow"))
            # On the order alone: parts of rows without a key tie on it (their run's order
            # stands, as Arrow's stable sort left it), and a part's key may be None.
            yield from heapq.merge(*(_run_parts(run) for run in runs), key=_LANE_ORDER_OF_PART)


#: A merged part's place in :data:`LANE_ORDER`.
_LANE_ORDER_OF_PART = operator.itemgetter(0, 1, 2, 3)


def _run_parts(path: Path) -> Iterator[tuple[int, int, bytes, int, int, str, int, bytes, bytes]]:
    with pa.memory_map(str(path)) as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            yield from zip(
                *(
                    batch.column(name).to_pylist()
                    for name in (
                        "commit_ts",
                        "start_ts",
                        "key",
                        "seq",
                        "writer",
                        "route",
                        "lane",
                        "part_key",
                        "part_value",
                    )
                ),
                strict=True,
            )


@dataclass(frozen=True)
class EncodeTask:
    """``mapInArrow`` function, first step of a batch written per lane: one partition's
    records → rows → every :class:`~cdcflow.core.data.sink.LaneTaskWriter`'s parts,
    yielded for Spark to shuffle to the lane tasks or, with ``hand_off``, left in its
    runs (then the task yields its summary alone)."""

    plan: RowPlan
    writers: tuple[LaneTaskWriter, ...]
    column_selection: ColumnSelection
    hand_off: LaneHandOff | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _task_partition()
        started = time.time()
        count, error, runs = 0, b"", 0
        measured = _Measured(batches)
        columns: list[list[object]] = [[] for _ in ENCODED_SCHEMA]
        held = _RUN_PARTS if self.hand_off is not None else _ENCODED_ROWS
        try:
            for rows in _prepared_rows(self.plan, self.column_selection, measured):
                count += len(rows)
                for w, writer in enumerate(self.writers):
                    _add_parts(columns, w, rows, writer.encode(rows))
                if len(columns[0]) >= held:
                    if self.hand_off is not None:
                        self.hand_off.write_runs(columns, partition, runs)
                        runs += 1
                    else:
                        yield pa.RecordBatch.from_arrays(columns, schema=ENCODED_SCHEMA)
                    columns = [[] for _ in ENCODED_SCHEMA]
            if self.hand_off is not None and columns[0]:
                self.hand_off.write_runs(columns, partition, runs)
        except CdcflowError as exc:
            error = pickle.dumps(exc)
        if self.hand_off is not None:
            columns = [[] for _ in ENCODED_SCHEMA]  # its parts are in runs, or (an error) unwritten
        summary = pickle.dumps(_summary(partition, count, started, error, measured.bytes))
        first = (-1, "", partition, 0, 0, b"", 0, None, b"", summary)
        for column, value in zip(columns, first, strict=True):
            column.append(value)
        yield pa.RecordBatch.from_arrays(columns, schema=ENCODED_SCHEMA)


class _LaneWrites:
    """A lane task's parts, gathered per lane and written through each writer's
    :class:`~cdcflow.core.data.sink.LaneWriter` in calls of :data:`_WRITE_ROWS` parts
    (a lane's last call: what is left), a lane's parts in the order they were added."""

    def __init__(self, head: MicroBatch, writers: tuple[LaneTaskWriter, ...], partition: int) -> None:
        self._head = head
        self._writers = writers
        self._partition = partition
        self.opened: dict[int, LaneWriter] = {}
        self._pending: dict[tuple[int, str, int], list[EncodedMessage]] = {}

    def add(self, w: int, route: str, n: int, ts: int, key: bytes | None, value: bytes) -> None:
        lane = (w, route, n)
        parts = self._pending.get(lane)
        if parts is None:
            parts = self._pending[lane] = []
        parts.append(make_encoded_message(key, value, None, 1, ts))
        if len(parts) >= _WRITE_ROWS:
            self._write(lane, parts)
            self._pending[lane] = []

    def flush(self) -> None:
        for lane, parts in self._pending.items():
            if parts:
                self._write(lane, parts)
        self._pending.clear()
        for writer in self.opened.values():
            writer.flush()

    def close(self) -> None:
        for writer in self.opened.values():
            with contextlib.suppress(Exception):
                writer.close()

    def _write(self, lane: tuple[int, str, int], parts: list[EncodedMessage]) -> None:
        writer = self.opened.get(lane[0])
        if writer is None:
            writer = self.opened[lane[0]] = self._writers[lane[0]].open_lanes(self._head, self._partition)
        writer.write(lane[1], lane[2], parts)


def _write_lane_parts(
    head: MicroBatch,
    writers: tuple[LaneTaskWriter, ...],
    partition: int,
    parts: Iterable[tuple[int, str, int, int, bytes | None, bytes]],
) -> bytes:
    """Write ``parts`` — ``(writer, route, lane, commit_ts, key, value)``, each lane's in
    its order — per lane (:class:`_LaneWrites`) and flush them: the pickled CdcflowError
    it stopped on, or ``b""``."""
    writes = _LaneWrites(head, writers, partition)
    try:
        for w, route, n, ts, key, value in parts:
            writes.add(w, route, n, ts, key, value)
        writes.flush()
    except CdcflowError as exc:
        return pickle.dumps(exc)
    finally:
        writes.close()
    return b""


@dataclass(frozen=True)
class LaneTask:
    """``mapInArrow`` function, second step of a batch written per lane: one partition's
    parts, sorted by :data:`LANE_ORDER`, written per lane; yields the encoding tasks'
    summaries that reached it and its own (no rows: they are counted where they were
    encoded)."""

    head: MicroBatch
    writers: tuple[LaneTaskWriter, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _task_partition()
        started = time.time()
        summaries: list[dict[str, object]] = []

        def parts() -> Iterator[tuple[int, str, int, int, bytes | None, bytes]]:
            for batch in batches:
                data = [batch.column(name).to_pylist() for name in _LANE_COLUMNS]
                for w, route, n, ts, key, value, summary in zip(*data, strict=True):
                    if w < 0:
                        summaries.append(pickle.loads(summary))
                    else:
                        yield w, route, n, ts, key, value

        error = _write_lane_parts(self.head, self.writers, partition, parts())
        # Its own partition numbers follow the encoding tasks' (an error of theirs is raised first).
        own = _summary(partition + 1_000_000, 0, started, error, 0)
        yield pa.RecordBatch.from_pylist([*summaries, own], schema=SUMMARY_SCHEMA)


@dataclass(frozen=True)
class LaneRunsTask:
    """``mapInArrow`` function over ``spark.range(n, numPartitions=n)``, second step of a
    batch whose encoding tasks left their parts in a :class:`LaneHandOff`: the task of
    row ``i`` writes the lanes ``shares[i]``, one after another, each lane's runs merged
    into :data:`LANE_ORDER`; yields its summary."""

    hand_off: LaneHandOff
    shares: tuple[tuple[str, ...], ...]
    head: MicroBatch
    writers: tuple[LaneTaskWriter, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _task_partition()
        started = time.time()

        def parts() -> Iterator[tuple[int, str, int, int, bytes | None, bytes]]:
            for batch in batches:
                for share in batch.column(0).to_pylist():
                    for ts, _, _, _, w, route, n, key, value in self.hand_off.parts(self.shares[share]):
                        yield w, route, n, ts, key, value

        error = _write_lane_parts(self.head, self.writers, partition, parts())
        yield pa.RecordBatch.from_pylist([_summary(partition + 1_000_000, 0, started, error, 0)], schema=SUMMARY_SCHEMA)
