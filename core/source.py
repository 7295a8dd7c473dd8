"""What a source plugin is: long-lived feeds of changes per span.

A source connects to one upstream (a TiKV cluster through PD, a CockroachDB
cluster, an in-memory list in tests). The log service asks it which spans a
changefeed's table filter covers, opens one feed per span from a start ts,
and turns the feed into resolved chunks (ARCHITECTURE.md, "Log service").

Guarantees a feed must give (they are what makes the checkpoint safe):

* every change with ``commit_ts > start_ts`` in the span is yielded at least
  once; a change may repeat after a reconnect, never go missing;
* after ``ResolvedEvent(span, t)`` no change with ``commit_ts <= t`` follows;
* resolved timestamps of a span never go backwards.

Not guaranteed: order between changes of different keys before they are
resolved (the event store sorts), or exactly-once delivery.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import ClassVar

from cdcflow.core.events import RawKVEvent, RowChange, SourceEvent, Span, TableName, TableSchema
from cdcflow.core.gc import GCSafepointKeeper
from cdcflow.core.plugin.base import ConfigT, Plugin

__all__ = ["Mounter", "Source"]


class Mounter(abc.ABC):
    """Turns raw key-value changes into rows (TiDB keys and rowcodec values, …)."""

    @abc.abstractmethod
    async def mount(self, event: RawKVEvent) -> RowChange | None:
        """The row change for ``event``, using the schema valid at ``commit_ts - 1``.

        Returns None for keys that are not rows of a replicated table (index
        keys, system tables). Raises a :class:`~cdcflow.core.errors.CdcflowError`
        naming table, key and commit ts when the value cannot be decoded.
        """


class Source(Plugin[ConfigT], abc.ABC):
    """Base class of source plugins. Methods are coroutines; the log service
    runs them on the capture's event loop."""

    #: Whether feeds yield :class:`RawKVEvent` (and need :meth:`mounter`) or rows.
    yields_raw_kv: ClassVar[bool] = False

    async def open(self) -> None:
        """Connect to the upstream. Called once before any other coroutine."""

    async def close(self) -> None:
        """Release connections; open feeds end. Not called on abrupt shutdown."""

    @abc.abstractmethod
    async def list_tables(self) -> Sequence[TableName]:
        """Every table the upstream has now (the table filter is applied by the caller)."""

    @abc.abstractmethod
    async def spans_for(self, table: TableName) -> Sequence[Span]:
        """The spans that hold ``table``'s rows (usually one per table)."""

    @abc.abstractmethod
    async def table_schema(self, table: TableName, ts: int) -> TableSchema:
        """The schema of ``table`` valid at ``ts``."""

    @abc.abstractmethod
    def feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        """Changes of ``span`` with commit ts above ``start_ts``, and resolved timestamps.

        The iterator runs until cancelled or closed; it reconnects by itself on
        retryable upstream errors and raises a CdcflowError on fatal ones.
        """

    def mounter(self) -> Mounter | None:
        """The mounter for raw key-value events, or None if feeds yield rows."""
        return None

    def limit_memory(self, quota: int, spill_dir: Path) -> int:
        """Bound what the feeds hold in memory before their events reach the event store.

        Called once, before :meth:`open`, with the changefeed's memory quota
        and a directory the source may spill to (its contents are not kept
        across restarts). Returns the share of ``quota`` the feeds may use;
        the event store gets the rest. The default, for sources whose feeds
        hold no per-row state, takes nothing.
        """
        return 0

    def gc_safepoint_keeper(self) -> GCSafepointKeeper | None:
        """The keeper of this upstream's service GC safepoint (see :mod:`cdcflow.core.gc`),
        or None when the upstream does not garbage-collect history.

        Called on the coordinator before :meth:`open`; the keeper manages its
        own connection.
        """
        return None

    async def current_ts(self) -> int:
        """The upstream's current timestamp (TSO), used for lag and ``start-ts: now``."""
        raise NotImplementedError(f"{type(self).__name__} does not report a current timestamp")
