"""A source for control-plane tests: N tables that each commit one row per
tick, on a fixed grid of the wall clock, or fail on request.

The content is deterministic, so a test can compute what the downstream must
hold: tick ``k`` commits, in every table, the row ``{"id": k}`` at
``commit_ts = tick_ts(k, interval)`` (``start_ts`` one less). With ``replay``
on, a feed started at ``start_ts`` first replays every tick after ``start_ts``
that already passed (older than ``HISTORY_S`` seconds: skipped, so that a feed
from ts 0 does not replay the epoch), so that the rows up to any ts are known;
off, it starts at the clock (ticks while no feed ran are never seen). Then it
follows the clock, resolving each tick's ts after its row.

``created`` makes tables appear while a changefeed runs: table ``i`` is
created by a CREATE TABLE committed at ``created[i]`` (a TSO) and commits
rows only at ticks above it. The source then has a table-trigger span (its
feed carries the CREATE TABLEs) and reports the creations as table-set
changes, resolved on the tick grid.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import Field

from cdcflow.core.data.events import (
    DDLEvent,
    OpType,
    ResolvedEvent,
    RowChange,
    SourceEvent,
    Span,
    TableName,
    TableSchema,
    TableSetChange,
    tso_from_ms,
    tso_physical_ms,
)
from cdcflow.core.data.source import Source
from cdcflow.core.errors import UnsupportedProtocolError
from cdcflow.core.plugin import PluginConfig, hookimpl

#: How far back a feed replays ticks at most.
HISTORY_S = 600


class TickerConfig(PluginConfig):
    tables: int = Field(2, description="Number of tables.")
    interval: float = Field(0.05, description="Seconds between ticks (rounded to whole milliseconds).")
    fail: bool = Field(False, description="Fail every feed with a fatal error.")
    replay: bool = Field(False, description="Replay the ticks that passed since a feed's start ts.")
    created: dict[int, int] = Field(
        default_factory=dict, description="Table index → commit ts of its CREATE TABLE (others exist from the start)."
    )


#: The table-trigger span of a ticker with ``created`` tables.
TRIGGER = Span(0, b"ddl", b"ddl~")
#: TiDB's ActionType of CREATE TABLE.
CREATE_TABLE = 3


def table_name(i: int) -> TableName:
    return TableName("db", f"t{i}", i + 1)


def create_query(i: int) -> str:
    return f"CREATE TABLE `db`.`t{i}` (`id` bigint PRIMARY KEY)"


def interval_ms(interval: float) -> int:
    return max(1, round(interval * 1000))


def tick_ts(k: int, interval: float) -> int:
    """The commit ts of tick ``k``'s rows."""
    return tso_from_ms(k * interval_ms(interval))


def first_tick_after(ts: int, interval: float) -> int:
    """The first tick whose commit ts is above ``ts``."""
    step = interval_ms(interval)
    k = tso_physical_ms(ts) // step
    while tick_ts(k, interval) <= ts:
        k += 1
    return k


class TickerSource(Source[TickerConfig]):
    """Test source (see the module docstring)."""

    type_name = "ticker"
    Config = TickerConfig

    async def list_tables(self) -> Sequence[TableName]:
        return await self.tables_at(tso_from_ms(int(time.time() * 1000)))

    def _count(self) -> int:
        return max([self.config.tables, *(i + 1 for i in self.config.created)])

    async def tables_at(self, ts: int) -> Sequence[TableName]:
        return [table_name(i) for i in range(self._count()) if self.config.created.get(i, 0) <= ts]

    def trigger_span(self) -> Span | None:
        return TRIGGER if self.config.created else None

    def table_changes(self, start_ts: int) -> AsyncIterator[TableSetChange | ResolvedEvent] | None:
        return self._table_changes(start_ts) if self.config.created else None

    async def _table_changes(self, start_ts: int) -> AsyncIterator[TableSetChange | ResolvedEvent]:
        async for ddl in self._ddl_feed(start_ts):
            if isinstance(ddl, DDLEvent):
                assert ddl.table is not None
                yield TableSetChange(ddl.commit_ts, created=(ddl.table,), query=ddl.query)
            else:
                yield ddl

    async def _ddl_feed(self, start_ts: int) -> AsyncIterator[DDLEvent | ResolvedEvent]:
        """The CREATE TABLEs above ``start_ts`` as the clock passes them, resolved on the tick grid."""
        creations = sorted((ts, i) for i, ts in self.config.created.items() if ts > start_ts)
        async for resolved in self._clock(start_ts):
            while creations and creations[0][0] <= resolved:
                ts, i = creations.pop(0)
                yield DDLEvent(ts, create_query(i), table_name(i), CREATE_TABLE)
            yield ResolvedEvent(TRIGGER, resolved)

    async def _clock(self, start_ts: int) -> AsyncIterator[int]:
        """The ts of each tick from the first above ``start_ts``, as the clock passes it."""
        k = first_tick_after(start_ts, self.config.interval)
        while True:
            ts = tick_ts(k, self.config.interval)
            now = tso_from_ms(int(time.time() * 1000))
            if ts > now:
                await asyncio.sleep((tso_physical_ms(ts) - tso_physical_ms(now)) / 1000)
                continue
            yield ts
            k += 1

    async def spans_for(self, table: TableName) -> Sequence[Span]:
        return [Span(table.table_id, b"t%d" % table.table_id, b"t%d~" % table.table_id)]

    async def table_schema(self, table: TableName, ts: int) -> TableSchema:
        return TableSchema(table, ())

    async def feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        if self.config.fail:
            raise UnsupportedProtocolError("the ticker was told to fail")
        if span == TRIGGER:
            async for event in self._ddl_feed(start_ts):
                yield event
            return
        table = table_name(span.table_id - 1)
        created = self.config.created.get(span.table_id - 1, 0)
        interval = self.config.interval
        history = HISTORY_S if self.config.replay else 0
        horizon = tso_from_ms(int((time.time() - history) * 1000))
        k = first_tick_after(max(start_ts, horizon), interval)
        while True:
            now = tso_from_ms(int(time.time() * 1000))
            ts = tick_ts(k, interval)
            if ts > now:
                await asyncio.sleep((tso_physical_ms(ts) - tso_physical_ms(now)) / 1000)
                continue
            # Every tick that passed: its row, then one resolved ts for all of them.
            while ts <= now:
                if ts > created:
                    yield RowChange(table, OpType.INSERT, ts, ts - 1, {"id": k}, None)
                k += 1
                ts = tick_ts(k, interval)
            yield ResolvedEvent(span, tick_ts(k - 1, interval))


@hookimpl
def cdcflow_register_sources(registry: Any) -> None:
    registry.add(TickerSource)
