"""The PD client against a scripted PD servicer over real gRPC."""

from __future__ import annotations

import asyncio

import pytest

from cdcflow.core.errors import CheckpointStaleError, PDUnavailableError
from cdcflow.plugins.sources.tikv.gc import PDSafepointKeeper
from cdcflow.plugins.sources.tikv.kvproto import pdpb_pb2, pdpb_pb2_grpc
from cdcflow.plugins.sources.tikv.pd import PDClient, _LeaderLost, _TsoBatcher
from cdcflow.plugins.sources.tikv.regions import encode_bytes

from .scripted import CLUSTER_ID, PDState, ScriptedPD, region, start_server


async def _pd(state: PDState) -> tuple[object, PDClient]:
    server, address = await start_server((pdpb_pb2_grpc.add_PDServicer_to_server, ScriptedPD(state)))
    state.leader_address = address
    client = PDClient([f"http://{address}"], retry_timeout=2.0, rpc_timeout=1.0)
    await client.connect()
    return server, client


def test_members_tso_batches_and_regions() -> None:
    async def main() -> None:
        a, b = encode_bytes(b"a"), encode_bytes(b"m")
        state = PDState(regions=[(region(1, b"", a), 1), (region(2, a, b), 2), (region(3, b, b""), 1)])
        state.stores = {1: "127.0.0.1:1", 2: "127.0.0.1:2"}
        server, pd = await _pd(state)
        try:
            assert pd.cluster_id == CLUSTER_ID
            assert pd.leader == state.leader_address
            many = await asyncio.gather(*(pd.tso() for _ in range(50)))
            assert len(set(many)) == 50
            assert all(ts >> 18 == state.physical for ts in many)
            # Concurrent calls were batched: fewer requests than timestamps.
            tso_calls = [c for c in state.calls if c.startswith("Tso(")]
            assert len(tso_calls) < 50
            assert sum(int(c[4:-1]) for c in tso_calls) == 50
            later = await pd.tso()
            assert later > max(many)

            found = await pd.scan_regions(encode_bytes(b"b"), b"")
            assert [r.id for r in found] == [2, 3]
            assert found[0].leader_store_id == 2
            assert pd.regions.locate(encode_bytes(b"c")) == found[0]
            by_id = await pd.get_region_by_id(1)
            assert by_id is not None and by_id.end == a
            got = await pd.get_region(encode_bytes(b"z"))
            assert got is not None and got.id == 3
            assert await pd.store_address(2) == "127.0.0.1:2"
        finally:
            await pd.close()
            await server.stop(None)

    asyncio.run(main())


def test_unreachable_pd_raises_pd_unavailable() -> None:
    async def main() -> None:
        server, address = await start_server((pdpb_pb2_grpc.add_PDServicer_to_server, ScriptedPD(PDState())))
        await server.stop(None)  # nothing listens there any more
        client = PDClient([address], retry_timeout=0.5, rpc_timeout=0.2)
        with pytest.raises(PDUnavailableError) as info:
            await client.connect()
        assert info.value.code == 3001
        await client.close()

    asyncio.run(main())


def test_pd_saying_not_leader_until_timeout_is_unavailable() -> None:
    async def main() -> None:
        state = PDState()
        server, pd = await _pd(state)
        state.not_leader = True
        try:
            with pytest.raises(PDUnavailableError):
                await pd.get_all_stores()
            # It looked the leader up again while retrying.
            assert state.calls.count("GetMembers") > 1
            state.not_leader = False
            assert await pd.get_all_stores() == {}
        finally:
            await pd.close()
            await server.stop(None)

    asyncio.run(main())


def test_gc_keeper_updates_removes_and_refuses_stale_checkpoints() -> None:
    async def main() -> None:
        state = PDState(gc_safepoint=100)
        server, pd = await _pd(state)
        keeper = PDSafepointKeeper(pd)
        try:
            assert await keeper.update("cdcflow-a", 150, ttl=60) == 150
            assert await keeper.update("cdcflow-b", 120, ttl=60) == 120
            await keeper.remove("cdcflow-b")
            assert state.service_safepoints == {b"cdcflow-a": 150}
            assert await keeper.current() == 100
            with pytest.raises(CheckpointStaleError) as info:
                await keeper.update("cdcflow-a", 90, ttl=60)
            assert info.value.code == 5001
            with pytest.raises(CheckpointStaleError):
                await keeper.check_start_ts(99)
            await keeper.check_start_ts(100)
        finally:
            await pd.close()
            await server.stop(None)

    asyncio.run(main())


