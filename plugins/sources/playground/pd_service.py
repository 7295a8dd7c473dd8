"""``pdpb.PD`` served by the playground (grpc.aio): TSO, regions, stores, GC safepoints.

Requests whose header carries another cluster id are answered with a header
error (type UNKNOWN, message naming both ids); a zero cluster id is accepted,
as PD does for clients that do not know the id yet (GetMembers).
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.feed import region_to_pb
from cdcflow.plugins.sources.playground.regions import Region
from cdcflow.plugins.sources.tikv.kvproto import metapb_pb2, pdpb_pb2, pdpb_pb2_grpc

__all__ = ["GCSafePoints", "PDService"]


GC_WORKER = b"gc_worker"


@dataclass
class GCSafePoints:
    """PD's GC safepoint and the service safepoints that hold it back (with TTL).

    As PD does: an update is stored only if its safe point is not below the
    current minimum service safepoint (otherwise the answer's
    ``min_safe_point`` is that minimum, above the request — the caller's data
    may already be gone); TTL <= 0 removes the service. ``gc_worker`` is the
    service safepoint of TiDB's GC worker (infinite TTL): :meth:`advance` sets
    it to the GC target and moves the GC safepoint to the minimum of all
    services. Expired services are purged lazily.
    """

    gc_safe_point: int = 0
    services: dict[bytes, tuple[int, float]] = field(default_factory=dict)  # id -> (safe point, expiry)

    def update(self, service_id: bytes, ttl: int, safe_point: int) -> int:
        self._purge()
        if ttl <= 0:
            if service_id != GC_WORKER:
                self.services.pop(service_id, None)
            return self.min_service_safe_point()
        current = self._min()
        if current is None or safe_point >= current[1]:
            self.services[service_id] = (safe_point, time.monotonic() + ttl)
        return self.min_service_safe_point()

    def min_service_safe_point(self) -> int:
        current = self._min()
        return 0 if current is None else current[1]

    def advance(self, target: int) -> int:
        """Run 'GC' towards ``target``; the GC safepoint never passes a service nor goes back."""
        self._purge()
        previous = self.services.get(GC_WORKER, (0, math.inf))[0]
        self.services[GC_WORKER] = (max(previous, target), math.inf)  # TiDB's GC target only moves on
        self.gc_safe_point = max(self.gc_safe_point, self.min_service_safe_point())
        return self.gc_safe_point

    def _min(self) -> tuple[bytes, int] | None:
        self._purge()
        if not self.services:
            return None
        service, (point, _) = min(self.services.items(), key=lambda item: item[1][0])
        return service, point

    def _purge(self) -> None:
        now = time.monotonic()
        for sid in [s for s, (_, exp) in self.services.items() if exp <= now]:
            del self.services[sid]


def _region_response(region: Region | None, header: pdpb_pb2.ResponseHeader) -> pdpb_pb2.GetRegionResponse:
    if region is None:
        return pdpb_pb2.GetRegionResponse(header=header)
    peer_id, store_id = region.leader_peer
    return pdpb_pb2.GetRegionResponse(
        header=header, region=region_to_pb(region), leader=metapb_pb2.Peer(id=peer_id, store_id=store_id)
    )


class PDService(pdpb_pb2_grpc.PDServicer):
    def __init__(self, cluster: Cluster, address: str = "") -> None:
        self.cluster = cluster
        self.address = address
        self.gc = GCSafePoints()

    def advance_gc(self, target_ts: int) -> int:
        with self.cluster.lock:
            return self.gc.advance(target_ts)

    def _header(self, request: Any) -> pdpb_pb2.ResponseHeader:
        cid = self.cluster.cluster_id
        asked = request.header.cluster_id
        if asked and asked != cid:
            error = pdpb_pb2.Error(type=pdpb_pb2.UNKNOWN, message=f"mismatch cluster id, need {cid} but got {asked}")
            return pdpb_pb2.ResponseHeader(cluster_id=cid, error=error)
        return pdpb_pb2.ResponseHeader(cluster_id=cid)

    async def GetMembers(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        url = f"http://{self.address}"
        member = pdpb_pb2.Member(name="pd-playground", member_id=1, client_urls=[url], peer_urls=[url])
        return pdpb_pb2.GetMembersResponse(
            header=self._header(request), members=[member], leader=member, etcd_leader=member
        )

    async def Tso(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for request in requests:
            header = self._header(request)
            if header.HasField("error"):
                yield pdpb_pb2.TsoResponse(header=header)
                continue
            count = max(1, request.count)
            ts = self.cluster.oracle.allocate(count)
            stamp = pdpb_pb2.Timestamp(physical=ts >> 18, logical=ts & ((1 << 18) - 1))
            yield pdpb_pb2.TsoResponse(header=header, count=count, timestamp=stamp)

    async def GetRegion(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return _region_response(self.cluster.regions.locate(request.region_key), self._header(request))

    async def GetPrevRegion(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return _region_response(self.cluster.regions.previous(request.region_key), self._header(request))

    async def GetRegionByID(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return _region_response(self.cluster.regions.by_id(request.region_id), self._header(request))

    async def ScanRegions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        regions = self.cluster.regions.overlapping(request.start_key, request.end_key)
        if request.limit > 0:
            regions = regions[: request.limit]
        metas = [region_to_pb(r) for r in regions]
        leaders = [metapb_pb2.Peer(id=r.leader_peer[0], store_id=r.leader_store) for r in regions]
        return pdpb_pb2.ScanRegionsResponse(
            header=self._header(request),
            region_metas=metas,
            leaders=leaders,
            regions=[pdpb_pb2.Region(region=m, leader=p) for m, p in zip(metas, leaders, strict=True)],
        )

    async def GetAllStores(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        stores = [
            metapb_pb2.Store(
                id=s.id,
                address=s.address,
                state=metapb_pb2.Up,
                version="8.5.0-playground",
                start_timestamp=s.start_timestamp,
                node_state=metapb_pb2.Serving,
            )
            for s in self.cluster.stores.values()
        ]
        return pdpb_pb2.GetAllStoresResponse(header=self._header(request), stores=stores)

    async def UpdateServiceGCSafePoint(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        with self.cluster.lock:
            min_sp = self.gc.update(request.service_id, request.TTL, request.safe_point)
        return pdpb_pb2.UpdateServiceGCSafePointResponse(
            header=self._header(request), service_id=request.service_id, TTL=request.TTL, min_safe_point=min_sp
        )

    async def GetGCSafePoint(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        with self.cluster.lock:
            safe_point = self.gc.gc_safe_point
        return pdpb_pb2.GetGCSafePointResponse(header=self._header(request), safe_point=safe_point)
