"""The event store's span buffers: a changefeed's unpublished events, bounded in memory.

Events are held per span in memory up to the memory quota; past it the
largest span buffer is sorted and spilled to disk as a run
(:class:`~cdcflow.core.data.logservice.runs.SpillRun`, under ``spill/``), and
a span's runs are merged into one when there are more than ``max_runs``.
Publishing takes a span's events up to a cut, merged from memory and its runs
in ``(commit_ts, start_ts, key)`` order, each change once: a change the source
sent again (same commit ts, start ts and key) is dropped where the merge puts
it next to the first. Runs hold unresolved data only: the
directory is emptied on opening, and the source feeds the spans again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdcflow.core.data.events import RawKVEvent, RowChange, Span
from cdcflow.core.data.logservice.records import (
    Record,
    SchemaRegistry,
    record_from_event,
    record_size,
    sort_key,
    write_records,
)
from cdcflow.core.data.logservice.runs import SpillRun

__all__ = ["DEFAULT_MAX_RUNS", "Counted", "SpanBuffer", "SpanBuffers"]

log = logging.getLogger(__name__)

#: Spill runs per span before they are merged into one: a cut reads one batch of
#: every run at once, so this keeps its memory independent of the transaction size.
DEFAULT_MAX_RUNS = 16
#: Rows per record batch in spill runs: a merge holds one batch per run in memory,
#: so this (not the size of a transaction) bounds what publishing a cut costs.
_RUN_BATCH_ROWS = 1_024

_MAX_TS = (1 << 63) - 1
#: Seconds between two warnings that the memory quota is full and spilling is refused:
#: callers retry spilling many times a second while their feeds are paused.
_FULL_WARNING_INTERVAL = 30.0


@dataclass
class SpanBuffer:
    """Unpublished events of one span: in memory and in spill runs."""

    span: Span
    span_id: int
    replicating: bool
    #: Events at or below this ts are duplicates (published here or flushed elsewhere).
    floor_ts: int
    resolved_ts: int
    records: list[Record] = field(default_factory=list)
    memory: int = 0
    runs: list[SpillRun] = field(default_factory=list)
    #: Once the span's events up to the published ts are in chunks: the chunk
    #: sequence number a checkpoint must reach to cover the span (None before).
    covered_from: int | None = None
    #: While the span catches up behind the published ts: ``(next chunk, ts)`` marks,
    #: oldest first — once a checkpoint reaches the chunk number, every event of the
    #: span at or below the ts is flushed.
    catch_up_marks: list[tuple[int, int]] = field(default_factory=list)
    #: The highest ts of a mark a recorded checkpoint has passed (0: none yet).
    caught_up_ts: int = 0


class SpanBuffers:
    """The span buffers of one store (not thread-safe: the store serializes access)."""

    def __init__(
        self, spill_dir: Path, changefeed_id: str, *, memory_quota: int, disk_quota: int, max_runs: int
    ) -> None:
        self.changefeed_id = changefeed_id
        self.memory_quota = memory_quota
        self.disk_quota = disk_quota
        #: Runs per span before they are merged into one (bounds a cut's merge width).
        self.max_runs = max(2, max_runs)
        self._spill_dir = spill_dir
        # Spill runs hold unresolved data only; a restart feeds it again.
        shutil.rmtree(spill_dir, ignore_errors=True)
        spill_dir.mkdir(parents=True)
        self._buffers: dict[Span, SpanBuffer] = {}
        #: Bytes held in memory by all buffers (read without the lock for hints).
        self.memory = 0
        #: Events dropped: by :meth:`put` (at or below the floor, or of spans not loaded)
        #: and by publishing (a change sent again, see :meth:`take`).
        self.dropped = 0
        #: Events and bytes (record size) put so far (for metrics: rows and bytes read).
        self.events_in = 0
        self.bytes_in = 0
        self._run_seq = itertools.count()
        self._warned_full_at: float | None = None

    # -- spans --------------------------------------------------------------------------

    def get(self, span: Span) -> SpanBuffer | None:
        return self._buffers.get(span)

    def add(self, span: Span, span_id: int, floor_ts: int) -> SpanBuffer:
        """A new, prepared (not replicating) buffer for ``span``, resolved up to its floor."""
        buf = SpanBuffer(span, span_id, False, floor_ts, floor_ts)
        self._buffers[span] = buf
        return buf

    def remove(self, span: Span) -> SpanBuffer | None:
        """Drop ``span``'s buffer with its events and runs; the buffer, None when not loaded."""
        buf = self._buffers.pop(span, None)
        if buf is not None:
            self._drop_memory(buf, [])
            for run in buf.runs:
                run.delete()
        return buf

    def spans(self) -> list[Span]:
        return list(self._buffers)

    def replicating(self) -> list[SpanBuffer]:
        return [buf for buf in self._buffers.values() if buf.replicating]

    def preparing(self) -> list[SpanBuffer]:
        return [buf for buf in self._buffers.values() if not buf.replicating]

    # -- events ---------------------------------------------------------------------------

    def put(self, span: Span, event: RawKVEvent | RowChange, schemas: SchemaRegistry) -> bool:
        """Buffer ``event`` of ``span`` in memory; False (dropped) when it is at or below
        the span's floor or the span is not loaded."""
        buf = self._buffers.get(span)
        if buf is None or event.commit_ts <= buf.floor_ts:
            self.dropped += 1
            return False
        record = record_from_event(event, buf.span_id, schemas)
        size = record_size(record)
        buf.records.append(record)
        buf.memory += size
        self.memory += size
        self.events_in += 1
        self.bytes_in += size
        return True

    @property
    def full(self) -> bool:
        """Memory is at the quota."""
        return self.memory >= self.memory_quota

    def raise_floor(self, buf: SpanBuffer, ts: int) -> None:
        """Events of ``buf`` at or below ``ts`` are duplicates from now on: drop those in memory."""
        buf.floor_ts = ts
        self._drop_memory(buf, [r for r in buf.records if r[0] > ts])

    def take(self, buf: SpanBuffer, cut_ts: int) -> Iterator[Record]:
        """``buf``'s events with commit ts in ``(floor, cut_ts]``, in order; those in memory
        leave it at once, those in runs as the iterator (which must be exhausted) yields them.
        Call :meth:`drop_exhausted_runs` afterwards."""
        below = sorted((r for r in buf.records if r[0] <= cut_ts), key=sort_key)
        if below:
            self._drop_memory(buf, [r for r in buf.records if r[0] > cut_ts])
        floor = buf.floor_ts
        sources: list[Iterable[Record]] = [below, *(run.take_until(cut_ts) for run in buf.runs)]
        merged = (r for r in heapq.merge(*sources, key=sort_key) if r[0] > floor)
        return self._unique(merged)

    def _unique(self, records: Iterable[Record]) -> Iterator[Record]:
        """``records`` (sorted) without repeats of one change: a source may send a change
        again (TiKV, after a region is split or its leader moves, scans it again from the
        region's resolved ts), and a repeat is the same record with the same
        ``(commit_ts, start_ts, key)``, so it is next to the first in sort order. Records
        without a key (row sources that do not know one) are never repeats: the rows of one
        transaction share their timestamps. Counted in :attr:`dropped`."""
        previous: tuple[Any, ...] = ()
        for record in records:
            current = tuple(record)
            if current[2] and current == previous:
                self.dropped += 1
                continue
            previous = current
            yield record

    def drop_exhausted_runs(self, buf: SpanBuffer) -> None:
        for run in [r for r in buf.runs if r.exhausted]:
            run.delete()
            buf.runs.remove(run)

    # -- spilling ---------------------------------------------------------------------------

    def spill(self, chunk_bytes: Callable[[], int]) -> None:
        """Spill the largest span buffers until memory is below the quota or the disk quota
        stops it; ``chunk_bytes`` is the disk the published chunks take besides the runs."""
        while self.memory >= self.memory_quota:
            buf = max(self._buffers.values(), key=lambda b: b.memory, default=None)
            if buf is None or not buf.records:
                return
            if self.disk_quota and self.run_bytes() + chunk_bytes() + buf.memory > self.disk_quota:
                now = time.monotonic()
                if self._warned_full_at is None or now - self._warned_full_at >= _FULL_WARNING_INTERVAL:
                    self._warned_full_at = now
                    log.warning(
                        "changefeed %s: event store memory quota (%d bytes) full and spill-disk-quota (%d bytes) "
                        "reached; pausing feeds until publishing frees room (said again at most every %.0fs)",
                        *(self.changefeed_id, self.memory_quota, self.disk_quota, _FULL_WARNING_INTERVAL),
                    )
                return
            buf.records.sort(key=sort_key)
            path = self._spill_dir / f"{buf.span_id}-{next(self._run_seq):08d}.arrow"
            # Small record batches: publishing reads one batch of every run at once.
            size = write_records(path, buf.records, _RUN_BATCH_ROWS, fsync=False)
            buf.runs.append(SpillRun(path, len(buf.records), size, head_ts=buf.records[0][0]))
            self._drop_memory(buf, [])
            if len(buf.runs) > self.max_runs:
                self._compact_runs(buf)

    def _compact_runs(self, buf: SpanBuffer) -> None:
        """Merge a span's runs into one sorted run (streaming: one batch per run in memory)."""
        path = self._spill_dir / f"{buf.span_id}-{next(self._run_seq):08d}.arrow"
        merged = Counted(self._unique(heapq.merge(*(run.take_until(_MAX_TS) for run in buf.runs), key=sort_key)))
        head = _Head(merged)
        size = write_records(path, head, _RUN_BATCH_ROWS, fsync=False)
        for run in buf.runs:
            run.delete()
        buf.runs = [SpillRun(path, merged.count, size, head_ts=head.first_ts)] if merged.count else []
        if not merged.count:
            path.unlink(missing_ok=True)

    def run_bytes(self) -> int:
        return sum(run.size for b in self._buffers.values() for run in b.runs)

    def run_count(self) -> int:
        return sum(len(b.runs) for b in self._buffers.values())

    def close(self) -> None:
        """Delete every run and forget every buffer."""
        for buf in self._buffers.values():
            for run in buf.runs:
                run.delete()
            buf.runs.clear()
            self._drop_memory(buf, [])
        self._buffers.clear()

    def _drop_memory(self, buf: SpanBuffer, kept: list[Record]) -> None:
        kept_memory = sum(record_size(r) for r in kept)
        self.memory -= buf.memory - kept_memory
        buf.records = kept
        buf.memory = kept_memory


