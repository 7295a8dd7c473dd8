"""A list source whose initial-snapshot parts are read in Spark tasks that wait for a gate
file: a test holds a snapshot's Spark job running for as long as it needs, then lets it end.

Imported by Spark's Python workers (the tasks are unpickled there), so it lives in a module
of its own rather than in a test module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from cdcflow.core.data.events import RowChange, Span
from cdcflow.core.data.logservice.records import record_from_event, records_to_batch
from cdcflow.core.data.source import SnapshotPlan, SnapshotTask
from cdcflow.core.testing import ListSource

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
        gate = Path(self.gate_dir)
        (gate / f"started-{self.part}").touch()
        deadline = time.monotonic() + GATE_TIMEOUT
        while not (gate / "open").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {gate / 'open'} was not opened")
            time.sleep(0.05)
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
