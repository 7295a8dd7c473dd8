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
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from pathlib import Path

from cdcflow.core.config.settings import DEFAULT_MEMORY_QUOTA, DEFAULT_SPILL_DISK_QUOTA
from cdcflow.core.data.events import DDLEvent, RawKVEvent, RowChange, Span
from cdcflow.core.data.frontier import SpanFrontier
from cdcflow.core.data.logservice.buffers import DEFAULT_MAX_RUNS, Counted, SpanBuffer, SpanBuffers
from cdcflow.core.data.logservice.ddl_log import DDLLog
from cdcflow.core.data.logservice.manifest import ChunkInfo, Manifest, SpanEntry, read_manifest, write_manifest
from cdcflow.core.data.logservice.records import SchemaRegistry, write_records

__all__ = ["DEFAULT_CHUNK_ROWS", "EventStore", "StoreStats"]

#: Rows per resolved chunk file (one Spark partition reads one chunk).
DEFAULT_CHUNK_ROWS = 131_072
#: Rows per Arrow record batch inside chunk and run files.
DEFAULT_BATCH_ROWS = 8_192

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
    ) -> None:
        self.directory = Path(directory)
        self.changefeed_id = changefeed_id
        self.chunk_rows = chunk_rows
        self.batch_rows = batch_rows
        self._fsync = fsync
        #: Whether put() spills by itself; callers that keep disk work off their
        #: event loop turn it off and call spill() from a thread.
        self.auto_spill = auto_spill
        self._lock = threading.RLock()
        (self.directory / "chunks").mkdir(parents=True, exist_ok=True)
        self._buffers = SpanBuffers(
            self.directory / "spill",
            changefeed_id,
            memory_quota=memory_quota,
            disk_quota=disk_quota,
            max_runs=max_runs,
        )
        self.schemas = SchemaRegistry(self.directory / _SCHEMAS_FILE)
        self._manifest = read_manifest(self.directory) or Manifest(
            changefeed_id, published_ts=start_ts, released_ts=start_ts, checkpoint_ts=start_ts
        )
        # A checkpoint beyond what this store published means another capture
        # flushed that far: nothing at or below it is needed here.
        self._manifest.published_ts = max(self._manifest.published_ts, start_ts)
        self._manifest.checkpoint_ts = max(self._manifest.checkpoint_ts, start_ts)
        self._ddl = DDLLog(self.directory)
        self._span_ids: dict[Span, int] = {}
        self._span_by_id: dict[int, Span] = {}
        for entry in self._manifest.spans:
            span = Span(entry.table_id, bytes.fromhex(entry.start), bytes.fromhex(entry.end))
            self._span_ids[span] = entry.span_id
            self._span_by_id[entry.span_id] = span
        self._durable = {self._span_by_id[e.span_id] for e in self._manifest.spans if e.replicating}
        #: How far the durable spans' events are in chunks: the published ts at opening.
        #: Spans re-added after the published ts moved on (others came back first) are
        #: behind it, and catch up like any span that joins late.
        self._durable_ts = self._manifest.published_ts
        self._frontier = SpanFrontier(())
        self._barrier: int | None = None
        #: Chunks below this sequence number are flushed (see :meth:`covers`).
        self._checkpoint_chunk = self._manifest.checkpoint_chunk
        self._remove_stale_chunks()
        self._save()

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
            buf = self._buffers.get(span)
            if buf is None:
                floor = checkpoint_ts
                if span in self._durable:
                    floor = max(floor, self._durable_ts)
                buf = self._buffers.add(span, self._span_id(span), floor)
            if replicating and not buf.replicating:
                self._start_replicating(buf, checkpoint_ts)
                self._catch_up(buf)
            return buf.floor_ts

    def _start_replicating(self, buf: SpanBuffer, checkpoint_ts: int) -> None:
        if checkpoint_ts > buf.floor_ts:
            self._buffers.raise_floor(buf, checkpoint_ts)
        buf.resolved_ts = max(buf.resolved_ts, buf.floor_ts)
        buf.replicating = True
        self._frontier.add(buf.span, buf.resolved_ts)
        # A span replicating before a restart keeps its coverage while its events up to
        # the published ts are in chunks: the recorded checkpoint still covers it. One
        # that comes back behind the published ts is covered once its catch-up is flushed.
        entry = self._manifest.spans[buf.span_id]
        behind = buf.floor_ts < self._manifest.published_ts
        if buf.span in self._durable and entry.covered_from is not None and not behind:
            buf.covered_from = entry.covered_from
        self._mark_replicating(buf.span_id, True, buf.covered_from)

    def remove_span(self, span: Span) -> None:
        """Drop ``span``'s unpublished events; its published chunks stay until released."""
        with self._lock:
            buf = self._buffers.remove(span)
            if buf is None:
                return
            if buf.replicating:
                self._frontier.remove(span)
                self._mark_replicating(buf.span_id, False, None)
            self._durable.discard(span)  # published from here on without it
            self._publish()

    def spans(self) -> list[Span]:
        with self._lock:
            return self._buffers.spans()

    def span_of(self, span_id: int) -> Span:
        """The span with store id ``span_id`` (for decoding chunk rows)."""
        with self._lock:
            return self._span_by_id[span_id]

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
                self._buffers.spill(self._chunk_bytes)
            return True

    def put_ddl(self, ddl: DDLEvent) -> bool:
        """Record a DDL barrier at ``ddl.commit_ts``; returns False for a repeat
        (see :meth:`DDLLog.add <cdcflow.core.data.logservice.ddl_log.DDLLog.add>`)
        or one at or below the published ts."""
        with self._lock:
            if ddl.commit_ts <= self._manifest.published_ts or not self._ddl.add(ddl):
                return False
            self._manifest.ddl_ts = self._ddl.barriers()
            self._save()
            return True

    def resolve(self, span: Span, ts: int) -> bool:
        """No event of ``span`` at or below ``ts`` will arrive any more; returns
        whether the published ts moved (new chunks are readable)."""
        with self._lock:
            buf = self._buffers.get(span)
            if buf is None or ts <= buf.resolved_ts:
                return False
            buf.resolved_ts = ts
            if not buf.replicating:
                return False
            moved = self._frontier.forward(span, ts) and self._publish()
            return self._catch_up(buf) or moved

    def set_barrier(self, ts: int | None) -> bool:
        """Publish nothing above ``ts`` (None lifts the barrier); returns whether the published ts moved."""
        with self._lock:
            self._barrier = ts
            return self._publish()

    def has_room(self) -> bool:
        """Whether feeds may put more events: memory below the quota, spilling if it can."""
        return self.spill()

    def spill(self) -> bool:
        """Spill while memory is at the quota; returns whether memory is now below it
        (False: the disk quota forbids spilling — apply backpressure)."""
        with self._lock:
            if self._buffers.full:
                self._buffers.spill(self._chunk_bytes)
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
        return self._manifest.published_ts

    @property
    def released_ts(self) -> int:
        """The start ts of the last batch begun: a batch (replays included) reads only
        events committed after it, except the catch-up chunks of a span that joined
        behind it, whose events are above that span's checkpoint."""
        return self._manifest.released_ts

    def _target_ts(self) -> int:
        target = self._frontier.frontier if len(self._frontier) else self._manifest.published_ts
        if self._barrier is not None:
            target = min(target, self._barrier)
        return target

    def _publish(self) -> bool:
        target = self._target_ts()
        moved = False
        while self._manifest.published_ts < target:
            published = self._manifest.published_ts
            ddl = [d.commit_ts for d in self._ddl.between(published, target)]
            self._cut(min(ddl, default=target))
            moved = True
        return moved

    def _cut(self, cut_ts: int) -> None:
        lo = self._manifest.published_ts
        replicating = self._buffers.replicating()
        for buf in replicating:
            self._manifest.chunks.extend(self._write_chunks(buf, lo, cut_ts, cut_ts))
            # Every replicating span resolved past the cut: nothing at or below it comes again.
            buf.floor_ts = max(buf.floor_ts, cut_ts)
        self._manifest.published_ts = cut_ts
        for buf in replicating:
            if buf.covered_from is None:
                self._set_covered(buf)
        self._save()

    def _catch_up(self, buf: SpanBuffer) -> bool:
        """Publish a replicating span's events at or below the published ts.

        A span that joins the frontier after the published ts passed its
        checkpoint (added later, or re-added) has events that no cut will
        take any more: the frontier cannot go back. Once the span resolves
        them they are written as chunks labelled with the published ts
        (``lo == hi``) and a new chunk sequence number, which readers follow.
        Returns whether chunks were published.
        """
        published = self._manifest.published_ts
        upto = min(buf.resolved_ts, published)
        if not buf.replicating or upto <= buf.floor_ts:
            if buf.replicating and buf.covered_from is None and buf.resolved_ts >= published:
                self._set_covered(buf)
                self._save()
            return False
        chunks = self._write_chunks(buf, published, published, upto)
        buf.floor_ts = upto
        self._manifest.chunks.extend(chunks)
        covered = upto >= published
        if covered:
            self._set_covered(buf)
        if chunks or covered:
            self._save()
        return bool(chunks)

    def _write_chunks(self, buf: SpanBuffer, lo: int, hi: int, cut_ts: int) -> list[ChunkInfo]:
        """Write ``buf``'s events with commit ts in ``(floor, cut_ts]`` as chunks labelled ``(lo, hi]``."""
        merged = self._buffers.take(buf, cut_ts)
        chunks = []
        while True:
            seq = self._manifest.next_chunk
            name = f"chunks/{seq:012d}.arrow"
            counter = Counted(itertools.islice(merged, self.chunk_rows))
            size = write_records(self.directory / name, counter, self.batch_rows, fsync=self._fsync)
            if counter.count == 0:
                (self.directory / name).unlink()
                break
            self._manifest.next_chunk += 1
            chunks.append(ChunkInfo(name, buf.span_id, lo, hi, counter.count, size))
            if counter.count < self.chunk_rows:
                break
        self._buffers.drop_exhausted_runs(buf)
        return chunks

    def chunks_between(self, start_ts: int, end_ts: int) -> list[ChunkInfo]:
        """The chunks published by cuts in ``(start_ts, end_ts]`` (catch-up chunks labelled
        ``end_ts`` included; use :meth:`chunks_in` to follow the publishing order)."""
        with self._lock:
            return [c for c in self._manifest.chunks if start_ts < c.hi <= end_ts]

    def chunks_in(self, start_seq: int, end_seq: int) -> list[ChunkInfo]:
        """The chunks with sequence numbers in ``[start_seq, end_seq)``, in publishing order."""
        with self._lock:
            return [c for c in self._manifest.chunks if start_seq <= c.seq < end_seq]

    @property
    def next_chunk(self) -> int:
        """The sequence number the next published chunk gets; no lock."""
        return self._manifest.next_chunk

    def covers(self, span: Span) -> bool:
        """Whether the recorded checkpoint covers ``span``: every batch that carries the
        span's events up to the published ts when it joined has been flushed."""
        buf = self._buffers.get(span)
        return (
            buf is not None
            and buf.replicating
            and buf.covered_from is not None
            and self._checkpoint_chunk >= buf.covered_from
        )

    def ddl_between(self, start_ts: int, end_ts: int) -> list[DDLEvent]:
        """The DDL events with commit ts in ``(start_ts, end_ts]``, in commit order."""
        with self._lock:
            return self._ddl.between(start_ts, end_ts)

    # -- progress -------------------------------------------------------------------

    @property
    def checkpoint_ts(self) -> int:
        """The last checkpoint recorded by :meth:`checkpoint` (or the start ts); no lock."""
        return self._manifest.checkpoint_ts

    def checkpoint(self, ts: int, next_chunk: int | None = None) -> None:
        """Every sink flushed everything at or below ``ts`` and every chunk below
        ``next_chunk`` (recorded, not yet released: a batch may still be replayed
        until the next one starts)."""
        with self._lock:
            moved = False
            if next_chunk is not None and next_chunk > self._checkpoint_chunk:
                self._checkpoint_chunk = self._manifest.checkpoint_chunk = next_chunk
                moved = True
            if ts > self._manifest.checkpoint_ts:
                self._manifest.checkpoint_ts = ts
                moved = True
            if moved:
                # Durable, so that a restart reports it for the spans it covers.
                self._save()

    def release(self, ts: int, before_chunk: int | None = None) -> None:
        """Delete DDL at or below ``ts`` and the chunks no batch will read again: those
        below sequence number ``before_chunk`` when given, else those labelled at or below ``ts``."""
        with self._lock:
            if before_chunk is not None and before_chunk > self._manifest.released_chunk:
                self._manifest.released_chunk = before_chunk
                self._remove_stale_chunks()
                self._save()
            if ts <= self._manifest.released_ts:
                return
            self._manifest.released_ts = ts
            self._remove_stale_chunks()
            self._ddl.release(ts)
            self._manifest.ddl_ts = self._ddl.barriers()
            self._save()

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                memory_bytes=self._buffers.memory,
                disk_bytes=self._buffers.run_bytes() + self._chunk_bytes(),
                spilled_runs=self._buffers.run_count(),
                chunks=len(self._manifest.chunks),
                published_ts=self._manifest.published_ts,
                dropped_duplicates=self._buffers.dropped,
            )

    def close(self) -> None:
        """Delete spill runs; published chunks and the manifest stay for a restart."""
        with self._lock:
            self._buffers.close()

    # -- internals --------------------------------------------------------------------

    def _chunk_bytes(self) -> int:
        return sum(c.size for c in self._manifest.chunks)

    def _span_id(self, span: Span) -> int:
        known = self._span_ids.get(span)
        if known is not None:
            return known
        span_id = len(self._manifest.spans)
        self._manifest.spans.append(SpanEntry(span_id, span.table_id, span.start.hex(), span.end.hex()))
        self._span_ids[span] = span_id
        self._span_by_id[span_id] = span
        return span_id

    def _mark_replicating(self, span_id: int, replicating: bool, covered_from: int | None) -> None:
        self._set_entry(span_id, replicating, covered_from)
        self._save()

    def _set_covered(self, buf: SpanBuffer) -> None:
        """From the next chunk on, a recorded checkpoint covers ``buf``'s span (saved with the manifest)."""
        buf.covered_from = self._manifest.next_chunk
        self._set_entry(buf.span_id, True, buf.covered_from)

    def _set_entry(self, span_id: int, replicating: bool, covered_from: int | None) -> None:
        spans = self._manifest.spans
        entry = spans[span_id]
        spans[span_id] = SpanEntry(entry.span_id, entry.table_id, entry.start, entry.end, replicating, covered_from)

    def _remove_stale_chunks(self) -> None:
        released, released_chunk = self._manifest.released_ts, self._manifest.released_chunk
        keep = []
        for chunk in self._manifest.chunks:
            # A catch-up chunk is labelled with an already released ts: its sequence number decides.
            if chunk.seq < released_chunk or (chunk.hi <= released and chunk.lo < chunk.hi):
                (self.directory / chunk.file).unlink(missing_ok=True)
            else:
                keep.append(chunk)
        self._manifest.chunks = keep

    def _save(self) -> None:
        write_manifest(self.directory, self._manifest, fsync=self._fsync)