class Counted(Iterator[Record]):
    """Counts the records an iterator yields."""

    def __init__(self, inner: Iterator[Record]) -> None:
        self._inner = inner
        self.count = 0

    def __next__(self) -> Record:
        record = next(self._inner)
        self.count += 1
        return record


class Peekable(Iterator[Record]):
    """A record iterator that can yield a piece ending between two commit ts."""

    def __init__(self, inner: Iterator[Record]) -> None:
        self._inner = inner
        self._next: Record | None = None

    def __next__(self) -> Record:
        if self._next is not None:
            record, self._next = self._next, None
            return record
        return next(self._inner)

    def _peek(self) -> Record | None:
        if self._next is None:
            self._next = next(self._inner, None)
        return self._next

    def take_whole_ts(self, rows: int) -> Iterator[Record]:
        """At least ``rows`` records (fewer at the end), and every further one with
        the commit ts of the last: a piece never ends inside a commit ts."""
        last: Record | None = None
        for last in itertools.islice(self, rows):
            yield last
        if last is None:
            return
        while (following := self._peek()) is not None and following[0] == last[0]:
            yield next(self)


class Tail(Iterator[Record]):
    """Remembers the commit ts of the last record an iterator yielded (0: none)."""

    def __init__(self, inner: Iterator[Record]) -> None:
        self._inner = inner
        self.last_ts = 0

    def __next__(self) -> Record:
        record = next(self._inner)
        self.last_ts = record[0]
        return record


class _Head(Iterator[Record]):
    """Remembers the commit ts of the first record an iterator yields."""

    def __init__(self, inner: Iterator[Record]) -> None:
        self._inner = inner
        self.first_ts = 0
        self._seen = False

    def __next__(self) -> Record:
        record = next(self._inner)
        if not self._seen:
            self._seen = True
            self.first_ts = record[0]
        return record
