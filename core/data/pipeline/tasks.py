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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.core.data.events import MicroBatch, RawKVEvent, RowChange, Span, TableSchema
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice.records import (
    KIND_RAW,
    KIND_ROW,
    Record,
    SchemaRegistry,
    batch_to_records,
    event_from_record,
    record_from_event,
    records_to_batch,
)
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.sink import PartitionWriter, RowDecoder, TaskWriter
from cdcflow.core.data.source import BatchMounter
from cdcflow.core.data.transform import TransformChain
from cdcflow.core.errors import CdcflowError

__all__ = [
    "ERROR_KIND",
    "SUMMARY_SCHEMA",
    "SUMMARY_SCHEMA_DDL",
    "MountTask",
    "RecordDecoder",
    "RowPlan",
    "TaskSummary",
    "WriteTask",
    "check_mounted",
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


@dataclass(frozen=True)
class WriteTask:
    """``mapInArrow`` function: one partition's records → rows → every sink's partition writer."""

    plan: RowPlan
    #: The batch's head: changefeed id, batch id and ts range (no rows, no DDL).
    head: MicroBatch
    writers: tuple[TaskWriter, ...]
    column_selection: ColumnSelection

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        started = time.time()
        count, error = 0, b""
        size = [0]

        def measured(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                size[0] += batch.nbytes  # per Arrow batch, not per row
                yield batch

        opened: list[PartitionWriter] = []
        try:
            for mounted in self.plan.rows(measured(batches)):
                rows = [self.column_selection.apply(r) for r in mounted] if self.column_selection else mounted
                if self.plan.transforms:
                    rows = self.plan.transforms.apply(rows)
                if not rows:
                    continue
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
            [
                {
                    "partition": partition,
                    "rows": count,
                    "pid": os.getpid(),
                    "started": started,
                    "finished": time.time(),
                    "error": error,
                    "bytes": size[0],
                }
            ],
            schema=SUMMARY_SCHEMA,
        )
