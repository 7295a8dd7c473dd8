"""The playground's network side: PD and TiKV gRPC servers on an event-loop thread.

All servers run on one asyncio loop in a daemon thread so the playground can
be used from synchronous tests, from async tests (whatever their loop) and
from the ``cdcflow playground`` command alike. Ports are 0 (the OS picks)
unless given; the actual addresses are reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc

from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.playground.feed import FeedHub
from cdcflow.plugins.sources.playground.kv_service import KvFaults, KvService, KvStats
from cdcflow.plugins.sources.playground.pd_service import PDService
from cdcflow.plugins.sources.playground.tikv_service import ChangeDataService
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2_grpc, pdpb_pb2_grpc, tikvpb_pb2_grpc

__all__ = ["LoopThread", "StoreServers"]

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a daemon thread; ``call`` runs a coroutine on it and waits."""

    def __init__(self, name: str = "cdcflow-playground") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, make: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
        async def run() -> T:
            return await make()

        future: Future[T] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        with contextlib.suppress(RuntimeError):
            self.loop.close()


async def _start_server(servicer_adder: Callable[[grpc.aio.Server], None], host: str, port: int) -> tuple[Any, int]:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    servicer_adder(server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpc raises when the port is taken
        bound = 0
    if bound == 0:
        raise PlaygroundError(f"cannot listen on {host}:{port}; choose another port or 0")
    await server.start()
    return server, bound


class StoreServers:
    """PD + one server per store (ChangeData and the Tikv KV reads), resolved-ts ticker; restartable stores."""

    def __init__(
        self,
        cluster: Cluster,
        hub: FeedHub,
        loop: LoopThread,
        *,
        host: str = "127.0.0.1",
        pd_port: int = 0,
        eventfeed_v2: bool = True,
        resolved_ts_interval: float = 0.2,
        kv_faults: KvFaults | None = None,
        kv_stats: KvStats | None = None,
    ) -> None:
        self.cluster, self.hub, self.loop, self.host = cluster, hub, loop, host
        self.kv_faults = kv_faults if kv_faults is not None else KvFaults()
        self.kv_stats = kv_stats if kv_stats is not None else KvStats()
        self.pd_port, self.eventfeed_v2 = pd_port, eventfeed_v2
        self.resolved_ts_interval = resolved_ts_interval
        self.pd: PDService | None = None
        self._pd_server: Any = None
        self._stores: dict[int, Any] = {}
        self._ports: dict[int, int] = {}
        self._ticker: asyncio.Task[None] | None = None

    @property
    def pd_address(self) -> str:
        return f"{self.host}:{self.pd_port}"

    async def start(self) -> None:
        self.pd = PDService(self.cluster)
        await self.start_pd()
        for store_id in self.cluster.store_ids():
            await self.start_store(store_id)
        self._ticker = asyncio.create_task(self._tick())

    async def start_pd(self) -> None:
        """Serve PD (again, on the same port after :meth:`stop_pd`; its state is kept)."""
        pd = self.pd
        assert pd is not None
        if self._pd_server is not None:
            return
        self._pd_server, self.pd_port = await _start_server(
            lambda s: pdpb_pb2_grpc.add_PDServicer_to_server(pd, s), self.host, self.pd_port
        )
        pd.address = self.pd_address

    async def stop_pd(self) -> None:
        """Stop PD's server: calls fail UNAVAILABLE; stores keep serving their streams."""
        server, self._pd_server = self._pd_server, None
        if server is not None:
            await server.stop(0)

    async def start_store(self, store_id: int) -> None:
        service = ChangeDataService(self.hub, store_id, v2_enabled=self.eventfeed_v2)
        kv = KvService(self.cluster, store_id, self.kv_faults, self.kv_stats)

        def add(server: grpc.aio.Server) -> None:
            cdcpb_pb2_grpc.add_ChangeDataServicer_to_server(service, server)
            tikvpb_pb2_grpc.add_TikvServicer_to_server(kv, server)

        server, port = await _start_server(
            add,
            self.host,
            self._ports.get(store_id, 0),
        )
        self._stores[store_id], self._ports[store_id] = server, port
        info = self.cluster.stores[store_id]
        info.address, info.up, info.start_timestamp = f"{self.host}:{port}", True, int(time.time())

    async def stop_store(self, store_id: int) -> None:
        """Stop a store's server: its streams break (UNAVAILABLE) and new calls fail to connect."""
        server = self._stores.pop(store_id, None)
        self.cluster.stores[store_id].up = False
        self.hub.reset_store(store_id)
        if server is not None:
            await server.stop(0)

    async def restart_store(self, store_id: int, downtime: float) -> None:
        await self.stop_store(store_id)
        await asyncio.sleep(downtime)
        await self.start_store(store_id)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for store_id in list(self._stores):
            await self.stop_store(store_id)
        await self.stop_pd()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.resolved_ts_interval)
            self.hub.advance_resolved_ts()
