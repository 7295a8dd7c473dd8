"""Scripted PD and TiKV gRPC servicers for unit tests of the PD and EventFeed clients.

They run on grpc.aio servers bound to 127.0.0.1:0 and speak the real protocol
bytes through the generated stubs. They hold no MVCC store: each test says
what a store answers on each ChangeData stream, so every error path and
interleaving can be produced on demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, cdcpb_pb2_grpc, metapb_pb2, pdpb_pb2, pdpb_pb2_grpc

Event = cdcpb_pb2.Event
Row = cdcpb_pb2.Event.Row
CLUSTER_ID = 7


async def start_server(*servicers: tuple[Any, Any]) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    for add, servicer in servicers:
        add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@dataclass
class PDState:
    regions: list[tuple[metapb_pb2.Region, int]] = field(default_factory=list)  # (region, leader store)
    stores: dict[int, str] = field(default_factory=dict)
    physical: int = 1_700_000_000_000
    logical: int = 0
    service_safepoints: dict[bytes, int] = field(default_factory=dict)
    gc_safepoint: int = 0
    leader_address: str = ""
    not_leader: bool = False
    calls: list[str] = field(default_factory=list)


def region(region_id: int, start: bytes, end: bytes, *, version: int = 1, stores: Sequence[int] = (1,)) -> Any:
    return metapb_pb2.Region(
        id=region_id,
        start_key=start,
        end_key=end,
        region_epoch=metapb_pb2.RegionEpoch(conf_ver=1, version=version),
        peers=[metapb_pb2.Peer(id=region_id * 10 + s, store_id=s) for s in stores],
    )


class ScriptedPD(pdpb_pb2_grpc.PDServicer):
    def __init__(self, state: PDState) -> None:
        self.state = state

    def _header(self) -> pdpb_pb2.ResponseHeader:
        if self.state.not_leader:
            return pdpb_pb2.ResponseHeader(
                cluster_id=CLUSTER_ID, error=pdpb_pb2.Error(type=pdpb_pb2.UNKNOWN, message="not leader")
            )
        return pdpb_pb2.ResponseHeader(cluster_id=CLUSTER_ID)

    async def GetMembers(self, request: Any, context: Any) -> Any:
        self.state.calls.append("GetMembers")
        leader = pdpb_pb2.Member(name="pd", member_id=1, client_urls=[f"http://{self.state.leader_address}"])
        return pdpb_pb2.GetMembersResponse(
            header=pdpb_pb2.ResponseHeader(cluster_id=CLUSTER_ID), members=[leader], leader=leader
        )

    async def Tso(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for req in request_iterator:
            self.state.calls.append(f"Tso({req.count})")
            self.state.logical += req.count
            yield pdpb_pb2.TsoResponse(
                header=self._header(),
                count=req.count,
                timestamp=pdpb_pb2.Timestamp(physical=self.state.physical, logical=self.state.logical),
            )

    def _find(self, key: bytes) -> tuple[Any, int] | None:
        for meta, leader in self.state.regions:
            if meta.start_key <= key and (not meta.end_key or key < meta.end_key):
                return meta, leader
        return None

    async def GetRegion(self, request: Any, context: Any) -> Any:
        self.state.calls.append("GetRegion")
        found = self._find(request.region_key)
        if found is None:
            return pdpb_pb2.GetRegionResponse(header=self._header())
        meta, leader = found
        return pdpb_pb2.GetRegionResponse(header=self._header(), region=meta, leader=_peer(meta, leader))

    async def GetRegionByID(self, request: Any, context: Any) -> Any:
        self.state.calls.append("GetRegionByID")
        for meta, leader in self.state.regions:
            if meta.id == request.region_id:
                return pdpb_pb2.GetRegionResponse(header=self._header(), region=meta, leader=_peer(meta, leader))
        return pdpb_pb2.GetRegionResponse(header=self._header())

    async def ScanRegions(self, request: Any, context: Any) -> Any:
        self.state.calls.append("ScanRegions")
        out = []
        for meta, leader in sorted(self.state.regions, key=lambda r: r[0].start_key):
            if meta.end_key and meta.end_key <= request.start_key:
                continue
            if request.end_key and meta.start_key >= request.end_key:
                continue
            out.append(pdpb_pb2.Region(region=meta, leader=_peer(meta, leader)))
        return pdpb_pb2.ScanRegionsResponse(header=self._header(), regions=out)

    async def GetAllStores(self, request: Any, context: Any) -> Any:
        self.state.calls.append("GetAllStores")
        stores = [metapb_pb2.Store(id=i, address=a) for i, a in self.state.stores.items()]
        return pdpb_pb2.GetAllStoresResponse(header=self._header(), stores=stores)

    async def UpdateServiceGCSafePoint(self, request: Any, context: Any) -> Any:
        sps = self.state.service_safepoints
        gc = self.state.gc_safepoint
        if request.TTL <= 0:
            sps.pop(request.service_id, None)
            minimum = min(sps.values(), default=gc)
        elif request.safe_point < gc:
            minimum = gc  # PD refuses to move a service safepoint below the GC safepoint
        else:
            sps[request.service_id] = request.safe_point
            minimum = min(sps.values())
        return pdpb_pb2.UpdateServiceGCSafePointResponse(
            header=self._header(), service_id=request.service_id, TTL=request.TTL, min_safe_point=minimum
        )

    async def GetGCSafePoint(self, request: Any, context: Any) -> Any:
        self.state.calls.append("GetGCSafePoint")
        return pdpb_pb2.GetGCSafePointResponse(header=self._header(), safe_point=self.state.gc_safepoint)


def _peer(meta: Any, store_id: int) -> Any:
    for p in meta.peers:
        if p.store_id == store_id:
            return p
    return metapb_pb2.Peer(id=meta.id * 10 + store_id, store_id=store_id)


class StoreConn:
    """One ChangeData stream as the store sees it: the requests in, a script of events out."""

    def __init__(self, method: str, metadata: dict[str, str]) -> None:
        self.method = method
        self.metadata = metadata
        self.requests: asyncio.Queue[Any] = asyncio.Queue()
        self._out: asyncio.Queue[Any] = asyncio.Queue()

    async def request(self, timeout: float = 10.0) -> Any:
        return await asyncio.wait_for(self.requests.get(), timeout)

    def send(self, *events: Any, resolved: tuple[Sequence[int], int, int] | None = None) -> None:
        if events:
            self._out.put_nowait(cdcpb_pb2.ChangeDataEvent(events=list(events)))
        if resolved is not None:
            regions, ts, request_id = resolved
            rts = cdcpb_pb2.ResolvedTs(regions=list(regions), ts=ts, request_id=request_id)
            self._out.put_nowait(cdcpb_pb2.ChangeDataEvent(resolved_ts=rts))

    def abort(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self._out.put_nowait(code)


class ScriptedStore(cdcpb_pb2_grpc.ChangeDataServicer):
    """A TiKV store's ChangeData service; ``conns`` yields each new stream."""

    def __init__(self, *, v2: bool = True) -> None:
        self.v2 = v2
        self.conns: asyncio.Queue[StoreConn] = asyncio.Queue()

    async def next_conn(self, timeout: float = 10.0) -> StoreConn:
        return await asyncio.wait_for(self.conns.get(), timeout)

    async def EventFeed(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for item in self._serve("EventFeed", request_iterator, context):
            yield item

    async def EventFeedV2(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        if not self.v2:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown feature stream-multiplexing")
        async for item in self._serve("EventFeedV2", request_iterator, context):
            yield item

    async def _serve(self, method: str, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        conn = StoreConn(method, dict(context.invocation_metadata()))
        self.conns.put_nowait(conn)

        async def pump() -> None:
            async for req in request_iterator:
                conn.requests.put_nowait(req)

        reader = asyncio.create_task(pump())
        try:
            while True:
                item = await conn._out.get()
                if isinstance(item, grpc.StatusCode):
                    await context.abort(item, "scripted failure")
                yield item
        finally:
            reader.cancel()


def entry(kind: int, key: bytes, *, start: int = 0, commit: int = 0, value: bytes = b"", old: bytes = b"",
          op: int = Row.PUT, generation: int = 0) -> Any:  # fmt: skip
    return Row(
        start_ts=start, commit_ts=commit, type=kind, op_type=op, key=key, value=value, old_value=old,
        generation=generation,
    )  # fmt: skip


def entries(region_id: int, request_id: int, *rows: Any) -> Any:
    return Event(region_id=region_id, request_id=request_id, entries=Event.Entries(entries=list(rows)))


def error_event(region_id: int, request_id: int, **error: Any) -> Any:
    return Event(region_id=region_id, request_id=request_id, error=cdcpb_pb2.Error(**error))
