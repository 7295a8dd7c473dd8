"""A PD client: leader discovery, TSO, regions, stores and service GC safepoints.

Every RPC goes to the PD leader. The leader is found with GetMembers on the
configured endpoints and looked up again whenever a call fails in a way that
a leader change explains (the channel is unavailable, or PD answers "not
leader"). Retries back off exponentially (tenacity) up to ``retry_timeout``
seconds; then the call raises :class:`PDUnavailableError` (3001), which the
coordinator shows as a Warning and retries later.

Not guaranteed: calls are not idempotent across a leader change beyond what
PD itself guarantees (TSOs stay monotonic, GC safepoints only move forward).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from cdcflow.core.data.events import TSO_LOGICAL_BITS
from cdcflow.core.errors import PDUnavailableError
from cdcflow.plugins.sources.tikv.channels import TLSFiles, call_cancelled, host_port, open_channel
from cdcflow.plugins.sources.tikv.kvproto import metapb_pb2, pdpb_pb2, pdpb_pb2_grpc
from cdcflow.plugins.sources.tikv.regions import RegionCache, RegionInfo

__all__ = ["PDClient", "region_info"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)
# A TSO batch never asks for more logical ticks than PD hands out per request.
_TSO_MAX_BATCH = 10_000


class _LeaderLost(Exception):
    """The call failed in a way a PD leader change explains; find the leader and retry."""


class PDRejectedError(PDUnavailableError):
    """PD answered with an error in the response header (it said no)."""


def region_info(region: metapb_pb2.Region, leader: metapb_pb2.Peer | None) -> RegionInfo:
    """A :class:`RegionInfo` from PD's metapb.Region and leader peer."""
    stores = tuple(p.store_id for p in region.peers)
    leader_store = leader.store_id if leader is not None and leader.store_id else (stores[0] if stores else 0)
    return RegionInfo(
        id=region.id,
        start=region.start_key,
        end=region.end_key,
        conf_ver=region.region_epoch.conf_ver,
        version=region.region_epoch.version,
        leader_store_id=leader_store,
        peer_store_ids=stores,
        peer_ids=tuple(p.id for p in region.peers),
    )


