"""Tables created and dropped while a changefeed runs: the catalog polled ``AS OF SYSTEM TIME``.

CockroachDB streams no DDL to a changefeed client, so the source polls
``crdb_internal.tables`` every ``table-poll-interval`` seconds and compares
the descriptor ids it lists with those of the previous poll. The moment of a
change is then found exactly enough by bisection on the wall time, each probe
a catalog read ``AS OF SYSTEM TIME '<wall>.0'``: W is the first nanosecond at
which the table exists (created) or no longer exists (dropped), and the change
is at ``T = commit_ts(W, 0)``, so that ``tables_at(ts)`` — the tables that
exist at ``cursor_for(ts)`` — changes exactly at T:

* a created table's rows are those with commit ts above T (its feed starts from
  ``cursor_for(T)``, at which the table exists, as CockroachDB requires);
* a dropped table's rows all have commit ts at or below T (they precede the drop).

Not covered: rows committed in the CREATE TABLE's own transaction or within the
same 4 ns bucket just after it (below the new table's cursor), renames
(the descriptor id stays; rows keep going under the old name until a restart),
and a table dropped and created again under one id (CockroachDB never reuses ids).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from cdcflow.core.data.events import Span, TableName, TableSetChange
from cdcflow.plugins.sources.cockroachdb.catalog import Catalog
from cdcflow.plugins.sources.cockroachdb.hlc import HLC, cursor_for

__all__ = ["CREATE_TABLE", "DROP_TABLE", "TRIGGER_SPAN", "TableSet"]

#: The table-trigger span: no table's key range (descriptor id 0 is never a table's).
TRIGGER_SPAN = Span(0, b"/Table/0/", b"/Table/1/")
#: TiDB's action types of the DDL events (Open Protocol §2.6).
CREATE_TABLE, DROP_TABLE = 3, 4


class TableSet:
    """Which tables exist when, from the catalog."""

    def __init__(self, catalog: Catalog, *, poll_interval: float) -> None:
        self.catalog = catalog
        self.poll_interval = poll_interval
        #: (descriptor id, exists) → the wall time W found for it: the feeds and the poller ask alike.
        self._walls: dict[tuple[int, bool], int] = {}

    async def ids_at(self, at: HLC) -> dict[int, TableName]:
        return {t.table_id: t for t in await self.catalog.tables(at)}

    async def tables_at(self, ts: int) -> list[TableName]:
        """The tables that exist at ``cursor_for(ts)``."""
        return list((await self.ids_at(cursor_for(ts))).values())

    async def change_ts(self, table_id: int, *, exists: bool, lo_wall: int, hi_wall: int) -> int:
        """T of the table's creation (``exists``) or drop: the first wall W in (lo, hi] at which
        it exists (or not), as ``commit_ts(W, 0)``; it does not at ``(lo, 0)``, it does at ``(hi, 0)``."""
        key = (table_id, exists)
        if key not in self._walls:
            lo, hi = lo_wall, hi_wall
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if (table_id in await self.ids_at(HLC(mid, 0))) == exists:
                    hi = mid
                else:
                    lo = mid
            self._walls[key] = hi
        return HLC(self._walls[key], 0).commit_ts

    async def dropped_ts(self, table: TableName, since: HLC) -> int | None:
        """T of the drop of ``table`` (which existed at ``since``), None while it exists."""
        now = await self.catalog.now()
        if table.table_id in await self.ids_at(HLC(now.wall_ns, 0)):
            return None
        return await self.change_ts(table.table_id, exists=False, lo_wall=since.wall_ns, hi_wall=now.wall_ns)

    async def changes(self, start_ts: int) -> AsyncIterator[TableSetChange | int]:
        """Each change above ``start_ts`` in commit-ts order and, after each poll, the ts up to which
        every change is known (no later change is at or below it); forever."""
        at = cursor_for(start_ts)
        known = await self.ids_at(at)
        while True:
            now = await self.catalog.now()
            probe = HLC(now.wall_ns, 0)
            if probe > at:
                current = await self.ids_at(probe)
                found: dict[int, tuple[list[TableName], list[TableName]]] = {}
                for table_id in sorted(current.keys() - known.keys()):
                    ts = await self.change_ts(table_id, exists=True, lo_wall=at.wall_ns, hi_wall=probe.wall_ns)
                    found.setdefault(ts, ([], []))[0].append(current[table_id])
                for table_id in sorted(known.keys() - current.keys()):
                    ts = await self.change_ts(table_id, exists=False, lo_wall=at.wall_ns, hi_wall=probe.wall_ns)
                    found.setdefault(ts, ([], []))[1].append(known[table_id])
                for ts in sorted(found):
                    created, dropped = found[ts]
                    query = "; ".join([f"CREATE TABLE {t}" for t in created] + [f"DROP TABLE {t}" for t in dropped])
                    yield TableSetChange(ts, dropped=tuple(dropped), created=tuple(created), query=query)
                known, at = current, probe
                yield probe.commit_ts - 1
            await asyncio.sleep(self.poll_interval)
