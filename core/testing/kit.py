"""A test kit for plugin authors: an in-memory list source, a list sink, and a
driver that runs one through the other without any infrastructure (STYLE §15).

Typical test of a third-party sink::

    from cdcflow.core.testing import ListSource, drive, insert

    source = ListSource.of([insert("shop", "orders", {"id": 1}, commit_ts=10), ListSource.resolved(20)])
    result = asyncio.run(drive(source, [MySink(MySink.Config())]))
    assert result.checkpoint_ts == 20

The driver keeps the runtime's contract: batches cover ``(previous, resolved]``
in ``(commit_ts, start_ts, key)`` order, end at DDL barriers, and the
checkpoint only moves after every sink returned; then every sink gets it
through ``write_checkpoint`` (the driver runs every span of the changefeed,
so its frontier is the changefeed checkpoint). :class:`ListSink` can crash
on a chosen batch, so that a test can check that a plugin recovers by replay.
"""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field

from cdcflow.core.data.events import (
    DDLEvent,
    MicroBatch,
    OpType,
    ResolvedEvent,
    RowChange,
    SourceEvent,
    Span,
    TableName,
    TableSchema,
    TableSetChange,
)
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.frontier import SpanFrontier
from cdcflow.core.data.sink import Sink, SinkContext
from cdcflow.core.data.source import Source
from cdcflow.core.plugin import PluginConfig

if TYPE_CHECKING:
    from cdcflow.core.plugin.manager import PluginManager

__all__ = [
    "DriveResult",
    "ListSink",
    "ListSinkConfig",
    "ListSource",
    "ListSourceConfig",
    "SimulatedCrash",
    "create_table",
    "delete",
    "drive",
    "drop_table",
    "insert",
    "update",
]

#: TiDB's ActionType numbers (Open Protocol §2.6) of the DDL the list source follows.
CREATE_TABLE = 3
DROP_TABLE = 4


def _table(schema: str, table: str) -> TableName:
    # A stable id (not hash(), which is salted per process) so that runs and
    # processes agree on a table's span.
    return TableName(schema, table, table_id=zlib.crc32(f"{schema}.{table}".encode()) + 1)


def insert(
    schema: str, table: str, row: Mapping[str, Any], *, commit_ts: int, start_ts: int | None = None
) -> RowChange:
    """A row insert of ``schema.table`` committed at ``commit_ts``."""
    return RowChange(_table(schema, table), OpType.INSERT, commit_ts, start_ts or commit_ts - 1, dict(row), None)


def update(
    schema: str,
    table: str,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    *,
    commit_ts: int,
    start_ts: int | None = None,
) -> RowChange:
    """A row update of ``schema.table`` committed at ``commit_ts``."""
    return RowChange(
        _table(schema, table), OpType.UPDATE, commit_ts, start_ts or commit_ts - 1, dict(after), dict(before)
    )


def delete(
    schema: str, table: str, before: Mapping[str, Any], *, commit_ts: int, start_ts: int | None = None
) -> RowChange:
    """A row delete of ``schema.table`` committed at ``commit_ts``."""
    return RowChange(_table(schema, table), OpType.DELETE, commit_ts, start_ts or commit_ts - 1, None, dict(before))


def create_table(schema: str, table: str, *, commit_ts: int) -> DDLEvent:
    """CREATE TABLE ``schema.table`` committed at ``commit_ts``: in a :class:`ListSource`,
    the table exists from then on (:meth:`ListSource.tables_at`)."""
    name = _table(schema, table)
    return DDLEvent(commit_ts, f"CREATE TABLE `{schema}`.`{table}` (`id` bigint PRIMARY KEY)", name, CREATE_TABLE)


def drop_table(schema: str, table: str, *, commit_ts: int) -> DDLEvent:
    """DROP TABLE ``schema.table`` committed at ``commit_ts``: its rows end there."""
    return DDLEvent(commit_ts, f"DROP TABLE `{schema}`.`{table}`", _table(schema, table), DROP_TABLE)