class PDClient:
    """One connection to a PD cluster, shared by all feeds of a source."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: TLSFiles | None = None,
        retry_timeout: float = 30.0,
        rpc_timeout: float = 5.0,
        caller_id: str = "cdcflow",
    ) -> None:
        if not endpoints:
            raise ValueError("PDClient needs at least one PD endpoint")
        self._endpoints = [host_port(e) for e in endpoints]
        self._tls = tls
        self._retry_timeout = retry_timeout
        self._rpc_timeout = rpc_timeout
        self._caller_id = caller_id
        self._channel: grpc.aio.Channel | None = None
        self._stub: pdpb_pb2_grpc.PDStub | None = None
        self._leader = ""
        self.cluster_id = 0
        self.regions = RegionCache()
        self._stores: dict[int, metapb_pb2.Store] = {}
        self._tso = _TsoBatcher(self)
        self._leader_lock = asyncio.Lock()

    # -- connection ---------------------------------------------------------

    @property
    def leader(self) -> str:
        """``host:port`` of the PD leader in use ("" before :meth:`connect`)."""
        return self._leader

    async def connect(self) -> None:
        """Find the PD leader; raises PDUnavailableError if none answers in time."""
        await self._retrying(self._find_leader)

    async def close(self) -> None:
        await self._tso.close()
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None

    def header(self) -> pdpb_pb2.RequestHeader:
        return pdpb_pb2.RequestHeader(cluster_id=self.cluster_id, caller_id=self._caller_id)

    async def _find_leader(self) -> None:
        async with self._leader_lock:
            errors: list[str] = []
            candidates = [self._leader, *self._endpoints] if self._leader else list(self._endpoints)
            for address in dict.fromkeys(candidates):
                channel = open_channel(address, self._tls)
                try:
                    resp = await pdpb_pb2_grpc.PDStub(channel).GetMembers(
                        pdpb_pb2.GetMembersRequest(header=self.header()), timeout=self._rpc_timeout
                    )
                except grpc.aio.AioRpcError as exc:
                    errors.append(f"{address}: {exc.code().name} {exc.details()}")
                    continue
                finally:
                    await channel.close()
                if resp.header.error.type != pdpb_pb2.OK or not resp.leader.client_urls:
                    errors.append(f"{address}: no leader ({resp.header.error.message or 'election running'})")
                    continue
                await self._use_leader(host_port(resp.leader.client_urls[0]), resp.header.cluster_id)
                return
            raise _LeaderLost("; ".join(errors))

    async def _use_leader(self, address: str, cluster_id: int) -> None:
        if address != self._leader or self._stub is None:
            if self._channel is not None:
                await self._channel.close()
            self._channel = open_channel(address, self._tls)
            self._stub = pdpb_pb2_grpc.PDStub(self._channel)
            if self._leader and self._leader != address:
                log.info("PD leader moved from %s to %s", self._leader, address)
            self._leader = address
            await self._tso.reset()
        self.cluster_id = cluster_id

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(self._retry_timeout),
                wait=wait_exponential(multiplier=0.05, max=2.0),
                retry=retry_if_exception_type(_LeaderLost),
                reraise=True,
            ):
                with attempt:
                    if self._stub is None and call != self._find_leader:
                        await self._find_leader()
                    return await call()
        except _LeaderLost as exc:
            raise PDUnavailableError(
                f"PD is unreachable at {', '.join(self._endpoints)} after {self._retry_timeout:g}s: {exc}",
                detail={"endpoints": self._endpoints},
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _unary(self, method: str, request: Any) -> Any:
        """Call ``method`` on the leader, following leader changes, checking the header."""

        async def once() -> Any:
            stub = self._stub
            assert stub is not None
            try:
                resp = await getattr(stub, method)(request, timeout=self._rpc_timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _RETRYABLE_CODES:
                    self._stub = None  # look the leader up again before the retry
                    raise _LeaderLost(f"{method} at {self._leader}: {exc.code().name} {exc.details()}") from exc
                raise PDRejectedError(f"PD refused {method}: {exc.code().name} {exc.details()}") from exc
            error = resp.header.error
            if error.type not in (pdpb_pb2.OK, pdpb_pb2.REGION_NOT_FOUND):
                if "not leader" in error.message.lower():
                    self._stub = None
                    raise _LeaderLost(f"{method} at {self._leader}: {error.message}")
                raise PDRejectedError(
                    f"PD refused {method}: {pdpb_pb2.ErrorType.Name(error.type)} {error.message}",
                    detail={"method": method, "pd_error": pdpb_pb2.ErrorType.Name(error.type)},
                )
            return resp

        return await self._retrying(once)

    # -- TSO ----------------------------------------------------------------

    async def tso(self) -> int:
        """A fresh timestamp, ``physical_ms << 18 | logical``; concurrent calls share one request."""
        return await self._retrying(self._tso.get)

    # -- regions and stores -------------------------------------------------

    async def get_region(self, key: bytes) -> RegionInfo | None:
        """The region holding region-space ``key`` (cached), or None if PD knows none."""
        resp = await self._unary("GetRegion", pdpb_pb2.GetRegionRequest(header=self.header(), region_key=key))
        return self._cache_region(resp)

    async def get_region_by_id(self, region_id: int) -> RegionInfo | None:
        req = pdpb_pb2.GetRegionByIDRequest(header=self.header(), region_id=region_id)
        return self._cache_region(await self._unary("GetRegionByID", req))

    def _cache_region(self, resp: pdpb_pb2.GetRegionResponse) -> RegionInfo | None:
        if not resp.HasField("region") or not resp.region.id:
            return None
        info = region_info(resp.region, resp.leader if resp.HasField("leader") else None)
        self.regions.insert(info)
        return info

    async def scan_regions(self, start: bytes, end: bytes, limit: int = 0) -> list[RegionInfo]:
        """Regions overlapping region-space ``[start, end)`` in key order, cached on the way."""
        req = pdpb_pb2.ScanRegionsRequest(header=self.header(), start_key=start, end_key=end, limit=limit)
        resp = await self._unary("ScanRegions", req)
        found: list[RegionInfo] = []
        if resp.regions:
            for r in resp.regions:
                found.append(region_info(r.region, r.leader if r.HasField("leader") else None))
        else:  # servers that only fill the legacy fields
            leaders = list(resp.leaders)
            for i, meta in enumerate(resp.region_metas):
                found.append(region_info(meta, leaders[i] if i < len(leaders) else None))
        for info in found:
            self.regions.insert(info)
        return found

    async def regions_for(self, start: bytes, end: bytes) -> list[RegionInfo]:
        """Regions covering region-space ``[start, end)``: from the cache when it covers the range, else PD."""
        cached = self.regions.covering(start, end)
        if cached is not None:
            return cached
        return await self.scan_regions(start, end)

    async def get_all_stores(self) -> dict[int, metapb_pb2.Store]:
        """Every non-tombstone store by id (refreshes the store cache)."""
        req = pdpb_pb2.GetAllStoresRequest(header=self.header(), exclude_tombstone_stores=True)
        resp = await self._unary("GetAllStores", req)
        self._stores = {s.id: s for s in resp.stores}
        return dict(self._stores)

    async def store_address(self, store_id: int, *, refresh: bool = False) -> str:
        """The client address of store ``store_id``; raises PDRejectedError if PD does not know it."""
        if refresh or store_id not in self._stores:
            await self.get_all_stores()
        store = self._stores.get(store_id)
        if store is None:
            raise PDRejectedError(f"PD knows no store {store_id}", detail={"store_id": store_id})
        return store.address

    # -- GC -----------------------------------------------------------------

    async def update_service_gc_safepoint(self, service_id: str, ttl: int, safe_point: int) -> int:
        """Set ``service_id``'s safepoint (TTL seconds; <= 0 removes it); returns PD's minimum."""
        req = pdpb_pb2.UpdateServiceGCSafePointRequest(
            header=self.header(), service_id=service_id.encode(), TTL=ttl, safe_point=safe_point
        )
        resp = await self._unary("UpdateServiceGCSafePoint", req)
        return int(resp.min_safe_point)

    async def get_gc_safepoint(self) -> int:
        resp = await self._unary("GetGCSafePoint", pdpb_pb2.GetGCSafePointRequest(header=self.header()))
        return int(resp.safe_point)

    # -- used by the TSO batcher -------------------------------------------

    def _tso_stream(self) -> Any:
        if self._stub is None:
            raise _LeaderLost("no PD leader")
        return self._stub.Tso()

    def _lost_leader(self) -> None:
        self._stub = None


class _TsoBatcher:
    """Turns concurrent :meth:`PDClient.tso` calls into one TsoRequest(count=n) on a bidi stream.

    PD answers a request for ``n`` timestamps with the last of them; they are
    ``last - n + 1 … last`` (all with the same physical part).
    """

    def __init__(self, pd: PDClient) -> None:
        self._pd = pd
        self._pending: list[asyncio.Future[int]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None

    async def get(self) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append(future)
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="pd-tso")
        return await future

    async def reset(self) -> None:
        """Drop the stream (the leader moved); the next batch opens a new one."""
        if self._call is not None:
            self._call.cancel()
        self._call = None

    async def close(self) -> None:
        await self.reset()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for future in self._pending:
            future.cancel()
        self._pending.clear()

    async def _run(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:_TSO_MAX_BATCH], self._pending[_TSO_MAX_BATCH:]
            try:
                last = await self._request(len(batch))
            except _LeaderLost as exc:
                for future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            except BaseException as exc:
                # Whatever ends this task (close() cancels it) must not leave the callers
                # of the batch in flight waiting forever: close() only reaches _pending.
                for future in batch:
                    if future.done():
                        continue
                    if isinstance(exc, asyncio.CancelledError):
                        future.cancel()
                    else:
                        future.set_exception(exc)
                raise
            first = last - len(batch) + 1
            for i, future in enumerate(batch):
                if not future.done():
                    future.set_result(first + i)

    async def _request(self, count: int) -> int:
        try:
            if self._call is None:
                self._call = self._pd._tso_stream()
            call = self._call  # reset() may drop self._call while this request waits
            await call.write(pdpb_pb2.TsoRequest(header=self._pd.header(), count=count))
            resp = await call.read()
        except asyncio.CancelledError:
            if not call_cancelled():
                raise
            # The stream was reset while this request waited: it is retried on a new one.
            await self.reset()
            raise _LeaderLost("TSO stream was reset while a request waited") from None
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            await self.reset()
            self._pd._lost_leader()
            raise _LeaderLost(f"TSO stream broke: {exc}") from exc
        if resp is grpc.aio.EOF:
            await self.reset()
            self._pd._lost_leader()
            raise _LeaderLost("TSO stream closed by PD")
        if resp.header.error.type != pdpb_pb2.OK:
            await self.reset()
            self._pd._lost_leader()
            raise _LeaderLost(f"TSO refused: {resp.header.error.message}")
        ts = resp.timestamp
        return (int(ts.physical) << TSO_LOGICAL_BITS) | int(ts.logical)
