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
batch whose first step needs no shuffle of its input).

A :class:`~cdcflow.core.errors.CdcflowError` raised in a task (a row that
does not decode, a downstream that cannot be reached) is returned to the
driver pickled, whole, instead of failing the Spark job: the driver raises
it again, so it reaches the changefeed's state with its code, not as a
Spark stack trace. Anything else fails the task, which Spark may retry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.core.data.codec import EncodedMessage
from cdcflow.core.data.events import MicroBatch, RawKVEvent, RowChange, Span, TableSchema
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice.records import (
    KIND_RAW,
    KIND_ROW,
    Record,
    SchemaRegistry,
    batch_to_records,
    event_from_record,
    read_record_batches,
    record_from_event,
    records_to_batch,
)
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.sink import LaneTaskWriter, LaneWriter, PartitionWriter, RowDecoder, TaskWriter
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
    "LaneTask",
    "MountTask",
    "RecordDecoder",
    "RowPlan",
    "TaskSummary",
    "WriteTask",
    "check_mounted",
    "pass_records",
    "raise_task_error",
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
        return [
            row if row is not None and matches(row.table.schema, row.table.table) else None
            for row in self.mounter.mount_many(events)
        ]

    def rows(self, batches: Iterable[pa.RecordBatch]) -> Iterator[list[RowChange]]:
        """The rows of ``batches``, in their order, a list per record batch."""
        registry = self.lazy_registry()
        span_of = self.spans.__getitem__
        for batch in batches:
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
        try:
            for batch in batches:
                records = self.plan.mounted_records(batch)
                if records:
                    yield records_to_batch(records)
        except CdcflowError as exc:
            yield records_to_batch([(0, 0, b"", ERROR_KIND, 0, 0, None, "", "", "", pickle.dumps(exc), b"", -1)])


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

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.task(self._records(batches))

    def _records(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for share in batch.column(0).to_pylist():
                for path, first, stop in self.shares[share]:
                    for records in read_record_batches(path, first, stop):
                        yield records if self.table_filter is None else self._replicated(records)

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
    for mounted in plan.rows(batches):
        rows = [column_selection.apply(r) for r in mounted] if column_selection else mounted
        if plan.transforms:
            rows = plan.transforms.apply(rows)
        if rows:
            yield rows


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
            for rows in _prepared_rows(self.plan, self.column_selection, measured):
                if not opened:
                    opened = [writer.open(self.head, partition) for writer in self.writers]
                for i in range(0, len(rows), _WRITE_ROWS):
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
#: The order a lane's parts are written in.
LANE_ORDER = ("writer", "route", "lane", "commit_ts", "start_ts", "key", "seq")
#: What a LaneTask reads of each part.
_LANE_COLUMNS = ("writer", "route", "lane", "commit_ts", "part_key", "part_value", "summary")
#: The parts an EncodeTask hands Spark at a time.
_ENCODED_ROWS = 8_192


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
class EncodeTask:
    """``mapInArrow`` function, first step of a batch written per lane: one partition's
    records → rows → every :class:`~cdcflow.core.data.sink.LaneTaskWriter`'s parts."""

    plan: RowPlan
    writers: tuple[LaneTaskWriter, ...]
    column_selection: ColumnSelection

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _task_partition()
        started = time.time()
        count, error = 0, b""
        measured = _Measured(batches)
        columns: list[list[object]] = [[] for _ in ENCODED_SCHEMA]
        try:
            for rows in _prepared_rows(self.plan, self.column_selection, measured):
                count += len(rows)
                for w, writer in enumerate(self.writers):
                    _add_parts(columns, w, rows, writer.encode(rows))
                if len(columns[0]) >= _ENCODED_ROWS:
                    yield pa.RecordBatch.from_arrays(columns, schema=ENCODED_SCHEMA)
                    columns = [[] for _ in ENCODED_SCHEMA]
        except CdcflowError as exc:
            error = pickle.dumps(exc)
        summary = pickle.dumps(_summary(partition, count, started, error, measured.bytes))
        first = (-1, "", partition, 0, 0, b"", 0, None, b"", summary)
        for column, value in zip(columns, first, strict=True):
            column.append(value)
        yield pa.RecordBatch.from_arrays(columns, schema=ENCODED_SCHEMA)


@dataclass(frozen=True)
class LaneTask:
    """``mapInArrow`` function, second step of a batch written per lane: one partition's
    parts, sorted by :data:`LANE_ORDER`, written lane by lane through each writer's
    :class:`~cdcflow.core.data.sink.LaneWriter`; yields the encoding tasks' summaries
    that reached it and its own (no rows: they are counted where they were encoded)."""

    head: MicroBatch
    writers: tuple[LaneTaskWriter, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _task_partition()
        started = time.time()
        error = b""
        summaries: list[dict[str, object]] = []
        opened: dict[int, LaneWriter] = {}
        measured = _Measured(batches)
        lane: tuple[int, str, int] | None = None
        parts: list[EncodedMessage] = []

        def write() -> None:
            if lane is not None and parts:
                writer = opened.get(lane[0])
                if writer is None:
                    writer = opened[lane[0]] = self.writers[lane[0]].open_lanes(self.head, partition)
                writer.write(lane[1], lane[2], parts)

        try:
            for batch in measured:
                data = {name: batch.column(name).to_pylist() for name in _LANE_COLUMNS}
                for w, route, n, ts, key, value, summary in zip(
                    data["writer"],
                    data["route"],
                    data["lane"],
                    data["commit_ts"],
                    data["part_key"],
                    data["part_value"],
                    data["summary"],
                    strict=True,
                ):
                    if w < 0:
                        summaries.append(pickle.loads(summary))
                        continue
                    if lane != (w, route, n) or len(parts) >= _WRITE_ROWS:
                        write()
                        lane, parts = (w, route, n), []
                    parts.append(EncodedMessage(key, value, None, 1, ts))
            write()
            for writer in opened.values():
                writer.flush()
        except CdcflowError as exc:
            error = pickle.dumps(exc)
        finally:
            for writer in opened.values():
                with contextlib.suppress(Exception):
                    writer.close()
        # Its own partition numbers follow the encoding tasks' (an error of theirs is raised first).
        own = _summary(partition + 1_000_000, 0, started, error, 0)
        yield pa.RecordBatch.from_pylist([*summaries, own], schema=SUMMARY_SCHEMA)
