"""The ``tikv`` source plugin class."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from cdcflow.core.errors import NotAvailableError
from cdcflow.core.events import SourceEvent, Span, TableName, TableSchema
from cdcflow.core.plugin import Registrar, hookimpl
from cdcflow.core.source import Source
from cdcflow.plugins.sources.tikv.config import TiKVSourceConfig

__all__ = ["TiKVSource", "cdcflow_register_sources"]

_NOT_YET = "the TiKV EventFeed client is not available in this build of cdcflow yet"


class TiKVSource(Source[TiKVSourceConfig]):
    """TiKV EventFeed source (PD regions, TSO and GC safepoints; TiDB row decoding)."""

    type_name = "tikv"
    Config = TiKVSourceConfig
    yields_raw_kv = True

    async def list_tables(self) -> Sequence[TableName]:
        raise NotAvailableError(_NOT_YET)

    async def spans_for(self, table: TableName) -> Sequence[Span]:
        raise NotAvailableError(_NOT_YET)

    async def table_schema(self, table: TableName, ts: int) -> TableSchema:
        raise NotAvailableError(_NOT_YET)

    def feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        raise NotAvailableError(_NOT_YET)


@hookimpl
def cdcflow_register_sources(registry: Registrar[Source[Any]]) -> None:
    registry.add(TiKVSource)
