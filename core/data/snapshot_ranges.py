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
"""

from __future__ import annotations

import zlib

from cdcflow.core.data.events import Span

__all__ = [
    "is_snapshot_range",
    "range_batch_id",
    "range_done_ts",
    "range_keys",
    "range_name",
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
