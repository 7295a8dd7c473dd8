"""The event store: a changefeed's raw events per span, sorted, bounded in memory.

Events arrive per span from the source feeds (:meth:`EventStore.put`). They
are held in memory up to the changefeed's memory quota; past it the largest
span buffer is sorted and spilled to disk as a run. When the changefeed's
span frontier (over the spans being replicated) moves forward, the store
*publishes*: for every span it writes the events with commit ts in
``(published, cut]`` — merged from memory and the span's runs, in
``(commit_ts, start_ts, key)`` order — as resolved chunks (Arrow IPC files),
then records the new published ts in its manifest. A cut never jumps over a
DDL barrier: each DDL commit ts is a cut of its own, and a barrier set by the
maintainer caps the cut.

Guarantees:

* a published chunk is complete and durable before the manifest names it;
  published chunks survive a capture restart until :meth:`release` passes
  them; spill runs do not (they hold unresolved data that the source feeds
  again from the span's published ts);
* the published ts never goes backwards;
* memory use stays near the quota: when it is full and spilling is not
  possible (the disk quota is reached), :meth:`has_room` says so and callers
  pause their feeds (backpressure) instead of adding more.

Not guaranteed: order between spans inside one chunk set (each chunk is
sorted; a reader merges or sorts across spans).

The store is thread-safe: feeds put events from the capture's event loop
while the pipeline releases chunks from Spark's batch thread.

It is composed of three parts, each owning its files under the store's
directory: :class:`~cdcflow.core.data.logservice.buffers.SpanBuffers` (events
in memory and spill runs, ``spill/``),
:class:`~cdcflow.core.data.logservice.ddl_log.DDLLog` (``ddl.pkl``) and
:class:`~cdcflow.core.data.logservice.publisher.ChunkPublisher` (cuts, chunks
and the manifest, ``chunks/`` and ``manifest.json``); table schemas are in
``schemas.pkl`` (:class:`~cdcflow.core.data.logservice.records.SchemaRegistry`).
:class:`EventStore` serializes access to them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from cdcflow.core.config.settings import DEFAULT_MAX_BATCH_ROWS, DEFAULT_MEMORY_QUOTA, DEFAULT_SPILL_DISK_QUOTA
from cdcflow.core.data.events import DDLEvent, RawKVEvent, RowChange, Span
from cdcflow.core.data.logservice.buffers import DEFAULT_MAX_RUNS, SpanBuffers
from cdcflow.core.data.logservice.ddl_log import DDLLog
from cdcflow.core.data.logservice.manifest import ChunkInfo
from cdcflow.core.data.logservice.publisher import DEFAULT_BATCH_ROWS, DEFAULT_CHUNK_ROWS, ChunkPublisher
from cdcflow.core.data.logservice.records import SchemaRegistry

__all__ = ["DEFAULT_CHUNK_ROWS", "EventStore", "StoreStats"]

_SCHEMAS_FILE = "schemas.pkl"


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counters for metrics and tests."""

    memory_bytes: int
    disk_bytes: int
    spilled_runs: int
    chunks: int
    published_ts: int
    dropped_duplicates: int
    #: Of ``disk_bytes``: the spill runs (unresolved events) and the published chunks.
    spill_bytes: int = 0
    chunk_bytes: int = 0
    #: Events (and their record bytes) put so far.
    events_in: int = 0
    bytes_in: int = 0


