"""Sorted runs: a span's events spilled to disk when the memory quota is full.

A run is an Arrow IPC file of records sorted by ``(commit_ts, start_ts, key)``.
Publishing a resolved chunk consumes a prefix of every run of the span (the
records at or below the cut); a run remembers how many rows it has handed out,
so the next cut resumes where the last one stopped, and the file is deleted
once every row is consumed. Runs hold unresolved data only: they are not
needed after a restart (the source feeds the span again from its resolved ts).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from cdcflow.core.data.logservice.records import Record, batch_to_records, read_record_batches

__all__ = ["SpillRun"]


@dataclass
class SpillRun:
    """One spilled, sorted run of a span's events."""

    path: Path
    rows: int
    size: int
    #: Rows already handed out to chunks (a prefix of the run).
    consumed: int = 0
    #: commit ts of the first row not yet consumed.
    head_ts: int = 0

    @property
    def exhausted(self) -> bool:
        return self.consumed >= self.rows

    def take_until(self, cut_ts: int) -> Iterator[Record]:
        """The unconsumed records with ``commit_ts <= cut_ts``, in order; consumes them.

        Records are counted as consumed as they are yielded, so the caller must
        exhaust the iterator (it writes every yielded record to a chunk).
        """
        if self.exhausted or self.head_ts > cut_ts:
            return
        skip = self.consumed
        for batch in read_record_batches(self.path):
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            for n, record in enumerate(batch_to_records(batch)):
                if n < skip:
                    continue
                if record[0] > cut_ts:
                    self.head_ts = record[0]
                    return
                self.consumed += 1
                yield record
            skip = 0

    def commit_ts_between(self, lo: int, hi: int) -> np.ndarray:
        """The commit timestamps in ``(lo, hi]`` of the unconsumed records (for sizing cuts)."""
        if self.exhausted or self.head_ts > hi:
            return np.empty(0, dtype=np.int64)
        with pa.memory_map(str(self.path)) as source:
            reader = pa.ipc.open_file(source)
            column = pa.concat_arrays([reader.get_batch(i).column(0) for i in range(reader.num_record_batches)])
        ts = column.to_numpy(zero_copy_only=False)[self.consumed :]
        selected: np.ndarray = ts[(ts > lo) & (ts <= hi)]
        return selected

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