def test_follows_the_pd_leader_through_a_follower_and_after_a_failover() -> None:
    async def main() -> None:
        follower_state, leader_state = PDState(), PDState(gc_safepoint=5)
        follower, follower_address = await start_server(
            (pdpb_pb2_grpc.add_PDServicer_to_server, ScriptedPD(follower_state))
        )
        leader, leader_address = await start_server((pdpb_pb2_grpc.add_PDServicer_to_server, ScriptedPD(leader_state)))
        follower_state.leader_address = leader_state.leader_address = leader_address
        pd = PDClient([follower_address, leader_address], retry_timeout=5.0, rpc_timeout=1.0)
        try:
            await pd.connect()  # asks the follower, which names the leader
            assert pd.leader == leader_address
            assert await pd.get_gc_safepoint() == 5
            assert "GetGCSafePoint" not in follower_state.calls
            await leader.stop(None)  # fail-over: the follower is elected
            follower_state.leader_address = follower_address
            follower_state.gc_safepoint = 5
            assert await pd.get_gc_safepoint() == 5
            assert pd.leader == follower_address
            assert await pd.tso() > 0
        finally:
            await pd.close()
            await follower.stop(None)

    asyncio.run(main())


def test_keeper_of_an_unopened_source_owns_its_pd_connection() -> None:
    async def main() -> None:
        from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig

        state = PDState(gc_safepoint=10)
        server, address = await start_server((pdpb_pb2_grpc.add_PDServicer_to_server, ScriptedPD(state)))
        state.leader_address = address
        keeper = TiKVSource(TiKVSourceConfig(pd=[address])).gc_safepoint_keeper()
        try:
            assert await keeper.update_service_gc_safepoint("cf", 60, 5) == 10  # stale: the caller judges
            assert await keeper.update_service_gc_safepoint("cf", 60, 20) == 20
            await keeper.remove_service_gc_safepoint("cf")
            await keeper.remove_service_gc_safepoint("cf")  # idempotent
            assert state.service_safepoints == {}
        finally:
            await keeper.close()
            await server.stop(None)

    asyncio.run(main())


class _HeldTsoCall:
    """A Tso stream whose read waits until the call is cancelled, then raises as grpc does."""

    def __init__(self) -> None:
        self._cancelled = asyncio.Event()
        self.writes = 0

    async def write(self, request: object) -> None:
        self.writes += 1

    async def read(self) -> object:
        await self._cancelled.wait()
        raise asyncio.CancelledError()  # grpc's answer for a call cancelled locally

    def cancel(self) -> None:
        self._cancelled.set()


class _OneStreamPD:
    def __init__(self) -> None:
        self.calls: list[_HeldTsoCall] = []
        self.lost = 0

    def header(self) -> pdpb_pb2.RequestHeader:
        return pdpb_pb2.RequestHeader(cluster_id=1)

    def _tso_stream(self) -> _HeldTsoCall:
        self.calls.append(_HeldTsoCall())
        return self.calls[-1]

    def _lost_leader(self) -> None:
        self.lost += 1


async def _request_in_flight() -> tuple[_TsoBatcher, asyncio.Task[int]]:
    """A batcher whose first request was written and waits for its answer."""
    pd = _OneStreamPD()
    batcher = _TsoBatcher(pd)  # type: ignore[arg-type]
    waiting = asyncio.create_task(batcher.get())
    while not pd.calls or not pd.calls[0].writes:
        await asyncio.sleep(0)
    return batcher, waiting


def test_a_tso_request_whose_stream_is_reset_under_it_fails_to_be_retried_instead_of_hanging() -> None:
    async def body() -> None:
        batcher, waiting = await _request_in_flight()
        await batcher.reset()  # the leader moved while the request waited for its answer
        with pytest.raises(_LeaderLost):
            await asyncio.wait_for(waiting, 10)
        await batcher.close()

    asyncio.run(body())


def test_closing_the_tso_batcher_cancels_the_request_in_flight() -> None:
    async def body() -> None:
        batcher, waiting = await _request_in_flight()
        await batcher.close()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 10)

    asyncio.run(body())
