"""A changefeed's tables and spans while tables come and go (seed 003's DDL barrier for table-set DDL).

The maintainer starts from the tables that existed at its checkpoint and
follows the source's table-set changes (:meth:`Source.table_changes
<cdcflow.core.data.source.Source.table_changes>`). A change committed at ``T``
(CREATE, DROP, TRUNCATE, RENAME TABLE) is carried out in three steps, so
that no row is lost and the DDL reaches the sinks before the new table's rows:

1. **Held at T.** From the moment the change is known, the changefeed's
   *barrier* is ``T``: no capture publishes past ``T``, and the checkpoint
   cannot pass it. The DDL itself is written by the span that carries it (the
   table-trigger span for a CREATE TABLE, the dropped table's own span for
   DROP or TRUNCATE) in the batch ending at ``T``.
2. **Applied at T.** Once the checkpoint is ``T`` — every span, the carrier
   included, flushed everything up to ``T`` — the spans of dropped tables are
   removed and those of created tables are added from ``T``: their rows are
   the ones committed after the DDL.
3. **Released.** When every added span replicates, the barrier moves on (to
   the next change, or to how far the changes are known). Until an added
   span's own checkpoint has caught up with the changefeed's, the checkpoint
   is held at the span's (the scheduler's watermark never goes back, so it may
   stand above a span that just joined).

Between changes the barrier is the resolved ts of the table-set changes: no
capture publishes what the maintainer could not yet check for a table-set
change (seed 003: the global resolved ts is bounded by the DDL puller's).
A changefeed whose source has a fixed table set has no barrier.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cdcflow.core.control.scheduling import ReplicationState, SpanReplication
from cdcflow.core.data.events import Span, TableName, TableSetChange
from cdcflow.core.data.filter import TableFilter

__all__ = ["ChangefeedTables", "TableSpans"]

#: A table and the spans that hold its rows.
TableSpans = Mapping[TableName, Sequence[Span]]


@dataclass(frozen=True, slots=True)
class _Change:
    """A table-set change that concerns the changefeed, not yet applied."""

    commit_ts: int
    dropped: tuple[TableName, ...]
    created: tuple[tuple[TableName, tuple[Span, ...]], ...]
    query: str


class ChangefeedTables:
    """The tables a changefeed replicates now, the changes still to carry out, and the barrier.

    ``trigger``: the source's table-trigger span (always replicated), or None
    for a fixed table set; then nothing is followed and :meth:`barrier` is None.
    """

    def __init__(self, table_filter: TableFilter, tables: TableSpans, trigger: Span | None, start_ts: int) -> None:
        self.filter = table_filter
        self.trigger = trigger
        self._tables: dict[TableName, tuple[Span, ...]] = {t: tuple(s) for t, s in tables.items()}
        #: The tables once every received change is applied (what later changes are checked against).
        self._future: dict[TableName, tuple[Span, ...]] = dict(self._tables)
        self._changes: collections.deque[_Change] = collections.deque()
        #: How far the table-set changes are known (None: the table set is fixed).
        self.resolved_ts: int | None = start_ts if trigger is not None else None
        #: Spans added by a change, by its commit ts: until they replicate (barrier) …
        self._unplaced: dict[Span, int] = {}
        #: … and until their checkpoint reaches the changefeed's (checkpoint cap).
        self._joining: dict[Span, int] = {}

    @property
    def followed(self) -> bool:
        """Whether the table set is followed (the source reports its changes)."""
        return self.resolved_ts is not None

    def spans(self) -> list[Span]:
        """Every span to replicate now: the trigger span, then each table's."""
        out = [self.trigger] if self.trigger is not None else []
        seen = set(out)
        for spans in self._tables.values():
            for span in spans:
                if span not in seen:
                    seen.add(span)
                    out.append(span)
        return out

    def tables(self) -> list[TableName]:
        return sorted(self._tables)

    # -- what the source reports -------------------------------------------------------

    def receive(self, change: TableSetChange, created: TableSpans) -> bool:
        """A table-set change (in commit order) with the spans of its created tables
        that the filter matches; returns whether it concerns the changefeed."""
        dropped = tuple(t for t in change.dropped if t in self._future)
        added = tuple(
            (t, tuple(spans))
            for t, spans in created.items()
            if self.filter.matches(t.schema, t.table) and self._future.get(t) != tuple(spans)
        )
        if not dropped and not added:
            return False
        for table in dropped:
            del self._future[table]
        self._future.update(added)
        self._changes.append(_Change(change.commit_ts, dropped, added, change.query))
        return True

    def resolve(self, ts: int) -> None:
        """No table-set change at or below ``ts`` is still to come."""
        if self.resolved_ts is not None:
            self.resolved_ts = max(self.resolved_ts, ts)

    # -- carrying changes out ----------------------------------------------------------

    def next_change(self) -> tuple[int, str] | None:
        """Commit ts and DDL text of the first change still to apply."""
        return (self._changes[0].commit_ts, self._changes[0].query) if self._changes else None

    def apply_due(self, checkpoint_ts: int) -> list[int]:
        """Apply the changes committed at or below ``checkpoint_ts``; return their commit ts."""
        applied = []
        while self._changes and self._changes[0].commit_ts <= checkpoint_ts:
            change = self._changes.popleft()
            before = set(self.spans())
            for table in change.dropped:
                self._tables.pop(table, None)
            for table, spans in change.created:
                self._tables[table] = spans
            for span in set(self.spans()) - before:
                self._unplaced[span] = self._joining[span] = change.commit_ts
            for span in before - set(self.spans()):
                self._unplaced.pop(span, None)
                self._joining.pop(span, None)
            applied.append(change.commit_ts)
        return applied

    def settle(self, statuses: Iterable[SpanReplication], watermark_ts: int | None) -> None:
        """Take the scheduler's view of the spans added by changes: one that replicates
        no longer holds the barrier; one whose checkpoint reached ``watermark_ts`` (the
        scheduler's) no longer caps the checkpoint."""
        for status in statuses:
            if status.span not in self._joining:
                continue
            if status.state is ReplicationState.REPLICATING:
                self._unplaced.pop(status.span, None)
                if watermark_ts is not None and status.checkpoint_ts >= watermark_ts:
                    del self._joining[status.span]

    @property
    def joining(self) -> bool:
        """Whether spans added by a change have not yet caught up."""
        return bool(self._joining)

    def barrier(self) -> int | None:
        """The ts no capture may publish past: how far changes are known, and no further
        than a change not yet carried out (None for a fixed table set)."""
        if self.resolved_ts is None:
            return None
        barrier = self.resolved_ts
        if self._changes:
            barrier = min(barrier, self._changes[0].commit_ts)
        if self._unplaced:
            barrier = min(barrier, *self._unplaced.values())
        return barrier

    def checkpoint_cap(self, statuses: Mapping[Span, SpanReplication]) -> int | None:
        """The highest checkpoint the changefeed may report: the barrier, and no more
        than the checkpoint of a span that joined and has not caught up."""
        cap = self.barrier()
        for span, since in self._joining.items():
            status = statuses.get(span)
            ts = since if status is None else max(since, status.checkpoint_ts)
            cap = ts if cap is None else min(cap, ts)
        return cap
