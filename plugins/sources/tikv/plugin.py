"""The ``tikv`` source: TiKV's EventFeed through PD.

Each span (a table's record range ``[t{id}_r, t{id}_s)``, or a configured key
span in raw mode) is split by PD's regions and subscribed region by region on
one ChangeData stream per store (EventFeedV2 with stream multiplexing, or
EventFeed). Feeds yield committed key-value changes and the span's resolved
ts: every change above the start ts at least once, never a change at or below
a resolved ts already yielded, resolved ts never backwards. A start ts below
PD's GC safepoint fails with ErrCheckpointStale (5001); PD unreachable past
the retry budget fails with ErrPDUnavailable (3001).

``kv-api: tidb`` decodes TiDB rows with the schema valid at commit ts − 1;
:meth:`TiKVSource.prepare_mounter` makes that hold for rows older than any
feed's start ts (a restarted log service mounts its stored rows again).
``kv-api: rawkv`` / ``txnkv`` replicate ``key-spans``: each span is a
pseudo-table ``<kv-api>.keys_<i>`` with binary columns ``key`` and ``value``
(PUT without old value → INSERT, with old value → UPDATE, DELETE → DELETE).
See docs/reference/tikv-source.md and docs/explanation/eventfeed.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcflow.core.data.events import (
    DDLEvent,
    RawKVEvent,
    ResolvedEvent,
    RowChange,
    SourceEvent,
    Span,
    TableName,
    TableSchema,
    TableSetChange,
)
from cdcflow.core.data.source import BatchMounter, Mounter, SnapshotPlan, Source
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue
from cdcflow.core.metrics import LAGGING_REGION_SECONDS, FeedStats
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.plugins.sources.tikv import hookspec as tikv_hookspec
from cdcflow.plugins.sources.tikv.catalog import TiDBCatalog
from cdcflow.plugins.sources.tikv.channels import TLSFiles
from cdcflow.plugins.sources.tikv.config import EmbeddedPlaygroundConfig, TiKVSourceConfig
from cdcflow.plugins.sources.tikv.ddl import DDLTracker, TrackerSuperseded
from cdcflow.plugins.sources.tikv.eventfeed import EventFeedClient
from cdcflow.plugins.sources.tikv.gc import PDSafepointKeeper
from cdcflow.plugins.sources.tikv.hookspec import EmbeddedUpstream
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.rawkv import KeySpace, RawKVMounter, parse_key_spans
from cdcflow.plugins.sources.tikv.snapshot_task import RangeScanTask, TiKVSnapshotTask, snapshot_ranges
from cdcflow.plugins.sources.tikv.spill import FeedMemory

if TYPE_CHECKING:
    from cdcflow.core.plugin.manager import PluginManager

__all__ = [
    "FEED_MEMORY_SHARE",
    "EmbeddedUpstreamStarter",
    "TiKVSource",
    "cdcflow_add_hookspecs",
    "cdcflow_register_sources",
]

#: The share of a changefeed's memory quota the feeds may hold (pending prewrites,
#: changes of regions not yet INITIALIZED) before spilling to disk.
FEED_MEMORY_SHARE = 0.25

#: Starts or attaches to the in-process upstream a source with ``playground`` set reads
#: (blocking); None when no plugin provides one.
EmbeddedUpstreamStarter = Callable[[EmbeddedPlaygroundConfig], EmbeddedUpstream | None]


class TiKVSource(Source[TiKVSourceConfig]):
    """TiKV EventFeed source (PD regions, TSO and GC safepoints; TiDB row decoding).

    Feeds yield :class:`RawKVEvent`: in ``tidb`` mode the mounter decodes TiDB
    rows; in ``rawkv``/``txnkv`` mode each key span is a two-column
    pseudo-table (see :mod:`~cdcflow.plugins.sources.tikv.rawkv`).
    """

    type_name = "tikv"
    Config = TiKVSourceConfig
    yields_raw_kv = True

    def __init__(self, config: TiKVSourceConfig, *, embedded_upstream: EmbeddedUpstreamStarter | None = None) -> None:
        super().__init__(config)
        #: What starts the upstream of the ``playground`` option (see :meth:`create`).
        self._embedded_upstream = embedded_upstream
        self._pd: PDClient | None = None
        self._feeds: EventFeedClient | None = None
        self._keyspace: KeySpace | None = None
        self._catalog: TiDBCatalog | None = None
        self._tracker: DDLTracker | None = None
        self._tracker_lock = asyncio.Lock()
        #: The ts given to prepare_mounter (None: not called) and how far rows decode exactly.
        self._mount_from: int | None = None
        self._schema_ready_ts = 0
        self._pd_endpoints = list(config.pd)
        #: Bytes the feeds may hold before spilling (None: no limit; see :meth:`limit_memory`).
        self.memory_budget: int | None = None
        self._spill_dir: Path | None = None
        if config.kv_api != "tidb":
            self._keyspace = KeySpace(config.kv_api, parse_key_spans(config.key_spans))
        else:
            self._catalog = TiDBCatalog(config.tidb_status)

    @classmethod
    def create(cls, config: PluginConfig, plugins: PluginManager | None) -> TiKVSource:
        """The source, with the ``playground`` option's upstream taken from the plugin
        that implements ``cdcflow_tikv_embedded_upstream`` (the playground plugin)."""
        assert isinstance(config, TiKVSourceConfig)
        if plugins is None:
            return cls(config)
        hook = plugins.hook.cdcflow_tikv_embedded_upstream

        def embedded_upstream(options: EmbeddedPlaygroundConfig) -> EmbeddedUpstream | None:
            upstream: EmbeddedUpstream | None = hook(options=options)
            return upstream

        return cls(config, embedded_upstream=embedded_upstream)

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, TiKVSourceConfig)
        if config.embedded_playground() is not None and not plugins.hook.cdcflow_tikv_embedded_upstream.get_hookimpls():
            return [("playground", _NO_EMBEDDED_UPSTREAM)]
        return []

    async def open(self) -> None:
        cfg = self.config
        tls = self._tls()
        await self._attach_playground()
        self._pd = PDClient(self._pd_endpoints, tls=tls)
        await self._pd.connect()
        memory = FeedMemory(self.memory_budget, self._spill_dir)
        self._feeds = EventFeedClient(
            self._pd, kv_api=cfg.kv_api, tls=tls, memory=memory, resolve_lock_interval=cfg.resolve_lock_interval
        )

    def feed_stats(self) -> FeedStats | None:
        feeds = self._feeds
        if feeds is None:
            return None
        lagging_before_ms = int((time.time() - LAGGING_REGION_SECONDS) * 1000)
        regions, initializing, lagging = feeds.region_counts(lagging_before_ms)
        return FeedStats(
            memory_bytes=feeds.memory.used,
            spilled_entries=feeds.memory.spilled_entries,
            regions=regions,
            regions_initializing=initializing,
            regions_lagging=lagging,
            incremental_scan_rows=feeds.incremental_scan_rows,
        )

    def limit_memory(self, quota: int, spill_dir: Path) -> int:
        """The feeds keep at most :data:`FEED_MEMORY_SHARE` of ``quota`` in memory and
        spill the rest of what they hold to ``spill_dir`` (see :mod:`.spill`)."""
        self.memory_budget = int(quota * FEED_MEMORY_SHARE)
        self._spill_dir = spill_dir
        return self.memory_budget

    async def _attach_playground(self) -> None:
        """With ``playground`` set: start or attach to the process's playground and read it."""
        options = self.config.embedded_playground()
        if options is None:
            return
        pg = await asyncio.to_thread(self._start_embedded_upstream, options)
        self._pd_endpoints = [pg.pd_address]
        if self._catalog is not None:
            await self._catalog.close()
            self._catalog = TiDBCatalog(pg.status_address)

    async def close(self) -> None:
        feeds, self._feeds = self._feeds, None  # first: feeds waiting on the tracker then end
        async with self._tracker_lock:
            if self._tracker is not None:
                await self._tracker.close()
                self._tracker = None
        if self._catalog is not None:
            await self._catalog.close()
        if feeds is not None:
            await feeds.close()
        if self._pd is not None:
            await self._pd.close()
        self._pd = None

    @property
    def pd(self) -> PDClient:
        if self._pd is None:
            raise RuntimeError("the tikv source is not open")
        return self._pd

    @property
    def feeds(self) -> EventFeedClient:
        if self._feeds is None:
            raise RuntimeError("the tikv source is not open")
        return self._feeds

    def gc_safepoint_keeper(self) -> PDSafepointKeeper:
        """The service GC safepoint keeper of this upstream, for the control plane.

        Shares the source's PD client when the source is open; otherwise the
        keeper owns a client of its own, connected on first use and released
        by ``keeper.close()``.
        """
        if self._pd is not None:
            return PDSafepointKeeper(self._pd)
        endpoints = self._pd_endpoints
        options = self.config.embedded_playground()
        if options is not None:
            # The control plane asks before (or without) opening the source: the
            # keeper must talk to the same in-process playground the feeds use.
            endpoints = [self._start_embedded_upstream(options).pd_address]
        return PDSafepointKeeper(PDClient(endpoints, tls=self._tls()), owns_client=True)

    def _start_embedded_upstream(self, options: EmbeddedPlaygroundConfig) -> EmbeddedUpstream:
        """The in-process upstream of the ``playground`` option (blocks while it starts)."""
        upstream = self._embedded_upstream(options) if self._embedded_upstream is not None else None
        if upstream is None:
            raise ConfigInvalidError(
                _NO_EMBEDDED_UPSTREAM, [ConfigIssue(_NO_EMBEDDED_UPSTREAM, path="source.playground")]
            )
        return upstream

    def _tls(self) -> TLSFiles | None:
        cfg = self.config
        return TLSFiles(cfg.ca, cfg.cert, cfg.key) if cfg.ca else None

    @property
    def catalog(self) -> TiDBCatalog:
        if self._catalog is None:
            raise RuntimeError(f"the tikv source has no TiDB tables in kv-api {self.config.kv_api!r}")
        return self._catalog

    async def list_tables(self) -> Sequence[TableName]:
        if self._keyspace is not None:
            return list(self._keyspace.tables)
        return await self.catalog.tables(await self.current_ts())

    async def spans_for(self, table: TableName) -> Sequence[Span]:
        if self._keyspace is not None:
            return [self._keyspace.span(table)]
        if table.table_id <= 0 and table.partition_id is None:
            named = [t for t in await self.list_tables() if (t.schema, t.table) == (table.schema, table.table)]
            if not named:
                raise ConfigInvalidError(f"TiDB has no table {table}")
            table = named[0]
        return self.catalog.spans(table)

    def trigger_span(self) -> Span | None:
        """The first DDL job span (tidb mode; None in raw modes, whose key spans never change).

        Its feed yields the DDL no table's feed carries (CREATE TABLE,
        schema-level DDL) and the DDL resolved ts (see :meth:`ddl_spans`).
        """
        return TiDBCatalog.ddl_spans()[0] if self._keyspace is None else None

    async def tables_at(self, ts: int) -> Sequence[TableName]:
        """The tables that existed at ``ts``: the schema store loaded as of ``ts`` once
        every DDL job up to now is applied at its exact commit ts."""
        if self._keyspace is not None:
            return list(self._keyspace.tables)
        await self.catalog.ensure_loaded(ts)
        if await self._ddl_until(ts, ts, await self.current_ts()) is None:
            raise RuntimeError("the tikv source was closed while listing tables")
        return await self.catalog.tables(ts)

    def table_changes(self, start_ts: int) -> AsyncIterator[TableSetChange | ResolvedEvent] | None:
        """Each DDL above ``start_ts`` that creates, drops, truncates or renames tables (or
        changes a table's partitions), with the DDL resolved ts (tidb mode; None in raw modes)."""
        return self._table_changes(start_ts) if self._keyspace is None else None

    async def _table_changes(self, start_ts: int) -> AsyncIterator[TableSetChange | ResolvedEvent]:
        trigger = TiDBCatalog.ddl_spans()[0]
        await self.catalog.ensure_loaded(start_ts)
        async for ts, ddls in self._ddl_progress(start_ts):
            for ddl in ddls:
                change = self.catalog.table_set_change(ddl)
                if change is not None:
                    yield change
            yield ResolvedEvent(trigger, ts)

    def ddl_spans(self) -> Sequence[Span]:
        """The spans of TiDB's DDL job tables (tidb mode; none in raw modes).

        The source follows them itself (:class:`DDLTracker`) and yields each
        table's DDL in that table's feeds. Feeding the first of them yields
        the DDL no table feed carries (schema-level DDL, table creation) and
        the DDL resolved ts; the others yield only the resolved ts.
        """
        return TiDBCatalog.ddl_spans() if self._keyspace is None else []

    async def table_schema(self, table: TableName, ts: int) -> TableSchema:
        if self._keyspace is not None:
            return self._keyspace.schema(table)
        return await self.catalog.schema(table, ts)

    async def feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        """Committed changes of ``span`` above ``start_ts`` and its resolved ts (see :mod:`.eventfeed`).

        Raises CheckpointStaleError (5001) first if ``start_ts`` is below PD's GC safepoint.
        """
        await self.gc_safepoint_keeper().check_start_ts(start_ts)
        if self._catalog is None:
            async for event in self.feeds.feed(span, start_ts):
                yield event
            return
        await self._catalog.ensure_loaded(min(start_ts, self._mount_from or start_ts))
        if span in TiDBCatalog.ddl_spans():
            async for ddl_feed_event in self._ddl_feed(span, start_ts):
                yield ddl_feed_event
            return
        last = start_ts
        async for event in self.feeds.feed(span, start_ts):
            if isinstance(event, ResolvedEvent):
                # The DDL barrier: the table's DDL up to the resolved ts goes first, and rows
                # at or below it are mounted with every DDL below it applied.
                ddls = await self._ddl_until(start_ts, last, event.ts)
                if ddls is None:
                    return  # the source is closing
                for ddl in ddls:
                    if self.catalog.ddl_concerns(ddl, span):
                        yield ddl
                last = event.ts
            yield event

    async def _ddl_until(self, start_ts: int, last: int, ts: int) -> list[DDLEvent] | None:
        """The DDL with ``last < commit_ts <= ts`` once every DDL up to ``ts`` is applied (None: closing)."""
        while True:
            tracker = await self._ddl_tracker(start_ts)
            if tracker is None:
                return None
            try:
                await tracker.wait_resolved(ts)
            except TrackerSuperseded:
                continue  # replaced by a tracker from a lower ts: wait on that one
            return tracker.between(last, ts)

    async def _ddl_feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        """A DDL job span's feed: DDL no table feed carries (first span only), and the DDL resolved ts."""
        carries = span == TiDBCatalog.ddl_spans()[0]
        async for ts, ddls in self._ddl_progress(start_ts):
            if carries:
                for ddl in ddls:
                    if DDLTracker.is_unowned(ddl):
                        yield ddl
            yield ResolvedEvent(span, ts)

    async def _ddl_progress(self, start_ts: int) -> AsyncIterator[tuple[int, list[DDLEvent]]]:
        """Each time the DDL tracker resolves further: the new resolved ts and the DDL
        committed since the last one (from ``start_ts``), in commit order. Ends when the source closes."""
        last = start_ts
        while True:
            tracker = await self._ddl_tracker(start_ts)
            if tracker is None:
                return
            try:
                await tracker.wait_resolved(max(last, tracker.resolved) + 1)
            except TrackerSuperseded:
                continue
            ts = tracker.resolved
            ddls = tracker.between(last, ts)
            last = ts
            yield ts, ddls

    async def _ddl_tracker(self, start_ts: int) -> DDLTracker | None:
        """The source's DDL tracker, following the DDL job spans from at or below ``start_ts``.

        A feed that starts below the current tracker's start replaces it with
        one from ``start_ts`` (keeping the DDL already seen), so the DDL
        between the two reaches that feed too.
        """
        async with self._tracker_lock:
            if self._feeds is None:
                return None  # closed
            catalog = self.catalog
            current = self._tracker
            if current is None:
                start = min(start_ts, catalog.loaded_at if catalog.loaded_at is not None else start_ts)
                self._tracker = DDLTracker(self.feeds, catalog, catalog.mounter(), start)
            elif current.failed or start_ts < current.start_ts:
                # Feeds restarted after the tracker's error continue where it stopped; a
                # lower start re-reads the DDL job spans from there.
                await current.close()
                start = min(start_ts, current.resolved)
                self._tracker = DDLTracker(self.feeds, catalog, catalog.mounter(), start, history=current.ddl)
            return self._tracker

    def mounter(self) -> Mounter | None:
        """TiDBMounter (rows and DDL job writes) in tidb mode, RawKVMounter in raw modes.

        After :meth:`prepare_mounter` the TiDB mounter first waits until the DDL
        tracker has applied every DDL below the event's commit ts."""
        if self._keyspace is not None:
            return RawKVMounter(self._keyspace)
        if self._mount_from is not None:
            return _TrackedMounter(self.catalog.mounter(), self._schema_ready)
        return self.catalog.mounter()

    async def prepare_mounter(self, ts: int) -> None:
        """tidb mode: load the schema store as of ``ts`` and follow the DDL job spans from
        there, so that rows committed after ``ts`` decode with the schema of their commit ts
        even when every feed starts later (see :meth:`Source.prepare_mounter`).

        Both happen on first use, by a feed or the mounter: an unreachable status API is
        then a feed's (or a batch's) error, retried like any other."""
        if self._catalog is not None:
            self._mount_from = ts

    async def _schema_ready(self, ts: int) -> None:
        """Return once a row committed at ``ts`` decodes exactly: the DDL tracker has
        applied every DDL below ``ts`` and settled the jobs the status API reported as
        finished after the load ts (their writes may precede it)."""
        if self._mount_from is None or ts <= self._schema_ready_ts:
            return
        await self.catalog.ensure_loaded(self._mount_from)
        target = max(ts, self.catalog.schemas.unsettled_until())
        while True:
            tracker = await self._ddl_tracker(self._mount_from)
            if tracker is None:
                return  # the source is closing
            try:
                await tracker.wait_resolved(target)
            except TrackerSuperseded:
                continue
            self._schema_ready_ts = max(self._schema_ready_ts, tracker.resolved)
            return

    async def current_ts(self) -> int:
        return await self.pd.tso()

    # -- initial snapshot -------------------------------------------------------------

    @classmethod
    def snapshot_refusal(cls, config: PluginConfig) -> str | None:
        assert isinstance(config, TiKVSourceConfig)
        if config.kv_api == "rawkv":
            return (
                "kv-api rawkv keeps no versions, so an initial snapshot cannot be read as of one ts; "
                "use kv-api tidb or txnkv, or leave initial-snapshot off"
            )
        return None

    async def snapshot_plan(self, spans: Mapping[int, Span], ts: int) -> SnapshotPlan:
        """One task per region of the spans (PD's current boundaries), or per range of about
        ``snapshot-range-keys`` keys; each reads its range at ``ts`` with KvScan."""
        cfg = self.config
        ranges = await snapshot_ranges(self.pd, spans, ts, range_keys=cfg.snapshot_range_keys)
        scan = RangeScanTask(
            tuple(self._pd_endpoints), ts, dict(spans), tls=self._tls(), page_size=cfg.snapshot_page_size
        )
        tasks = [TiKVSnapshotTask(scan, r) for r in ranges]
        return SnapshotPlan(ts, tasks, unit="range" if cfg.snapshot_range_keys else "region")