class ListSourceConfig(PluginConfig):
    """The list source takes its events from code, not from configuration."""

    chunk: int = Field(0, ge=0, description="Yield to the event loop after this many events; 0 never.")


@dataclass(frozen=True, slots=True)
class _ResolvedAll:
    ts: int


class ListSource(Source[ListSourceConfig]):
    """An in-memory source: row changes, DDL and resolved markers from a list.

    Each table gets one span. :meth:`resolved` makes a marker that resolves
    every span at once; a :class:`~cdcflow.core.data.events.ResolvedEvent` resolves
    one span. A feed started at ``start_ts`` skips changes at or below it, as
    a real upstream does.

    With :func:`create_table` / :func:`drop_table` events in the list, the
    table set changes over time, as with a TiDB upstream: a table exists from
    its CREATE to its DROP (:meth:`tables_at`), :meth:`table_changes` reports
    both (resolved by the resolve-all markers), and the :meth:`trigger_span`'s
    feed carries the CREATE TABLEs. A table's own feed carries all of its DDL.
    """

    type_name = "list"
    Config = ListSourceConfig
    #: The table-trigger span of a list with CREATE/DROP TABLE events.
    TRIGGER = Span(0, b"ddl", b"ddl~")

    def __init__(self, config: ListSourceConfig, events: Iterable[Any] = ()) -> None:
        super().__init__(config)
        self.events: list[Any] = list(events)
        self._tables: dict[TableName, Span] = {}
        #: Commit ts of each table's CREATE and DROP TABLE events.
        self._created: dict[TableName, int] = {}
        self._dropped: dict[TableName, int] = {}
        for event in self.events:
            table = getattr(event, "table", None)
            if isinstance(table, TableName) and table not in self._tables:
                self._tables[table] = Span(table.table_id, b"t%d" % table.table_id, b"t%d~" % table.table_id)
            if _table_set_action(event) == CREATE_TABLE:
                self._created[event.table] = event.commit_ts
            elif _table_set_action(event) == DROP_TABLE:
                self._dropped[event.table] = event.commit_ts

    @classmethod
    def of(cls, events: Iterable[Any], **options: Any) -> ListSource:
        return cls(ListSourceConfig(**options), events)

    @staticmethod
    def resolved(ts: int) -> Any:
        """A marker resolving every span of the source at ``ts``."""
        return _ResolvedAll(ts)

    async def list_tables(self) -> Sequence[TableName]:
        return sorted(self._tables)

    async def spans_for(self, table: TableName) -> Sequence[Span]:
        return [self._tables[table]]

    async def table_schema(self, table: TableName, ts: int) -> TableSchema:
        return TableSchema(table, ())

    def trigger_span(self) -> Span | None:
        return self.TRIGGER if self._created or self._dropped else None

    async def tables_at(self, ts: int) -> Sequence[TableName]:
        """The tables created at or before ``ts`` (or never) and not dropped by then."""
        never = 1 << 64
        return [t for t in sorted(self._tables) if self._created.get(t, 0) <= ts < self._dropped.get(t, never)]

    def table_changes(self, start_ts: int) -> AsyncIterator[TableSetChange | ResolvedEvent] | None:
        return self._table_changes(start_ts) if self.trigger_span() is not None else None

    async def _table_changes(self, start_ts: int) -> AsyncIterator[TableSetChange | ResolvedEvent]:
        for event in self.events:
            if isinstance(event, _ResolvedAll):
                if event.ts > start_ts:
                    yield ResolvedEvent(self.TRIGGER, event.ts)
                continue
            action = _table_set_action(event)
            if action is None or event.commit_ts <= start_ts:
                continue
            if action == CREATE_TABLE:
                yield TableSetChange(event.commit_ts, created=(event.table,), query=event.query)
            else:
                yield TableSetChange(event.commit_ts, dropped=(event.table,), query=event.query)

    async def feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        trigger = span == self.trigger_span()
        for n, event in enumerate(self.events, 1):
            if self.config.chunk and n % self.config.chunk == 0:
                await asyncio.sleep(0)
            if isinstance(event, _ResolvedAll):
                if event.ts > start_ts:
                    yield ResolvedEvent(span, event.ts)
            elif isinstance(event, ResolvedEvent):
                if event.span == span and event.ts > start_ts:
                    yield event
            elif trigger:
                if _table_set_action(event) == CREATE_TABLE and event.commit_ts > start_ts:
                    yield event  # no feed of the table exists yet to carry it
            elif isinstance(event, RowChange | DDLEvent):
                # A RENAME is carried by the feed the table had before it, as a TiKV table's is.
                table = event.renamed_from if isinstance(event, DDLEvent) and event.renamed_from else event.table
                if table is not None and self._tables.get(table) == span and event.commit_ts > start_ts:
                    yield event


