"""The ``cockroachdb`` source: CockroachDB's rangefeeds through sinkless changefeeds over pgwire.

One span per table; each span's feed is a sinkless ``CREATE CHANGEFEED`` on a
dedicated connection (psycopg 3), from ``cursor`` = the span's checkpoint,
converted row by row by :func:`~.convert.convert_row` (a pure function of the
rows and the catalog schemas). Resolved rows become the span's resolved ts
(rounded down, never backwards). A retryable error (connection lost, 40001,
draining, RangeFeedRetryError) reconnects from the last resolved HLC with
backoff, skipping the rows it already yielded above that HLC; a column change
stops the feed after the rows below it (``schema_change_policy='stop'``) and
the source yields the DDL with the schema as of its ts before starting again
from it. See
docs/how-to/replicate-from-cockroachdb.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import tenacity

from cdcflow.core.data.events import (
    DDLEvent,
    ResolvedEvent,
    RowChange,
    SourceEvent,
    Span,
    TableName,
    TableSchema,
    TableSetChange,
)
from cdcflow.core.data.source import Source
from cdcflow.core.errors import ConfigInvalidError, PDUnavailableError
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.plugins.sources.cockroachdb.catalog import Catalog
from cdcflow.plugins.sources.cockroachdb.config import CockroachDBSourceConfig
from cdcflow.plugins.sources.cockroachdb.convert import FeedRow, Resolved, convert_row
from cdcflow.plugins.sources.cockroachdb.ddl import column_ddl, create_table_ddl, drop_table_ddl
from cdcflow.plugins.sources.cockroachdb.errors import ErrorKind, classify, redact_dsn, to_cdcflow_error
from cdcflow.plugins.sources.cockroachdb.hlc import HLC, cursor_for, resolved_ts
from cdcflow.plugins.sources.cockroachdb.options import changefeed_statement
from cdcflow.plugins.sources.cockroachdb.tableset import CREATE_TABLE, DROP_TABLE, TRIGGER_SPAN, TableSet

__all__ = ["CockroachDBSource", "cdcflow_register_sources", "table_span"]

log = logging.getLogger(__name__)

#: Backoff between reconnects: 0.1 s doubling to 10 s, with jitter (tenacity's strategy).
_BACKOFF = tenacity.wait_exponential_jitter(multiplier=0.1, max=10.0, jitter=0.1)


def table_span(table_id: int) -> Span:
    """The span of a CockroachDB table: its descriptor id's key range ``/Table/<id>``."""
    return Span(table_id, f"/Table/{table_id}/".encode(), f"/Table/{table_id + 1}/".encode())