class _TrackedMounter(Mounter):
    """A TiDB mounter that waits for the schema of each event's commit ts first."""

    def __init__(self, inner: Mounter, ready: Callable[[int], Awaitable[None]]) -> None:
        self._inner = inner
        self._ready = ready

    async def mount(self, event: RawKVEvent) -> RowChange | None:
        await self._ready(event.commit_ts)
        return await self._inner.mount(event)

    async def for_batch(self, start_ts: int, end_ts: int) -> BatchMounter | None:
        # The schemas of every commit ts up to end_ts: every DDL below it applied.
        await self._ready(end_ts)
        return await self._inner.for_batch(start_ts, end_ts)


_NO_EMBEDDED_UPSTREAM = (
    "playground is set, but no plugin provides an in-process upstream (the hook "
    "cdcflow_tikv_embedded_upstream; the playground plugin, cdcflow.plugins.sources.playground.plugin, "
    "is not loaded); load it, or set playground: false and point pd / tidb-status at a cluster"
)


@hookimpl
def cdcflow_add_hookspecs(pluginmanager: PluginManager) -> None:
    pluginmanager.add_hookspecs(tikv_hookspec)


@hookimpl
def cdcflow_register_sources(registry: Registrar[Source[Any]]) -> None:
    registry.add(TiKVSource)
