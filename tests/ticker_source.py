"""A source for control-plane tests: N tables whose feeds insert a row and
resolve at the wall-clock TSO every few milliseconds, or fail on request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import Field

from cdcflow.core.errors import UnsupportedProtocolError
from cdcflow.core.events import OpType, ResolvedEvent, RowChange, SourceEvent, Span, TableName, TableSchema, tso_from_ms
from cdcflow.core.plugin import PluginConfig, hookimpl
from cdcflow.core.source import Source


class TickerConfig(PluginConfig):
    tables: int = Field(2, description="Number of tables.")
    interval: float = Field(0.05, description="Seconds between ticks.")
    fail: bool = Field(False, description="Fail every feed with a fatal error.")


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
        n = 0
        while True:
            await asyncio.sleep(self.config.interval)
            ts = tso_from_ms(int(time.time() * 1000))
            if ts > start_ts:
                n += 1
                yield RowChange(table, OpType.INSERT, ts - 1, ts - 2, {"id": n}, None)
                yield ResolvedEvent(span, ts)


@hookimpl
def cdcflow_register_sources(registry: Any) -> None:
    registry.add(TickerSource)
