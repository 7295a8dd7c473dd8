"""``Playground``: PD + N TiKV stores + TiDB status API, in process, on 127.0.0.1.

Use it as a context manager (``with Playground() as pg:``), or ``await
pg.astart()`` / ``await pg.astop()`` from async code. Servers run on a private
event-loop thread; every method is safe to call from any thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdcflow.plugins.sources.playground.catalog import Catalog
from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.ddl import DDLExecutor
from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.playground.feed import FeedHub
from cdcflow.plugins.sources.playground.kv_service import KvFaults, KvStats
from cdcflow.plugins.sources.playground.loader import BulkLoader
from cdcflow.plugins.sources.playground.mvcc import Lock
from cdcflow.plugins.sources.playground.regions import Region
from cdcflow.plugins.sources.playground.servers import LoopThread, StoreServers
from cdcflow.plugins.sources.playground.snapshot import read_snapshot
from cdcflow.plugins.sources.playground.txn import Transaction
from cdcflow.plugins.sources.playground.workload import Workload, WorkloadStats

__all__ = ["Playground"]


class Playground:
    """An in-process upstream that speaks PD's, TiKV's and TiDB's protocols.

    ``stores``: number of TiKV stores (each region has a peer on every store);
    ``pd_port`` / ``status_port``: 0 lets the OS choose (see the ``*_address``
    properties); ``split_keys`` / ``split_bytes``: a region splits at its
    middle key when it holds more keys, or had more bytes committed into it
    (``split_keys=0``: no automatic splits; ``split_bytes=0``: no size limit);
    ``resolved_ts_interval``: seconds between resolved-ts messages;
    ``eventfeed_v2``: serve ``EventFeedV2`` (False: UNIMPLEMENTED, to test a
    client's fallback); ``seed``: makes the workload and the
    cluster id deterministic; ``rate``: workload transactions per second
    started with the playground (0: none; use :meth:`run_workload` or
    :meth:`start_workload`); ``ddl_every``: one DDL every that many workload
    transactions (0: never); ``create_tables``: create the ``shop`` tables at
    start; ``scan_delay``: deliver each incremental scan that many seconds
    late, so that live PREWRITE/COMMIT rows overtake it, as they may on TiKV
    (0: the scan comes first).
    """

    def __init__(
        self,
        *,
        stores: int = 3,
        pd_port: int = 0,
        status_port: int = 0,
        host: str = "127.0.0.1",
        split_keys: int = 2000,
        split_bytes: int = 1 << 20,
        resolved_ts_interval: float = 0.2,
        eventfeed_v2: bool = True,
        seed: int = 0,
        rate: float = 0.0,
        ddl_every: int = 200,
        create_tables: bool = True,
        scan_delay: float = 0.0,
    ) -> None:
        self.cluster = Cluster(stores, split_keys=split_keys, split_bytes=split_bytes, seed=seed)
        self.hub = FeedHub(self.cluster, scan_delay=scan_delay)
        self.catalog = Catalog(self.cluster.lock)
        self.ddl = DDLExecutor(self.cluster, self.catalog)
        self.workload = Workload(self.cluster, self.catalog, self.ddl, seed=seed, ddl_every=ddl_every)
        self.kv_faults = KvFaults()
        #: What the stores' KV services answered (requests, region errors, lock checks).
        self.kv_stats = KvStats()
        self.loader = BulkLoader(self.cluster, self.catalog, self.workload)
        self._rate, self._create_tables = rate, create_tables
        self._status: Any = None
        self.seed = seed
        self._host, self._status_port = host, status_port
        self._pd_port, self._eventfeed_v2 = pd_port, eventfeed_v2
        self._resolved_ts_interval = resolved_ts_interval
        self._loop: LoopThread | None = None
        self._servers: StoreServers | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Playground:
        if self._loop is not None:
            raise PlaygroundError("the playground is already started")
        self._loop = LoopThread()
        self._servers = StoreServers(
            self.cluster,
            self.hub,
            self._loop,
            host=self._host,
            pd_port=self._pd_port,
            eventfeed_v2=self._eventfeed_v2,
            resolved_ts_interval=self._resolved_ts_interval,
            kv_faults=self.kv_faults,
            kv_stats=self.kv_stats,
        )
        servers = self._servers
        try:
            self._loop.call(servers.start)
            self._loop.call(self._start_status)
            if self._create_tables:
                self.workload.create_tables()
            self.workload.start(self._rate)
        except BaseException:
            self.stop()
            raise
        return self

    async def _start_status(self) -> None:
        from aiohttp import web

        from cdcflow.plugins.sources.playground.status_api import build_app

        runner = web.AppRunner(build_app(self.catalog), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._status_port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise PlaygroundError(
                f"cannot listen on {self._host}:{self._status_port} for the TiDB status API ({exc.strerror}); "
                "choose another --status-port or 0"
            ) from exc
        self._status = runner
        self._status_port = runner.addresses[0][1]

    def stop(self) -> None:
        """Stop the servers (streams end with UNAVAILABLE). Idempotent."""
        self.workload.stop()
        loop, servers, status = self._loop, self._servers, self._status
        self._loop = self._servers = self._status = None
        if loop is None:
            return
        try:
            if status is not None:
                loop.call(status.cleanup)
            if servers is not None:
                loop.call(servers.stop)
        finally:
            loop.stop()

    def __enter__(self) -> Playground:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def astart(self) -> Playground:
        import asyncio

        return await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        import asyncio

        await asyncio.to_thread(self.stop)

    async def __aenter__(self) -> Playground:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()

    # -- addresses -------------------------------------------------------------------------------

    @property
    def pd_address(self) -> str:
        return self._require_servers().pd_address

    @property
    def status_address(self) -> str:
        """host:port of the TiDB status API."""
        self._require_servers()
        return f"{self._host}:{self._status_port}"

    @property
    def store_addresses(self) -> dict[int, str]:
        return {s.id: s.address for s in self.cluster.stores.values()}

    @property
    def cluster_id(self) -> int:
        return self.cluster.cluster_id

    def addresses(self) -> dict[str, Any]:
        """Every address, for printing: ``pd``, ``stores`` (id → address)."""
        return {"pd": self.pd_address, "tidb_status": self.status_address, "stores": self.store_addresses}

    # -- data ------------------------------------------------------------------------------------

    def now(self) -> int:
        """A fresh TSO."""
        return self.cluster.oracle.next()

    def begin(self, *, ttl_ms: int | None = None) -> Transaction:
        """A new transaction on raw keys (start ts taken now); ``ttl_ms``: how long its
        locks live before a reader may roll it back (TiDB's default: 3 s)."""
        if ttl_ms is None:
            return Transaction(self.cluster)
        return Transaction(self.cluster, ttl_ms=ttl_ms)

    def bulk_load(
        self,
        table: str,
        count: int,
        *,
        db: str = "shop",
        rows: Iterable[Mapping[str, Any]] | None = None,
        batch: int = 50_000,
        adopt: bool = True,
    ) -> int:
        """Fill ``db.table`` with ``count`` new rows fast (a physical import: no locks, no
        change feed sees them; load before a changefeed starts); return the commit ts.

        Rows get handles above every handle the table's workload has used, and random
        values (or ``rows``' values, in order); with ``adopt`` the workload may update
        and delete them later. Regions split so that none holds more than ``split_keys``
        keys. See :class:`~cdcflow.plugins.sources.playground.loader.BulkLoader`."""
        return self.loader.load(db, table, count, rows=rows, batch=batch, adopt=adopt)

    def locks(self) -> list[tuple[bytes, Lock]]:
        """Every lock held now: (raw key, lock), in key order."""
        return self.cluster.mvcc.locks()

    def regions(self) -> list[Region]:
        return self.cluster.regions.all()

    def snapshot(self, table: str, ts: int | None = None, *, db: str = "shop") -> list[dict[str, Any]]:
        """Rows of ``db.table`` committed at ``ts`` (now if None), decoded, ordered by primary key."""
        return read_snapshot(self.cluster, self.catalog, db, table, self.now() if ts is None else ts)

    def table_id(self, table: str, *, db: str = "shop") -> int:
        return self.catalog.find(db, table).id

    # -- workload --------------------------------------------------------------------------------

    def run_workload(self, transactions: int) -> WorkloadStats:
        """Run the next ``transactions`` workload transactions now (blocking)."""
        return self.workload.run(transactions)

    def start_workload(self, rate: float) -> None:
        """Run the workload in the background at ``rate`` transactions per second."""
        self.workload.start(rate)

    def stop_workload(self) -> WorkloadStats:
        self.workload.stop()
        return self.workload.stats

    # -- faults ----------------------------------------------------------------------------------

    def split_region(self, raw_key: bytes) -> tuple[Region, Region]:
        """Split the region holding ``raw_key`` at it; streams on it get EpochNotMatch."""
        from cdcflow.plugins.sources.playground._keys import encode_key

        enc = encode_key(raw_key)
        region = self.cluster.regions.locate(enc)
        return self.cluster.regions.split(region.id, enc)

    def merge_regions(self, source_id: int, target_id: int) -> Region:
        """Merge ``source_id`` into the adjacent ``target_id`` (RegionNotFound / EpochNotMatch)."""
        return self.cluster.regions.merge(source_id, target_id)

    def transfer_leader(self, region_id: int, store_id: int | None = None) -> Region:
        """Move a region's leader (to the next store by default); streams get NotLeader."""
        region = self.cluster.regions.by_id(region_id)
        if region is None:
            raise PlaygroundError(f"no region {region_id}")
        if store_id is None:
            ids = list(self.cluster.store_ids())
            store_id = ids[(ids.index(region.leader_store) + 1) % len(ids)]
        return self.cluster.regions.transfer_leader(region_id, store_id)

    def restart_store(self, store_id: int, downtime: float = 0.5) -> None:
        """Stop a store's server (its streams break), wait ``downtime`` s, start it on the same port."""
        self._require_store(store_id)
        servers = self._require_servers()
        self._require_loop().call(lambda: servers.restart_store(store_id, downtime), timeout=downtime + 30)

    def stop_store(self, store_id: int) -> None:
        """Take a store down until :meth:`start_store` (clients see it unreachable)."""
        self._require_store(store_id)
        servers = self._require_servers()
        self._require_loop().call(lambda: servers.stop_store(store_id))

    def start_store(self, store_id: int) -> None:
        self._require_store(store_id)
        servers = self._require_servers()
        self._require_loop().call(lambda: servers.start_store(store_id))

    def stop_pd(self) -> None:
        """Take PD down (calls fail UNAVAILABLE) until :meth:`start_pd`; stores keep streaming."""
        servers = self._require_servers()
        self._require_loop().call(servers.stop_pd)

    def start_pd(self) -> None:
        """Serve PD again on the same port, with the same state (TSO, regions, safepoints)."""
        servers = self._require_servers()
        self._require_loop().call(servers.start_pd)

    def server_busy(self, store_id: int, count: int = 1, *, congested: bool = False) -> None:
        """Answer the next ``count`` region registrations on a store with ServerIsBusy (or Congested)."""
        self._require_store(store_id)
        self.hub.inject_busy(store_id, count, congested=congested)

    def kv_region_error(self, store_id: int, kind: str, count: int = 1) -> None:
        """Answer the next ``count`` KV requests (KvScan, KvCheckTxnStatus, KvResolveLock) on a
        store with a region error: ``not_leader`` (naming no leader), ``epoch_not_match``,
        ``region_not_found`` or ``server_is_busy``."""
        self._require_store(store_id)
        self.kv_faults.inject(store_id, kind, count)

    def kv_churn(self, every: int, times: int) -> None:
        """Churn the regions under the value scans (KvScan without ``key_only``): before
        every ``every``-th, split the region it reads in the middle of its keys from the
        scan's start key, or move that region's leader to the next store, alternately,
        until ``times`` changes were made; the scan then meets the EpochNotMatch or
        NotLeader it caused. ``times=0`` stops. Counted in ``kv_faults.churned``, the
        errors in :attr:`kv_stats`."""
        self.kv_faults.churn(every, times)

    def reset_streams(self, store_id: int) -> int:
        """Break the EventFeed streams of a store (UNAVAILABLE); return how many were open."""
        self._require_store(store_id)
        return self.hub.reset_store(store_id)

    def advance_gc(self, target_ts: int) -> int:
        """Run GC up to ``target_ts`` but not past any service safepoint; return the GC safepoint."""
        pd = self._require_servers().pd
        if pd is None:
            raise PlaygroundError("PD is not serving yet")
        return pd.advance_gc(target_ts)

    # -- internals -------------------------------------------------------------------------------

    def _require_loop(self) -> LoopThread:
        if self._loop is None:
            raise PlaygroundError("the playground is not started; use `with Playground() as pg:`")
        return self._loop

    def _require_servers(self) -> StoreServers:
        if self._servers is None:
            raise PlaygroundError("the playground is not started; use `with Playground() as pg:`")
        return self._servers

    def _require_store(self, store_id: int) -> None:
        if store_id not in self.cluster.stores:
            raise PlaygroundError(f"no store {store_id}; stores are {sorted(self.cluster.stores)}")
