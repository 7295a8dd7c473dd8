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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import Field

from cdcflow.core.errors import UnsupportedProtocolError
from cdcflow.core.events import (
    OpType,
    ResolvedEvent,
    RowChange,
    SourceEvent,
    Span,
    TableName,
    TableSchema,
    tso_from_ms,
    tso_physical_ms,
)
from cdcflow.core.plugin import PluginConfig, hookimpl
from cdcflow.core.source import Source

#: How far back a feed replays ticks at most.
HISTORY_S = 600


class TickerConfig(PluginConfig):
    tables: int = Field(2, description="Number of tables.")
    interval: float = Field(0.05, description="Seconds between ticks (rounded to whole milliseconds).")
    fail: bool = Field(False, description="Fail every feed with a fatal error.")
    replay: bool = Field(False, description="Replay the ticks that passed since a feed's start ts.")


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
        return [TableName("db", f"t{i}", i + 1) for i in range(self.config.tables)]

    async def spans_for(self, table: TableName) -> Sequence[Span]:
        return [Span(table.table_id, b"t%d" % table.table_id, b"t%d~" % table.table_id)]

    async def table_schema(self, table: TableName, ts: int) -> TableSchema:
        return TableSchema(table, ())

    async def feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        if self.config.fail:
            raise UnsupportedProtocolError("the ticker was told to fail")
        table = TableName("db", f"t{span.table_id - 1}", span.table_id)
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
                yield RowChange(table, OpType.INSERT, ts, ts - 1, {"id": k}, None)
                k += 1
                ts = tick_ts(k, interval)
            yield ResolvedEvent(span, tick_ts(k - 1, interval))


@hookimpl
def cdcflow_register_sources(registry: Any) -> None:
    registry.add(TickerSource)
