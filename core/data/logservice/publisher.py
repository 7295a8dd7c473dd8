"""The event store's publishing: cuts of the span frontier written as resolved chunks.

When the span frontier over the replicating spans moves forward, the
publisher writes, for every such span, the events with commit ts in
``(published, cut]`` — taken from its :class:`~cdcflow.core.data.logservice.buffers.SpanBuffer` —
as resolved chunks (Arrow IPC files under ``chunks/``), then records the new
published ts in the manifest (:mod:`~cdcflow.core.data.logservice.manifest`).
A cut never jumps over a DDL barrier of the
:class:`~cdcflow.core.data.logservice.ddl_log.DDLLog` (each DDL commit ts is a
cut of its own), and a barrier set by the maintainer caps the cut. A span that
joins behind the published ts is caught up by chunks labelled with it.

The manifest also keeps the spans' ids and whether a recorded checkpoint
covers them, the checkpoint, and what is released; chunks are deleted once
released.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import numpy as np

from cdcflow.core.config.settings import DEFAULT_MAX_BATCH_ROWS
from cdcflow.core.data.events import DDLEvent, Span
from cdcflow.core.data.frontier import SpanFrontier
from cdcflow.core.data.logservice.buffers import Counted, Peekable, SpanBuffer, SpanBuffers, Tail
from cdcflow.core.data.logservice.ddl_log import DDLLog
from cdcflow.core.data.logservice.manifest import ChunkInfo, Manifest, SpanEntry, read_manifest, write_manifest
from cdcflow.core.data.logservice.records import write_records

__all__ = ["DEFAULT_BATCH_ROWS", "DEFAULT_CHUNK_ROWS", "ChunkPublisher"]

log = logging.getLogger(__name__)

#: Rows per resolved chunk file (one Spark partition reads one chunk).
DEFAULT_CHUNK_ROWS = 131_072
#: Rows per Arrow record batch inside chunk and run files.
DEFAULT_BATCH_ROWS = 8_192


class ChunkPublisher:
    """Publishes one store's span buffers as chunks and keeps its manifest (not
    thread-safe: the store serializes access; the attributes read by the
    properties may be read without a lock)."""

    def __init__(
        self,
        directory: Path,
        changefeed_id: str,
        buffers: SpanBuffers,
        ddl: DDLLog,
        *,
        start_ts: int,
        chunk_rows: int,
        batch_rows: int,
        fsync: bool,
        cut_rows: int = DEFAULT_MAX_BATCH_ROWS,
    ) -> None:
        self.directory = directory
        self.chunk_rows = chunk_rows
        self.batch_rows = batch_rows
        #: A resolved interval holding more rows is published as several cuts (0: no bound).
        self.cut_rows = cut_rows
        self._fsync = fsync
        self._buffers = buffers
        self._ddl = ddl
        (directory / "chunks").mkdir(parents=True, exist_ok=True)
        self._manifest = read_manifest(directory) or Manifest(
            changefeed_id, published_ts=start_ts, released_ts=start_ts, checkpoint_ts=start_ts
        )
        # A checkpoint beyond what this store published means another capture
        # flushed that far: nothing at or below it is needed here.
        self._manifest.published_ts = max(self._manifest.published_ts, start_ts)
        self._manifest.checkpoint_ts = max(self._manifest.checkpoint_ts, start_ts)
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

    # -- spans ------------------------------------------------------------------

    def add_span(self, span: Span, checkpoint_ts: int, *, replicating: bool) -> int:
        """See :meth:`EventStore.add_span <cdcflow.core.data.logservice.store.EventStore.add_span>`."""
        buf = self._buffers.get(span)
        if buf is None:
            floor = checkpoint_ts
            if span in self._durable:
                floor = max(floor, self._durable_ts)
            buf = self._buffers.add(span, self._span_id(span), floor)
        if replicating and not buf.replicating:
            self._start_replicating(buf, checkpoint_ts)
            self._catch_up(buf)
            self._publish()  # the last span prepared at the published ts lifts its hold
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
        """Drop ``span``'s buffer; its published chunks stay until released."""
        buf = self._buffers.remove(span)
        if buf is None:
            return
        if buf.replicating:
            self._frontier.remove(span)
            self._mark_replicating(buf.span_id, False, None)
        self._durable.discard(span)  # published from here on without it
        self._publish()

    def span_of(self, span_id: int) -> Span:
        return self._span_by_id[span_id]

    def spans_by_id(self) -> dict[int, Span]:
        return dict(self._span_by_id)

    def covers(self, span: Span) -> bool:
        """See :meth:`EventStore.covers <cdcflow.core.data.logservice.store.EventStore.covers>`; no lock."""
        buf = self._buffers.get(span)
        return (
            buf is not None
            and buf.replicating
            and buf.covered_from is not None
            and self._checkpoint_chunk >= buf.covered_from
        )

    # -- cuts --------------------------------------------------------------------------

    def resolve(self, span: Span, ts: int) -> bool:
        """See :meth:`EventStore.resolve <cdcflow.core.data.logservice.store.EventStore.resolve>`."""
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
        self._barrier = ts
        return self._publish()

    def add_ddl(self, ddl: DDLEvent) -> bool:
        """Log a DDL barrier above the published ts; returns False for one at or below it, or a repeat."""
        if ddl.commit_ts <= self._manifest.published_ts or not self._ddl.add(ddl):
            return False
        self._manifest.ddl_ts = self._ddl.barriers()
        self._save()
        return True

    def _target_ts(self) -> int:
        target = self._frontier.frontier if len(self._frontier) else self._manifest.published_ts
        if self._barrier is not None:
            target = min(target, self._barrier)
        held = self._preparing_floor()
        if held is not None:
            target = min(target, held)
        return target

    def _preparing_floor(self) -> int | None:
        """The lowest floor of a span preparing at or above the published ts, which
        holds the published ts there until the span replicates (None: no such span, or
        memory is at its quota).

        Spans of a changefeed that starts (or of a capture that restarts) are
        prepared together but finish preparing one by one, as each one's incremental
        scan ends. Were the first to replicate published on its own, the others would
        join behind the published ts and catch up one after the other, and the
        changefeed's checkpoint, the lowest of theirs, would stand still until the last
        one's catch-up is delivered. Held, they are published together, in cuts across
        all spans, and the checkpoint moves cut by cut. The changefeed's checkpoint
        cannot pass a preparing span anyway. A span that comes to prepare below the
        published ts (moved here from a capture that kept replicating it) holds
        nothing: it catches up. Memory at its quota lifts the hold, so that the
        buffered events of the replicating spans can be published instead of waiting
        with the feeds held back."""
        if self._buffers.full:
            return None
        published = self._manifest.published_ts
        return min((b.floor_ts for b in self._buffers.preparing() if b.floor_ts >= published), default=None)

    def _publish(self) -> bool:
        target = self._target_ts()
        if self._manifest.published_ts >= target:
            return False
        bounds = iter(self._bounded_cuts(self._manifest.published_ts, target))
        bound = next(bounds, target)
        while self._manifest.published_ts < target:
            published = self._manifest.published_ts
            while bound <= published:
                bound = next(bounds, target)
            ddl = [d.commit_ts for d in self._ddl.between(published, target)]
            self._cut(min(*ddl, bound, target))
        return True

    def _bounded_cuts(self, lo: int, hi: int) -> list[int]:
        """Commit timestamps in ``(lo, hi)`` at which to cut so that each cut of the
        interval holds about ``cut_rows`` rows of the replicating spans (a catch-up
        after downtime, an incremental scan). A cut takes every event up to its ts,
        across all spans, so one transaction is never split; one ts with more rows
        than the bound is one cut."""
        if self.cut_rows <= 0:
            return []
        arrays = []
        for buf in self._buffers.replicating():
            floor = max(lo, buf.floor_ts)
            memory = [r[0] for r in buf.records if floor < r[0] <= hi]
            if memory:
                arrays.append(np.fromiter(memory, dtype=np.int64, count=len(memory)))
            arrays += [run.commit_ts_between(floor, hi) for run in buf.runs]
        total = sum(len(a) for a in arrays)
        if total <= self.cut_rows:
            return []
        ts = np.sort(np.concatenate(arrays))
        cuts: list[int] = []
        start = 0  # index of the first row after the last cut
        while start + self.cut_rows < total:
            cut = int(ts[start + self.cut_rows - 1])
            end = int(np.searchsorted(ts, cut, side="right"))
            first_at_cut = int(np.searchsorted(ts, cut, side="left"))
            if end - start > self.cut_rows and first_at_cut > start:
                # The rows at this ts would overfill the cut: stop just before them.
                cut, end = int(ts[first_at_cut - 1]), first_at_cut
            if cut >= hi:
                break
            cuts.append(cut)
            start = end
        return cuts

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
        # In bounded chunks, each with the ts its span is flushed up to once a
        # checkpoint passes it, so that the span's checkpoint (and the changefeed's)
        # moves batch by batch while a large backlog is delivered.
        rows = min(self.chunk_rows, self.cut_rows) if self.cut_rows > 0 else self.chunk_rows
        chunks = self._write_chunks(buf, published, published, upto, rows=rows, marks=True)
        buf.floor_ts = upto
        self._manifest.chunks.extend(chunks)
        covered = upto >= published
        if chunks:
            # At info for the step that catches the span up: one far behind takes many steps.
            log.log(
                logging.INFO if covered else logging.DEBUG,
                "changefeed %s: %s %s behind the published ts %d: %d rows in %d chunks",
                *(self._manifest.changefeed_id, buf.span, "caught up" if covered else "catching up", published),
                *(sum(c.rows for c in chunks), len(chunks)),
            )
        if covered:
            self._set_covered(buf)
        if chunks or covered:
            self._save()
        return bool(chunks)

    def _write_chunks(
        self, buf: SpanBuffer, lo: int, hi: int, cut_ts: int, *, rows: int | None = None, marks: bool = False
    ) -> list[ChunkInfo]:
        """Write ``buf``'s events with commit ts in ``(floor, cut_ts]`` as chunks labelled
        ``(lo, hi]``, of ``rows`` rows at most (default: ``chunk_rows``); with ``marks``, note
        after each chunk the ts its span is flushed up to once a checkpoint passes it."""
        rows = rows or self.chunk_rows
        merged = Peekable(self._buffers.take(buf, cut_ts))
        chunks = []
        last_ts: list[int] = []
        while True:
            seq = self._manifest.next_chunk
            name = f"chunks/{seq:012d}.arrow"
            # Marked chunks end between two commit ts (a batch may end with them, and
            # a transaction's rows of a table stay in one batch).
            piece = merged.take_whole_ts(rows) if marks else itertools.islice(merged, rows)
            tail = Tail(piece)
            counter = Counted(tail)
            size = write_records(self.directory / name, counter, self.batch_rows, fsync=self._fsync)
            if counter.count == 0:
                (self.directory / name).unlink()
                break
            self._manifest.next_chunk += 1
            chunks.append(ChunkInfo(name, buf.span_id, lo, hi, counter.count, size))
            last_ts.append(tail.last_ts)
            if counter.count < rows:
                break
        self._buffers.drop_exhausted_runs(buf)
        if marks and chunks:
            # In commit-ts order, no ts across two chunks: up to a chunk's last ts, every
            # event is in it or before it; after the last chunk, up to ``cut_ts``.
            uptos = [*last_ts[:-1], cut_ts]
            buf.catch_up_marks.extend((c.seq + 1, ts) for c, ts in zip(chunks, uptos, strict=True))
        elif marks:
            # Nothing new below ``cut_ts``: flushed up to it once the chunks so far are.
            buf.catch_up_marks.append((self._manifest.next_chunk, cut_ts))
        return chunks

    # -- chunks and progress ------------------------------------------------------------

    # Plain attribute reads below take no lock (atomic under the GIL), so that
    # status queries never wait behind a cut that writes chunk files.

    @property
    def published_ts(self) -> int:
        return self._manifest.published_ts

    @property
    def released_ts(self) -> int:
        return self._manifest.released_ts

    @property
    def checkpoint_ts(self) -> int:
        return self._manifest.checkpoint_ts

    @property
    def next_chunk(self) -> int:
        return self._manifest.next_chunk

    def chunks_between(self, start_ts: int, end_ts: int) -> list[ChunkInfo]:
        return [c for c in self._manifest.chunks if start_ts < c.hi <= end_ts]

    def chunks_in(self, start_seq: int, end_seq: int) -> list[ChunkInfo]:
        return [c for c in self._manifest.chunks if start_seq <= c.seq < end_seq]

    def chunk_count(self) -> int:
        return len(self._manifest.chunks)

    def chunk_bytes(self) -> int:
        return sum(c.size for c in self._manifest.chunks)

    def checkpoint(self, ts: int, next_chunk: int | None = None) -> None:
        """See :meth:`EventStore.checkpoint <cdcflow.core.data.logservice.store.EventStore.checkpoint>`."""
        moved = False
        if next_chunk is not None and next_chunk > self._checkpoint_chunk:
            self._checkpoint_chunk = self._manifest.checkpoint_chunk = next_chunk
            moved = True
        if ts > self._manifest.checkpoint_ts:
            self._manifest.checkpoint_ts = ts
            moved = True
        if moved:
            self._pass_catch_up_marks()
            # Durable, so that a restart reports it for the spans it covers.
            self._save()

    def _pass_catch_up_marks(self) -> None:
        for buf in self._buffers.replicating():
            marks = buf.catch_up_marks
            while marks and marks[0][0] <= self._checkpoint_chunk:
                buf.caught_up_ts = max(buf.caught_up_ts, marks.pop(0)[1])

    def caught_up_ts(self, span: Span) -> int:
        """See :meth:`EventStore.caught_up_ts <cdcflow.core.data.logservice.store.EventStore.caught_up_ts>`; no lock."""
        buf = self._buffers.get(span)
        return buf.caught_up_ts if buf is not None and buf.replicating else 0

    def release(self, ts: int, before_chunk: int | None = None) -> None:
        """See :meth:`EventStore.release <cdcflow.core.data.logservice.store.EventStore.release>`."""
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

    # -- manifest ---------------------------------------------------------------------

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