def _table_set_action(event: Any) -> int | None:
    """CREATE_TABLE or DROP_TABLE for such a DDL event of a table, else None."""
    if isinstance(event, DDLEvent) and event.table is not None and event.action_type in (CREATE_TABLE, DROP_TABLE):
        return event.action_type
    return None


class SimulatedCrash(RuntimeError):
    """Raised by :class:`ListSink` to simulate a crash in the middle of a batch."""


class ListSinkConfig(PluginConfig):
    """Options of the list sink."""

    crash_on_batch: int | None = Field(
        None,
        description=(
            "Raise SimulatedCrash half-way through this batch id (an initial snapshot's is negative); None: never."
        ),
    )


class ListSink(Sink[ListSinkConfig]):
    """An in-memory sink that keeps every batch, replays included.

    ``batches`` holds the last delivery of each batch id; ``deliveries``
    counts deliveries per batch id, so a test can see replays. ``rows`` is the
    concatenation of the current batches in batch order. ``checkpoints``
    lists the changefeed checkpoints written to it, in order.
    """

    type_name = "list"
    Config = ListSinkConfig

    def __init__(self, config: ListSinkConfig | None = None) -> None:
        super().__init__(config or ListSinkConfig())
        self.batches: dict[int, MicroBatch] = {}
        self.deliveries: dict[int, int] = {}
        self.partial: list[RowChange] = []
        self.checkpoints: list[int] = []
        self.opened = False
        self.closed = False

    def open(self, context: SinkContext) -> None:
        self.opened = True

    def write_batch(self, batch: MicroBatch) -> None:
        self.deliveries[batch.batch_id] = self.deliveries.get(batch.batch_id, 0) + 1
        if batch.batch_id == self.config.crash_on_batch and self.deliveries[batch.batch_id] == 1:
            self.partial = list(batch.rows[: len(batch.rows) // 2])
            raise SimulatedCrash(f"simulated crash in batch {batch.batch_id}")
        self.batches[batch.batch_id] = batch

    def write_checkpoint(self, ts: int) -> None:
        self.checkpoints.append(ts)

    def close(self) -> None:
        self.closed = True

    @property
    def rows(self) -> list[RowChange]:
        return [row for batch_id in sorted(self.batches) for row in self.batches[batch_id].rows]

    @property
    def ddl(self) -> list[DDLEvent]:
        return [d for batch_id in sorted(self.batches) for d in self.batches[batch_id].ddl]


@dataclass
class DriveResult:
    """What :func:`drive` did."""

    checkpoint_ts: int
    batches: list[MicroBatch] = field(default_factory=list)


async def drive(
    source: Source[Any],
    sinks: Sequence[Sink[Any]],
    *,
    changefeed_id: str = "test",
    start_ts: int = 0,
    until_ts: int | None = None,
    table_filter: TableFilter | None = None,
    first_batch_id: int = 0,
    plugins: PluginManager | None = None,
) -> DriveResult:
    """Run ``source`` into ``sinks`` until every feed ends (or the frontier
    reaches ``until_ts``); return the checkpoint and the batches written.

    Sinks are opened with ``plugins`` in their :class:`SinkContext` (to find
    codecs); without it, the driver loads one as a capture does
    (``PluginManager.default()``: the built-ins and installed plugins).

    Feeds run concurrently. A batch is cut each time the span frontier moves
    forward, and at every DDL barrier; after each batch every sink gets its
    end ts as the changefeed checkpoint. A sink that raises stops the run and the
    exception propagates; ``DriveResult`` is then lost, but the sinks have seen
    every batch up to the checkpoint a restart would resume from.
    """
    filt = table_filter or TableFilter()
    await source.open()
    spans = [
        span
        for table in await source.list_tables()
        if filt.matches(table.schema, table.table)
        for span in await source.spans_for(table)
    ]
    if plugins is None:
        from cdcflow.core.plugin.manager import PluginManager

        plugins = PluginManager.default()
    for sink in sinks:
        sink.open(SinkContext(changefeed_id, restart_ts=start_ts, plugins=plugins))
    batcher = _Batcher(changefeed_id, sinks, start_ts, first_batch_id)
    frontier = SpanFrontier(spans, start_ts)
    queue: asyncio.Queue[tuple[Span, SourceEvent | None]] = asyncio.Queue(maxsize=1024)

    async def pump(span: Span) -> None:
        async for event in source.feed(span, start_ts):
            await queue.put((span, event))
        await queue.put((span, None))

    tasks = [asyncio.create_task(pump(span)) for span in spans]
    try:
        remaining = len(tasks)
        while remaining and (until_ts is None or frontier.frontier < until_ts):
            _span, event = await queue.get()
            if event is None:
                remaining -= 1
            elif isinstance(event, RowChange):
                if filt.matches(event.table.schema, event.table.table) and event.commit_ts > frontier.frontier:
                    batcher.rows.append(event)
            elif isinstance(event, DDLEvent):
                if event.commit_ts > frontier.frontier and event not in batcher.ddl:
                    batcher.ddl.append(event)
            elif isinstance(event, ResolvedEvent) and frontier.forward(event.span, event.ts):
                batcher.flush_until(frontier.frontier)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for sink in sinks:
        sink.close()
    await source.close()
    return DriveResult(batcher.checkpoint_ts, batcher.written)


class _Batcher:
    """Cuts buffered changes into micro-batches at the frontier and at DDL barriers."""

    def __init__(self, changefeed_id: str, sinks: Sequence[Sink[Any]], start_ts: int, first_batch_id: int) -> None:
        self.changefeed_id = changefeed_id
        self.sinks = sinks
        self.checkpoint_ts = start_ts
        self.rows: list[RowChange] = []
        self.ddl: list[DDLEvent] = []
        self.written: list[MicroBatch] = []
        self._ids = itertools.count(first_batch_id)

    def flush_until(self, resolved_ts: int) -> None:
        while self.checkpoint_ts < resolved_ts:
            barrier = min((d.commit_ts for d in self.ddl if d.commit_ts <= resolved_ts), default=None)
            end = resolved_ts if barrier is None else barrier
            rows = sorted((r for r in self.rows if r.commit_ts <= end), key=RowChange.sort_key)
            self.rows = [r for r in self.rows if r.commit_ts > end]
            ddl = tuple(d for d in self.ddl if d.commit_ts == end)
            self.ddl = [d for d in self.ddl if d.commit_ts != end]
            batch = MicroBatch(self.changefeed_id, next(self._ids), self.checkpoint_ts, end, tuple(rows), ddl)
            for sink in self.sinks:
                sink.write_batch(batch)
            self.written.append(batch)
            self.checkpoint_ts = end
            for sink in self.sinks:
                sink.write_checkpoint(end)
