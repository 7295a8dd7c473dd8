"""Spark tasks that wait for a gate file, so that a test holds a Spark job running for as
long as it needs, then lets it end: a list source whose initial-snapshot parts wait
(:class:`GatedSnapshotSource`), and a sink whose partition writers wait before they flush
(:class:`GatedTaskSink`).

Imported by Spark's Python workers (the tasks are unpickled there), so it lives in a module
of its own rather than in a test module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from cdcflow.core.data.events import MicroBatch, RowChange, Span, TableName
from cdcflow.core.data.logservice.records import record_from_event, records_to_batch
from cdcflow.core.data.sink import PartitionWriter, TaskWriter
from cdcflow.core.data.source import SnapshotPlan, SnapshotTask
from cdcflow.core.errors import CdcflowError
from cdcflow.core.testing import ListSink, ListSource

#: Seconds a part waits for its gate before it fails (a hang guard).
GATE_TIMEOUT = 120.0


class _NoSchemas:
    def id_of(self, schema: object) -> int:
        return -1


@dataclass(frozen=True)
class GatedPart(SnapshotTask):
    """Part ``part`` of a snapshot: marks ``started-<part>`` in ``gate_dir``, waits for
    ``gate_dir/open``, then yields its rows as of ``ts``."""

    gate_dir: str
    part: int
    ts: int
    rows: tuple[RowChange, ...]

    def read(self) -> Iterator[pa.RecordBatch]:
        _wait_at_gate(Path(self.gate_dir), f"started-{self.part}")
        records = [record_from_event(_at(row, self.ts), 0, _NoSchemas()) for row in self.rows]
        if records:
            yield records_to_batch(records)


def _at(row: RowChange, ts: int) -> RowChange:
    return RowChange(row.table, row.op, ts, ts, row.after, row.before, row.schema, row.key)


class GatedSnapshotSource(ListSource):
    """A :class:`ListSource` that plans a snapshot of its row changes in ``parts`` gated parts."""

    gate_dir: Path
    parts: int = 2

    async def snapshot_plan(self, spans: Mapping[int, Span], ts: int) -> SnapshotPlan:
        rows = [e for e in self.events if isinstance(e, RowChange) and e.commit_ts <= ts]
        slices = [tuple(rows[i :: self.parts]) for i in range(self.parts)]
        return SnapshotPlan(ts, [GatedPart(str(self.gate_dir), i, ts, part) for i, part in enumerate(slices)])


def _wait_at_gate(gate: Path, marker: str) -> None:
    """Leave ``marker`` in ``gate``, then wait until ``gate/open`` exists."""
    (gate / marker).touch()
    deadline = time.monotonic() + GATE_TIMEOUT
    while not (gate / "open").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate {gate / 'open'} was not opened")
        time.sleep(0.05)


@dataclass(frozen=True)
class _GatedTaskWriter(TaskWriter):
    gate_dir: str

    def open(self, batch: MicroBatch, partition: int) -> PartitionWriter:
        return _GatedPartition(Path(self.gate_dir), batch.batch_id, partition)


class _GatedPartition(PartitionWriter):
    def __init__(self, gate: Path, batch_id: int, partition: int) -> None:
        self.gate, self.batch_id, self.partition = gate, batch_id, partition
        self.ids: list[int] = []

    def write(self, rows: list[RowChange]) -> None:  # type: ignore[override]
        self.ids.extend(int(row.image()["id"]) for row in rows)

    def flush(self) -> None:
        _wait_at_gate(self.gate, f"started-{self.batch_id}-{self.partition}")
        if (self.gate / "fail").exists():
            raise CdcflowError(f"gated sink: batch {self.batch_id} fails as {self.gate / 'fail'} asks")
        with (self.gate / f"rows-{self.batch_id}-{self.partition}").open("a") as out:
            out.write("".join(f"{i}\n" for i in self.ids))


class GatedTaskSink(ListSink):
    """Writes each partition of a batch in its Spark task, which waits at the gate
    ``gate_dir/open`` before it flushes: ``gate_dir/rows-<batch>-<partition>`` gets the
    ids of the rows (every attempt appends), ``gate_dir/committed`` the batches committed.
    With ``gate_dir/fail``, every partition fails instead (a CdcflowError, not retried)."""

    gate_dir: Path

    def task_writer(self, tables: list[TableName]) -> TaskWriter:  # type: ignore[override]
        return _GatedTaskWriter(str(self.gate_dir))

    def commit_batch(self, batch: MicroBatch) -> None:
        with (self.gate_dir / "committed").open("a") as out:
            out.write(f"{batch.batch_id}\n")