def _backoff_seconds(attempt: int) -> float:
    state = tenacity.RetryCallState(retry_object=tenacity.AsyncRetrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    return float(_BACKOFF(state))


class _Yielded:
    """The rows a feed yielded above its cursor: a reconnect from that cursor sends them again."""

    def __init__(self) -> None:
        self._rows: set[tuple[int, int, bytes]] = set()

    def first_time(self, row: RowChange) -> bool:
        """True the first time a version of a key comes (and remember it)."""
        mark = (row.commit_ts, row.start_ts, row.key)
        if mark in self._rows:
            return False
        self._rows.add(mark)
        return True

    def cursor_at(self, hlc: HLC) -> HLC:
        """Forget the rows at or below ``hlc``, the new cursor (returned): no feed from it sends them."""
        if self._rows:
            bound = (hlc.commit_ts, hlc.start_ts)
            self._rows = {row for row in self._rows if (row[0], row[1]) > bound}
        return hlc


class CockroachDBSource(Source[CockroachDBSourceConfig]):
    """CockroachDB source: a sinkless changefeed per table span, rows typed from the catalog."""

    type_name = "cockroachdb"
    Config = CockroachDBSourceConfig
    yields_raw_kv = False

    def __init__(self, config: CockroachDBSourceConfig) -> None:
        super().__init__(config)
        self._dsn = config.dsn
        self._catalog: Catalog | None = None
        self._tableset: TableSet | None = None
        self._tables: dict[int, TableName] = {}

    @classmethod
    def snapshot_refusal(cls, config: PluginConfig) -> str | None:
        """Not mapped onto ``initial_scan``: CockroachDB scans at the cursor (the changefeed's
        start ts) and emits the rows with that ts, which the log service drops as at or below
        the span's checkpoint; and every feed start (a span moving, a restart) would scan again."""
        return (
            "the cockroachdb source does not take initial snapshots: CockroachDB's initial_scan emits the "
            "rows at the changefeed's start ts, which cdcflow treats as already replicated. Copy the tables "
            "first (for example EXPORT / IMPORT) and start the changefeed at the copy's ts, or leave "
            "initial-snapshot off"
        )

    async def open(self) -> None:
        options = self.config.embedded_playground()
        if options is not None:
            # Imported here: only sources configured to embed it need the playground.
            from cdcflow.plugins.sources.cockroach_playground.embedded import embedded_cockroach

            pg = await asyncio.to_thread(embedded_cockroach, rate=options.rate, seed=options.seed)
            self._dsn = pg.dsn
        self._catalog = Catalog(
            self._dsn, sql_schema=self.config.sql_schema, connect_timeout=self.config.connect_timeout
        )
        self._tableset = TableSet(self._catalog, poll_interval=self.config.table_poll_interval)
        log.info("cockroachdb source: reading %s", redact_dsn(self._dsn))

    async def close(self) -> None:
        if self._catalog is not None:
            await self._catalog.close()

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            raise RuntimeError("the cockroachdb source is not open")
        return self._catalog

    async def _catalog_call(self, what: str, call: Any) -> Any:
        try:
            return await call
        except psycopg.Error as exc:
            if classify(exc) is ErrorKind.RETRY:
                raise PDUnavailableError(
                    f"cockroachdb source: {what}: CockroachDB is unreachable: {redact_dsn(str(exc))}"
                ) from exc
            raise to_cdcflow_error(exc, table=what) from exc

    async def list_tables(self) -> Sequence[TableName]:
        tables = await self._catalog_call("listing tables", self.catalog.tables())
        self._tables.update({t.table_id: t for t in tables})
        return list(tables)

    # -- tables created and dropped while running (see .tableset)
    @property
    def tableset(self) -> TableSet:
        if self._tableset is None:
            raise RuntimeError("the cockroachdb source is not open")
        return self._tableset

    def trigger_span(self) -> Span | None:
        """The table-trigger span: its feed carries the CREATE TABLEs, at the catalog's pace."""
        return TRIGGER_SPAN

    async def tables_at(self, ts: int) -> Sequence[TableName]:
        tables: list[TableName] = await self._catalog_call("listing tables", self.tableset.tables_at(ts))
        self._tables.update({t.table_id: t for t in tables})
        return tables

    def table_changes(self, start_ts: int) -> AsyncIterator[TableSetChange | ResolvedEvent] | None:
        return self._table_changes(start_ts)

    async def _table_changes(self, start_ts: int) -> AsyncIterator[TableSetChange | ResolvedEvent]:
        async for change in self.tableset.changes(start_ts):
            if isinstance(change, TableSetChange):
                self._tables.update({t.table_id: t for t in change.created})
                log.info("cockroachdb source: %s at %d", change.query, change.commit_ts)
                yield change
            else:
                yield ResolvedEvent(TRIGGER_SPAN, change)

    async def _trigger_feed(self, start_ts: int) -> AsyncIterator[SourceEvent]:
        """CREATE TABLE of every table created above ``start_ts`` at its ts (no feed of it exists yet)."""
        async for change in self.tableset.changes(start_ts):
            if isinstance(change, TableSetChange):
                for table in change.created:
                    schema = await self._schema_at(table, cursor_for(change.commit_ts))
                    yield DDLEvent(change.commit_ts, create_table_ddl(schema), table, CREATE_TABLE, schema)
            else:
                yield ResolvedEvent(TRIGGER_SPAN, change)

    async def _after_drop(self, span: Span, table: TableName, ts: int) -> AsyncIterator[SourceEvent]:
        """The DROP TABLE at ``ts`` (its rows are all below it), then resolved ts until the span is removed."""
        log.info("cockroachdb source: table %s dropped at %d", table, ts)
        yield DDLEvent(ts, drop_table_ddl(table.schema, table.table), table, DROP_TABLE)
        while True:
            yield ResolvedEvent(span, max(ts, await self.current_ts() - 1))
            await asyncio.sleep(self.config.resolved_interval)

    async def spans_for(self, table: TableName) -> Sequence[Span]:
        if table.table_id <= 0:
            named = [t for t in await self.list_tables() if t.table == table.table]
            if not named:
                raise ConfigInvalidError(f"cockroachdb source: CockroachDB has no table {table}")
            table = named[0]
        self._tables[table.table_id] = table
        return [table_span(table.table_id)]

    async def table_schema(self, table: TableName, ts: int) -> TableSchema:
        return await self._schema_at(table, cursor_for(ts))

    async def _schema_at(self, table: TableName, at: HLC) -> TableSchema:
        try:
            schema: TableSchema = await self._catalog_call(str(table), self.catalog.schema(table, at))
        except LookupError:
            # The table is younger than ``at`` (or AS OF SYSTEM TIME is refused): its current schema.
            schema = await self._catalog_call(str(table), self.catalog.schema(table, None))
        return schema

    async def current_ts(self) -> int:
        now: HLC = await self._catalog_call("reading the cluster time", self.catalog.now())
        return now.commit_ts

    async def _table_of(self, span: Span) -> TableName:
        if span.table_id not in self._tables:
            await self.list_tables()
        table = self._tables.get(span.table_id)
        if table is None:
            raise ConfigInvalidError(f"cockroachdb source: no table has descriptor id {span.table_id} ({span})")
        return table

    def feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        """Rows of ``span``'s table above ``start_ts``, DDL at column and table-set changes, and resolved ts."""
        return self._trigger_feed(start_ts) if span == TRIGGER_SPAN else self._table_feed(span, start_ts)

    async def _table_feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:  # noqa: PLR0912, PLR0915
        table = await self._table_of(span)
        cursor = cursor_for(start_ts)
        resolved = start_ts
        schema = await self._schema_at(table, cursor)
        attempt = 0
        last_progress = time.monotonic()
        # Skipped when a reconnect sends them again: the sinks see each version once while this feed runs.
        yielded = _Yielded()
        while True:
            statement = changefeed_statement(
                table.table,
                cursor,
                resolved_seconds=self.config.resolved_interval,
                initial_scan=self.config.initial_scan,
                sql_schema=self.config.sql_schema,
            )
            try:
                async for item in self._stream(statement, table, schema):
                    if isinstance(item, Resolved):
                        attempt, last_progress = 0, time.monotonic()
                        cursor = yielded.cursor_at(max(cursor, item.hlc))
                        ts = resolved_ts(item.hlc)
                        if ts > resolved:
                            resolved = ts
                            yield ResolvedEvent(span, ts)
                    elif yielded.first_time(item):
                        yield item
                raise ConnectionResetError("the changefeed ended")  # a sinkless feed never ends by itself
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                kind = classify(exc)
                dropped = await self.tableset.dropped_ts(table, cursor) if kind is not ErrorKind.RETRY else None
                if dropped is not None:
                    async for event in self._after_drop(span, table, dropped):
                        yield event
                if kind is ErrorKind.SCHEMA_CHANGE:
                    at = HLC.find_in(str(exc))
                    if at is None:
                        raise to_cdcflow_error(exc, table=str(table), cursor=str(cursor)) from exc
                    new = await self._schema_at(table, at)
                    ts = at.commit_ts
                    if ts - 1 > resolved:
                        resolved = ts - 1
                        yield ResolvedEvent(span, resolved)
                    for query in column_ddl(schema, new):
                        yield DDLEvent(ts, query, table, schema_after=new)
                    schema, cursor = new, yielded.cursor_at(max(cursor, at))
                    attempt, last_progress = 0, time.monotonic()
                    continue
                if kind is ErrorKind.RETRY:
                    attempt += 1
                    if time.monotonic() - last_progress > self.config.retry_budget:
                        raise PDUnavailableError(
                            f"cockroachdb source: the feed of {table} made no progress for "
                            f"{self.config.retry_budget:.0f} s: {redact_dsn(str(exc))}",
                            detail={"table": str(table), "cursor": str(cursor)},
                        ) from exc
                    delay = _backoff_seconds(attempt)
                    log.warning(
                        "cockroachdb source: feed of %s lost (%s); reconnecting from %s in %.2f s",
                        table,
                        redact_dsn(str(exc).strip()),
                        cursor,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                ttl = await self.catalog.gc_ttl_seconds(table.table) if kind is ErrorKind.GC_STALE else None
                raise to_cdcflow_error(exc, table=str(table), cursor=str(cursor), gc_ttl_seconds=ttl) from exc

    async def _stream(self, statement: str, table: TableName, schema: TableSchema) -> AsyncIterator[Any]:
        """One changefeed session on its own connection, closed when the stream stops (move, remove, error)."""
        conn = await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=int(self.config.connect_timeout)
        )
        schemas = {table.table: schema}
        try:
            async with conn.cursor() as cur:
                async for name, key, value in cur.stream(statement):
                    item: RowChange | Resolved = convert_row(FeedRow(name, key, value), schemas)
                    yield item
        finally:
            # Closing the connection is how a sinkless changefeed is cancelled.
            await conn.close()


@hookimpl
def cdcflow_register_sources(registry: Registrar[Source[Any]]) -> None:
    registry.add(CockroachDBSource)