class EventStore:
    """One changefeed's event store under ``directory`` (see the module docs)."""

    def __init__(
        self,
        directory: Path,
        changefeed_id: str,
        *,
        start_ts: int = 0,
        memory_quota: int = DEFAULT_MEMORY_QUOTA,
        disk_quota: int = DEFAULT_SPILL_DISK_QUOTA,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        fsync: bool = True,
        auto_spill: bool = True,
        max_runs: int = DEFAULT_MAX_RUNS,
        cut_rows: int = DEFAULT_MAX_BATCH_ROWS,
    ) -> None:
        self.directory = Path(directory)
        self.changefeed_id = changefeed_id
        #: Whether put() spills by itself; callers that keep disk work off their
        #: event loop turn it off and call spill() from a thread.
        self.auto_spill = auto_spill
        self._lock = threading.RLock()
        self._buffers = SpanBuffers(
            self.directory / "spill",
            changefeed_id,
            memory_quota=memory_quota,
            disk_quota=disk_quota,
            max_runs=max_runs,
        )
        self.schemas = SchemaRegistry(self.directory / _SCHEMAS_FILE)
        self._ddl = DDLLog(self.directory)
        self._publisher = ChunkPublisher(
            self.directory,
            changefeed_id,
            self._buffers,
            self._ddl,
            start_ts=start_ts,
            chunk_rows=chunk_rows,
            batch_rows=batch_rows,
            fsync=fsync,
            cut_rows=cut_rows,
        )

    @property
    def memory_quota(self) -> int:
        return self._buffers.memory_quota

    @property
    def disk_quota(self) -> int:
        return self._buffers.disk_quota

    @property
    def max_runs(self) -> int:
        """Runs per span before they are merged into one (bounds a cut's merge width)."""
        return self._buffers.max_runs

    @property
    def chunk_rows(self) -> int:
        return self._publisher.chunk_rows

    @property
    def batch_rows(self) -> int:
        return self._publisher.batch_rows

    # -- spans ------------------------------------------------------------------

    def add_span(self, span: Span, checkpoint_ts: int, *, replicating: bool) -> int:
        """Load ``span`` (or switch a prepared span to replicating); return the ts
        its feed must start from.

        A span that was replicating before a restart resumes from the published
        ts (its events up to there are in chunks); a new span from its
        checkpoint. Switching a prepared span drops its buffered events at or
        below ``checkpoint_ts`` (another capture flushed them).
        """
        with self._lock:
            return self._publisher.add_span(span, checkpoint_ts, replicating=replicating)

    def remove_span(self, span: Span) -> None:
        """Drop ``span``'s unpublished events; its published chunks stay until released."""
        with self._lock:
            self._publisher.remove_span(span)

    def spans(self) -> list[Span]:
        with self._lock:
            return self._buffers.spans()

    def span_of(self, span_id: int) -> Span:
        """The span with store id ``span_id`` (for decoding chunk rows)."""
        with self._lock:
            return self._publisher.span_of(span_id)

    def spans_by_id(self) -> dict[int, Span]:
        """Every span the store has an id for (a copy, shipped to Spark tasks with a batch)."""
        with self._lock:
            return self._publisher.spans_by_id()

    def resolved_ts(self, span: Span) -> int:
        """The span's resolved ts (0 when not loaded); no lock."""
        buf = self._buffers.get(span)
        return buf.resolved_ts if buf is not None else 0

    # -- events -----------------------------------------------------------------

    def put(self, span: Span, event: RawKVEvent | RowChange) -> bool:
        """Buffer ``event`` of ``span``; returns False when it was a duplicate
        (at or below the span's floor) or the span is not loaded.

        Never blocks: check :meth:`has_room` before putting to apply backpressure.
        """
        with self._lock:
            if not self._buffers.put(span, event, self.schemas):
                return False
            if self.auto_spill and self._buffers.full:
                self._buffers.spill(self._publisher.chunk_bytes)
            return True

    def put_ddl(self, ddl: DDLEvent) -> bool:
        """Record a DDL barrier at ``ddl.commit_ts``; returns False for a repeat
        (see :meth:`DDLLog.add <cdcflow.core.data.logservice.ddl_log.DDLLog.add>`)
        or one at or below the published ts."""
        with self._lock:
            return self._publisher.add_ddl(ddl)

    def resolve(self, span: Span, ts: int) -> bool:
        """No event of ``span`` at or below ``ts`` will arrive any more; returns
        whether the published ts moved (new chunks are readable)."""
        with self._lock:
            return self._publisher.resolve(span, ts)

    def set_barrier(self, ts: int | None) -> bool:
        """Publish nothing above ``ts`` (None lifts the barrier); returns whether the published ts moved."""
        with self._lock:
            return self._publisher.set_barrier(ts)

    def has_room(self) -> bool:
        """Whether feeds may put more events: memory below the quota, spilling if it can."""
        return self.spill()

    def spill(self) -> bool:
        """Spill while memory is at the quota; returns whether memory is now below it
        (False: the disk quota forbids spilling — apply backpressure)."""
        with self._lock:
            if self._buffers.full:
                self._buffers.spill(self._publisher.chunk_bytes)
            return not self._buffers.full

    @property
    def memory_full(self) -> bool:
        """Memory is at the quota (read without the lock: a hint, for callers'
        fast paths; :meth:`spill` decides)."""
        return self._buffers.full

    # -- publishing ---------------------------------------------------------------

    # Plain attribute reads below take no lock (atomic under the GIL), so that
    # status queries never wait behind a cut that writes chunk files.

    @property
    def published_ts(self) -> int:
        return self._publisher.published_ts

    @property
    def released_ts(self) -> int:
        """The start ts of the last batch begun: a batch (replays included) reads only
        events committed after it, except the catch-up chunks of a span that joined
        behind it, whose events are above that span's checkpoint."""
        return self._publisher.released_ts

    def chunks_between(self, start_ts: int, end_ts: int) -> list[ChunkInfo]:
        """The chunks published by cuts in ``(start_ts, end_ts]`` (catch-up chunks labelled
        ``end_ts`` included; use :meth:`chunks_in` to follow the publishing order)."""
        with self._lock:
            return self._publisher.chunks_between(start_ts, end_ts)

    def chunks_in(self, start_seq: int, end_seq: int) -> list[ChunkInfo]:
        """The chunks with sequence numbers in ``[start_seq, end_seq)``, in publishing order."""
        with self._lock:
            return self._publisher.chunks_in(start_seq, end_seq)

    @property
    def next_chunk(self) -> int:
        """The sequence number the next published chunk gets; no lock."""
        return self._publisher.next_chunk

    def covers(self, span: Span) -> bool:
        """Whether the recorded checkpoint covers ``span``: every batch that carries the
        span's events up to the published ts when it joined has been flushed."""
        return self._publisher.covers(span)

    def caught_up_ts(self, span: Span) -> int:
        """For a span that joined behind the published ts and is not covered yet: the
        ts up to which its events are flushed, by the catch-up chunks a recorded
        checkpoint has passed (0: none yet)."""
        return self._publisher.caught_up_ts(span)

    def ddl_between(self, start_ts: int, end_ts: int) -> list[DDLEvent]:
        """The DDL events with commit ts in ``(start_ts, end_ts]``, in commit order."""
        with self._lock:
            return self._ddl.between(start_ts, end_ts)

    # -- progress -------------------------------------------------------------------

    @property
    def checkpoint_ts(self) -> int:
        """The last checkpoint recorded by :meth:`checkpoint` (or the start ts); no lock."""
        return self._publisher.checkpoint_ts

    def checkpoint(self, ts: int, next_chunk: int | None = None) -> None:
        """Every sink flushed everything at or below ``ts`` and every chunk below
        ``next_chunk`` (recorded, not yet released: a batch may still be replayed
        until the next one starts)."""
        with self._lock:
            self._publisher.checkpoint(ts, next_chunk)

    def release(self, ts: int, before_chunk: int | None = None) -> None:
        """Delete DDL at or below ``ts`` and the chunks no batch will read again: those
        below sequence number ``before_chunk`` when given, else those labelled at or below ``ts``."""
        with self._lock:
            self._publisher.release(ts, before_chunk)

    def stats(self) -> StoreStats:
        with self._lock:
            spill, chunks = self._buffers.run_bytes(), self._publisher.chunk_bytes()
            return StoreStats(
                memory_bytes=self._buffers.memory,
                disk_bytes=spill + chunks,
                spilled_runs=self._buffers.run_count(),
                chunks=self._publisher.chunk_count(),
                published_ts=self._publisher.published_ts,
                dropped_duplicates=self._buffers.dropped,
                spill_bytes=spill,
                chunk_bytes=chunks,
                events_in=self._buffers.events_in,
                bytes_in=self._buffers.bytes_in,
            )

    def close(self) -> None:
        """Delete spill runs; published chunks and the manifest stay for a restart."""
        with self._lock:
            self._buffers.close()
