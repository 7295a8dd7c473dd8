"""Hands one micro-batch to a changefeed's sinks: in parts to sinks that accept
them (bounded memory), whole to the others."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from cdcflow.core.data.events import DDLEvent, MicroBatch, RowChange
from cdcflow.core.data.sink import Sink

__all__ = ["DEFAULT_PART_ROWS", "BatchDelivery"]

#: Rows per part for sinks that accept partial batches.
DEFAULT_PART_ROWS = 16_384


class BatchDelivery:
    """Collects the rows of one batch, in order, and writes them to every sink.

    Sinks that accept partial batches get a part each time ``part_rows`` rows
    are collected, and the last part (with the DDL) from :meth:`finish`; the
    other sinks get the whole batch from :meth:`finish`. Memory stays bounded
    by ``part_rows`` only when every sink accepts parts.
    """

    def __init__(
        self,
        changefeed_id: str,
        batch_id: int,
        start_ts: int,
        end_ts: int,
        ddl: Sequence[DDLEvent],
        sinks: Sequence[Sink[Any]],
        part_rows: int = DEFAULT_PART_ROWS,
    ) -> None:
        self._head = (changefeed_id, batch_id, start_ts, end_ts)
        self._ddl = tuple(ddl)
        self._part_sinks = [s for s in sinks if s.accepts_partial_batches]
        self._whole_sinks = [s for s in sinks if not s.accepts_partial_batches]
        self._part_rows = max(1, part_rows)
        self._pending: list[RowChange] = []
        self._whole: list[RowChange] = []
        self._part = 0
        self.row_count = 0
        #: Seconds spent in write_batch so far, per sink type.
        self.sink_seconds: dict[str, float] = {}

    def add(self, rows: Iterable[RowChange]) -> None:
        rows = list(rows)
        self.row_count += len(rows)
        if self._whole_sinks:
            self._whole.extend(rows)
        if not self._part_sinks:
            return
        self._pending.extend(rows)
        while len(self._pending) >= self._part_rows:
            part, self._pending = self._pending[: self._part_rows], self._pending[self._part_rows :]
            self._write(self._part_sinks, self._batch(part, (), last=False))
            self._part += 1

    def finish(self) -> None:
        """Write the last part and the whole batches; every sink has flushed when this returns."""
        if self._part_sinks:
            self._write(self._part_sinks, self._batch(self._pending, self._ddl, last=True))
        if self._whole_sinks:
            whole = MicroBatch(*self._head, rows=tuple(self._whole), ddl=self._ddl)
            self._write(self._whole_sinks, whole)
        self._pending, self._whole = [], []

    def _batch(self, rows: list[RowChange], ddl: tuple[DDLEvent, ...], *, last: bool) -> MicroBatch:
        return MicroBatch(*self._head, rows=tuple(rows), ddl=ddl, part=self._part, last_part=last)

    def _write(self, sinks: Sequence[Sink[Any]], batch: MicroBatch) -> None:
        for sink in sinks:
            began = time.perf_counter()
            try:
                sink.write_batch(batch)
            finally:
                name = sink.type_name
                self.sink_seconds[name] = self.sink_seconds.get(name, 0.0) + time.perf_counter() - began
