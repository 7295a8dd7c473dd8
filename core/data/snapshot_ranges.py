"""Snapshot ranges: the parts of an initial snapshot, placed on a cluster's captures like spans.

When a changefeed with ``initial-snapshot: true`` starts on a cluster (more than one
live capture), its maintainer has the source plan the snapshot (one part per region,
or per ``snapshot-range-keys`` keys for TiKV) and hands every part's key range to the
scheduler as a unit of its own, next to nothing else: the two-phase scheduler places,
balances and recovers them exactly as it does spans (Absent → Prepare → Commit →
Replicating; a capture that dies has its unfinished ranges placed again). The capture
given a range reads it in Spark tasks and delivers it to every sink; only when every
range is delivered does the maintainer place the tables' spans, which stream from
the snapshot ts T (see :mod:`cdcflow.core.control.maintainer.maintainer`).

A range travels in the scheduling protocol as a :class:`~cdcflow.core.data.events.Span`
whose ``table_id`` is the table's id negated (table ids are positive; raw key-value
mode, table id 0, takes no snapshot), so that it never equals a span of the table and
the protocol, the agents and the schedulers carry it unchanged.

A capture reports a range it was told to replicate as ``REPLICATING`` with checkpoint
ts T and resolved ts T while it reads and delivers it, and resolved ts T + 1
(:func:`range_done_ts`) once the range is in every sink: the maintainer counts a range
done from that report.

The ranges delivered are kept in the metastore (:class:`SnapshotRecord`, written by the
coordinator from the maintainer's status), so that a maintainer started elsewhere (its
capture died, the changefeed was paused and resumed) places only the key ranges not
delivered yet (:func:`remaining`), and places the tables at once when the record says
the snapshot is complete.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cdcflow.core.data.events import Span

__all__ = [
    "SnapshotRecord",
    "is_snapshot_range",
    "merged",
    "range_batch_id",
    "range_done_ts",
    "range_keys",
    "range_name",
    "remaining",
    "snapshot_range",
]


def snapshot_range(keys: Span) -> Span:
    """The unit placed for the snapshot range ``keys`` (a part of table ``keys.table_id``)."""
    if keys.table_id <= 0:
        raise ValueError(f"a snapshot range needs a table: {keys}")
    return Span(-keys.table_id, keys.start, keys.end)


def is_snapshot_range(span: Span) -> bool:
    """Whether ``span`` is a snapshot range rather than a table's span."""
    return span.table_id < 0


def range_keys(span: Span) -> Span:
    """The table and key range a snapshot range reads (the span of the table it covers)."""
    return Span(-span.table_id, span.start, span.end)


def range_done_ts(ts: int) -> int:
    """The resolved ts a capture reports for a range of the snapshot at ``ts`` it delivered."""
    return ts + 1


def range_name(span: Span) -> str:
    """A file name for the range (its directory of parts on the capture reading it)."""
    keys = range_keys(span)
    return f"t{keys.table_id}-{zlib.crc32(keys.start + b'|' + keys.end):08x}"


def range_batch_id(span: Span) -> int:
    """The batch id the range's rows are delivered with: negative like the single-capture
    snapshot's (-1), distinct per range (so sinks that name files or partitions by batch
    id keep every range's rows) and the same on every capture that delivers it."""
    keys = range_keys(span)
    return -(1000 + (zlib.crc32(keys.table_id.to_bytes(8, "big") + keys.start + b"|" + keys.end)))


def merged(spans: Iterable[Span]) -> list[Span]:
    """The key ranges of ``spans`` with overlapping and adjacent ranges of a table joined,
    ordered by table and start key."""
    out: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.table_id, s.start)):
        last = out[-1] if out else None
        if last is not None and last.table_id == span.table_id and (not last.end or span.start <= last.end):
            end = b"" if not last.end or not span.end else max(last.end, span.end)
            out[-1] = Span(last.table_id, last.start, end)
        else:
            out.append(span)
    return out


def remaining(spans: Iterable[Span], done: Iterable[Span]) -> list[Span]:
    """The parts of the key ranges ``spans`` that no range of ``done`` (of the same table)
    covers: what is left to read of a snapshot whose ``done`` ranges were delivered, also
    when the ranges were cut differently (regions split or merged in between)."""
    covered: dict[int, list[Span]] = {}
    for span in merged(done):
        covered.setdefault(span.table_id, []).append(span)
    out: list[Span] = []
    for span in spans:
        start: bytes | None = span.start
        for cut in covered.get(span.table_id, ()):
            if start is None or (span.end and cut.start >= span.end):
                break
            if cut.end and cut.end <= start:
                continue
            if cut.start > start:
                out.append(Span(span.table_id, start, cut.start))
            # The rest starts where the cut ends; nothing is left when it reaches the end.
            start = None if not cut.end or (span.end and cut.end >= span.end) else cut.end
        if start is not None:
            out.append(Span(span.table_id, start, span.end))
    return out


@dataclass(frozen=True)
class SnapshotRecord:
    """What the metastore keeps of an initial snapshot shared by a cluster: its ts, the key
    ranges delivered to every sink (:func:`merged`, each a table's key range: table id
    positive), how many of the planned ranges and rows that was, and whether the snapshot is
    complete (every range delivered; the tables may stream from ``ts``)."""

    ts: int
    done: tuple[Span, ...] = ()
    #: Ranges delivered and planned (the progress's parts), rows delivered.
    parts_done: int = 0
    parts_total: int = 0
    rows_done: int = 0
    complete: bool = False
    #: When the snapshot started and was complete (wall clock, seconds; None until then)
    #: and its plan's unit, for its progress.
    started_at: float = 0.0
    finished_at: float | None = None
    unit: str = "range"

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "done": [[s.table_id, s.start.hex(), s.end.hex()] for s in self.done],
            "parts_done": self.parts_done,
            "parts_total": self.parts_total,
            "rows_done": self.rows_done,
            "complete": self.complete,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "unit": self.unit,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotRecord:
        done = tuple(Span(int(t), bytes.fromhex(a), bytes.fromhex(b)) for t, a, b in data.get("done", ()))
        return cls(
            int(data["ts"]),
            done,
            int(data.get("parts_done", 0)),
            int(data.get("parts_total", 0)),
            int(data.get("rows_done", 0)),
            bool(data.get("complete", False)),
            float(data.get("started_at", 0.0)),
            None if data.get("finished_at") is None else float(data["finished_at"]),
            str(data.get("unit", "range")),
        )
