"""The EventFeed client against scripted PD and TiKV servicers over real gRPC.

Each test plays a store's side of the ChangeData stream: it reads the
client's ChangeDataRequests and answers with the entries, resolved ts and
errors of the scenario, then checks what the feed yields.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from cdcflow.core.data.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.core.errors import CdcflowError, UnsupportedProtocolError
from cdcflow.plugins.sources.tikv.eventfeed import ClusterIDMismatchError, EventFeedClient
from cdcflow.plugins.sources.tikv.kvproto import (
    cdcpb_pb2,
    cdcpb_pb2_grpc,
    errorpb_pb2,
    kvrpcpb_pb2,
    metapb_pb2,
    pdpb_pb2_grpc,
)
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.regions import encode_bytes

from .scripted import (
    CLUSTER_ID,
    Event,
    PDState,
    Row,
    ScriptedPD,
    ScriptedStore,
    StoreConn,
    entries,
    entry,
    error_event,
    region,
    start_server,
)

SPAN = Span(1, b"k", b"l")
LO, HI = encode_bytes(b"k"), encode_bytes(b"l")
MID = encode_bytes(b"k5")


@dataclass
class Cluster:
    pd_state: PDState
    stores: dict[int, ScriptedStore]
    client: EventFeedClient
    events: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    servers: list[Any] = field(default_factory=list)

    async def next(self, timeout: float = 10.0) -> Any:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def expect_quiet(self) -> None:
        """Nothing more is yielded while the client handles what was sent (a round trip later)."""
        # Time passes on purpose (not a wait on a condition): nothing may arrive in the window.
        await asyncio.sleep(0.2)
        assert self.events.empty(), self.events.get_nowait()


@asynccontextmanager
async def cluster(
    regions: list[tuple[Any, int]], stores: dict[int, ScriptedStore], *, retry_timeout: float = 5.0
) -> AsyncIterator[Cluster]:
    servers = []
    state = PDState(regions=regions)
    pd_server, pd_address = await start_server((pdpb_pb2_grpc.add_PDServicer_to_server, ScriptedPD(state)))
    state.leader_address = pd_address
    servers.append(pd_server)
    for store_id, store in stores.items():
        server, address = await start_server((cdcpb_pb2_grpc.add_ChangeDataServicer_to_server, store))
        servers.append(server)
        state.stores[store_id] = address
    pd = PDClient([pd_address], retry_timeout=5.0, rpc_timeout=2.0)
    await pd.connect()
    client = EventFeedClient(pd, retry_timeout=retry_timeout, backoff_max=0.05)
    c = Cluster(state, stores, client, servers=servers)
    try:
        yield c
    finally:
        await client.close()
        await pd.close()
        for server in servers:
            await server.stop(None)


def run_feed(c: Cluster, span: Span, start_ts: int) -> asyncio.Task[None]:
    async def pump() -> None:
        try:
            async for ev in c.client.feed(span, start_ts):
                await c.events.put(ev)
        except CdcflowError as exc:
            await c.events.put(exc)

    return asyncio.create_task(pump())


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


async def _registered(conn: StoreConn) -> Any:
    req = await conn.request()
    assert not req.HasField("deregister")
    return req


def kv(ev: Any) -> tuple[bytes, bytes, int, int, bool]:
    assert isinstance(ev, RawKVEvent), ev
    return ev.key, ev.value, ev.start_ts, ev.commit_ts, ev.delete


def test_request_fields_and_scan_then_live_stream() -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            feed = run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            assert conn.method == "EventFeedV2"
            assert conn.metadata.get("features") == "stream-multiplexing"
            req = await _registered(conn)
            assert req.header.cluster_id == CLUSTER_ID and req.header.ticdc_version
            assert (req.region_id, req.region_epoch.version, req.checkpoint_ts) == (10, 1, 100)
            assert (req.start_key, req.end_key) == (LO, HI)  # memcomparable, clipped to the span
            assert req.extra_op == kvrpcpb_pb2.ReadOldValue
            assert req.kv_api == cdcpb_pb2.ChangeDataRequest.TiDB
            rid = req.request_id

            conn.send(
                entries(
                    10,
                    rid,
                    entry(Event.COMMITTED, b"k1", start=101, commit=102, value=b"v1"),
                    entry(Event.COMMITTED, b"k0", start=90, commit=100, value=b"old"),  # at the checkpoint: stale
                    entry(Event.PREWRITE, b"k2", start=103, value=b"v2", old=b"o2"),
                    entry(Event.INITIALIZED, b""),
                )
            )
            assert kv(await c.next()) == (b"k1", b"v1", 101, 102, False)
            # Resolved ts before INITIALIZED would not count; after it, it does.
            conn.send(resolved=([10], 104, rid))
            assert await c.next() == ResolvedEvent(SPAN, 104)
            conn.send(entries(10, rid, entry(Event.COMMIT, b"k2", start=103, commit=105)))
            assert kv(await c.next()) == (b"k2", b"v2", 103, 105, False)
            conn.send(
                entries(
                    10,
                    rid,
                    entry(Event.PREWRITE, b"k3", start=106, op=Row.DELETE, old=b"o3"),
                    entry(Event.COMMIT, b"k3", start=106, commit=107, op=Row.DELETE),
                )
            )
            ev = await c.next()
            assert kv(ev) == (b"k3", b"", 106, 107, True) and ev.old_value == b"o3"
            feed.cancel()
            # Cancelling the feed deregisters its regions.
            dereg = await conn.request()
            assert dereg.HasField("deregister") and dereg.request_id == rid and dereg.region_id == 10

    run(body)


def test_matcher_interleavings() -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            rid = (await _registered(conn)).request_id
            conn.send(
                entries(
                    10,
                    rid,
                    # A live COMMIT before the scan reports its lock: cached, matched later.
                    entry(Event.COMMIT, b"k1", start=101, commit=110),
                    entry(Event.PREWRITE, b"k1", start=101, value=b"v1"),
                    # A heartbeat's empty prewrite does not erase the value.
                    entry(Event.PREWRITE, b"k2", start=102, value=b"v2"),
                    entry(Event.PREWRITE, b"k2", start=102, value=b""),
                    # Pipelined DML: the highest generation wins, whatever the order.
                    entry(Event.PREWRITE, b"k3", start=103, value=b"gen2", generation=2),
                    entry(Event.PREWRITE, b"k3", start=103, value=b"gen1", generation=1),
                    # Rolled back: never emitted.
                    entry(Event.PREWRITE, b"k4", start=104, value=b"rolled"),
                    entry(Event.ROLLBACK, b"k4", start=104),
                    # A commit whose lock the scan never reports was delivered as COMMITTED.
                    entry(Event.COMMITTED, b"k5", start=95, commit=105, value=b"v5"),
                    entry(Event.COMMIT, b"k5", start=95, commit=105),
                    entry(Event.INITIALIZED, b""),
                )
            )
            # Held until INITIALIZED, then released in commit-ts order.
            assert kv(await c.next()) == (b"k5", b"v5", 95, 105, False)
            assert kv(await c.next()) == (b"k1", b"v1", 101, 110, False)
            conn.send(
                entries(
                    10,
                    rid,
                    entry(Event.COMMIT, b"k2", start=102, commit=111),
                    entry(Event.COMMIT, b"k3", start=103, commit=112),
                    # Stale: committed at or below the checkpoint.
                    entry(Event.PREWRITE, b"k6", start=90, value=b"stale"),
                    entry(Event.COMMIT, b"k6", start=90, commit=99),
                    # Outside the span: older stores do not filter.
                    entry(Event.PREWRITE, b"zz", start=113, value=b"x"),
                    entry(Event.COMMIT, b"zz", start=113, commit=114),
                )
            )
            assert kv(await c.next()) == (b"k2", b"v2", 102, 111, False)
            assert kv(await c.next()) == (b"k3", b"gen2", 103, 112, False)
            await c.expect_quiet()

    run(body)


def test_live_rows_overtaking_a_late_scan_come_out_in_commit_ts_order() -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            rid = (await _registered(conn)).request_id
            conn.send(
                entries(
                    10,
                    rid,
                    # Live traffic first: k1 committed at 120.
                    entry(Event.PREWRITE, b"k1", start=115, value=b"live"),
                    entry(Event.COMMIT, b"k1", start=115, commit=120),
                )
            )
            await c.expect_quiet()  # held until the scan is complete
            conn.send(
                entries(
                    10,
                    rid,
                    # The scan, late, newest version of a key first (as TiKV's write CF);
                    # one commit also reported live; one at the checkpoint (stale).
                    entry(Event.COMMITTED, b"k1", start=108, commit=110, value=b"scan-110"),
                    entry(Event.COMMITTED, b"k1", start=103, commit=105, value=b"scan-105"),
                    entry(Event.COMMITTED, b"k1", start=115, commit=120, value=b"live"),
                    entry(Event.COMMITTED, b"k2", start=90, commit=100, value=b"stale"),
                    entry(Event.INITIALIZED, b""),
                )
            )
            got = [kv(await c.next()) for _ in range(3)]
            assert got == [
                (b"k1", b"scan-105", 103, 105, False),
                (b"k1", b"scan-110", 108, 110, False),
                (b"k1", b"live", 115, 120, False),
            ]
            await c.expect_quiet()

    run(body)


def test_span_split_over_regions_and_frontier_is_the_minimum() -> None:
    async def body() -> None:
        store1, store2 = ScriptedStore(), ScriptedStore()
        regions = [(region(10, b"", MID), 1), (region(11, MID, b"", stores=(2,)), 2)]
        async with cluster(regions, {1: store1, 2: store2}) as c:
            run_feed(c, SPAN, 100)
            conn1, conn2 = await store1.next_conn(), await store2.next_conn()
            r1, r2 = await _registered(conn1), await _registered(conn2)
            assert (r1.region_id, r1.start_key, r1.end_key) == (10, LO, MID)
            assert (r2.region_id, r2.start_key, r2.end_key) == (11, MID, HI)
            rid = r1.request_id
            assert r2.request_id == rid
            for conn, rg in ((conn1, 10), (conn2, 11)):
                conn.send(entries(rg, rid, entry(Event.INITIALIZED, b"")))
            conn1.send(resolved=([10], 150, rid))
            await c.expect_quiet()  # region 11 still at 100
            conn2.send(resolved=([11], 140, rid))
            assert await c.next() == ResolvedEvent(SPAN, 140)
            conn2.send(resolved=([11], 130, rid))  # backwards: ignored
            conn2.send(resolved=([11], 160, rid))
            assert await c.next() == ResolvedEvent(SPAN, 150)

    run(body)


def test_epoch_not_match_resplits_from_the_range_resolved_ts() -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            rid = (await _registered(conn)).request_id
            conn.send(entries(10, rid, entry(Event.INITIALIZED, b"")), resolved=([10], 120, rid))
            assert await c.next() == ResolvedEvent(SPAN, 120)
            conn.send(entries(10, rid, entry(Event.COMMITTED, b"k1", start=121, commit=125, value=b"x")))
            assert kv(await c.next())[3] == 125
            # The region splits at MID.
            c.pd_state.regions = [(region(10, b"", MID, version=2), 1), (region(12, MID, b"", version=2), 1)]
            new_regions = [r for r, _ in c.pd_state.regions]
            conn.send(error_event(10, rid, epoch_not_match=errorpb_pb2.EpochNotMatch(current_regions=new_regions)))
            reqs = {}
            for _ in range(2):
                req = await _registered(conn)
                reqs[req.region_id] = req
            assert set(reqs) == {10, 12}
            assert {r.checkpoint_ts for r in reqs.values()} == {120}
            # The change at 125 is above the frontier: replayed, it is delivered again (at least once).
            conn.send(entries(10, rid, entry(Event.COMMITTED, b"k1", start=121, commit=125, value=b"x")))
            assert kv(await c.next())[3] == 125


def test_epoch_not_match_checkpoints_and_duplicates_only_above_frontier() -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            rid = (await _registered(conn)).request_id
            conn.send(entries(10, rid, entry(Event.INITIALIZED, b"")), resolved=([10], 120, rid))
            assert await c.next() == ResolvedEvent(SPAN, 120)
            c.pd_state.regions = [(region(10, b"", MID, version=2), 1), (region(12, MID, b"", version=2), 1)]
            conn.send(error_event(10, rid, epoch_not_match=errorpb_pb2.EpochNotMatch()))
            reqs = {}
            for _ in range(2):
                r = await _registered(conn)
                reqs[r.region_id] = r
            assert reqs[10].checkpoint_ts == reqs[12].checkpoint_ts == 120
            assert (reqs[10].start_key, reqs[10].end_key, reqs[10].region_epoch.version) == (LO, MID, 2)
            assert (reqs[12].start_key, reqs[12].end_key) == (MID, HI)
            # The new subscriptions replay from 120: an event at 120 (the frontier) is dropped,
            # one above it is delivered (a duplicate of a delivered one would be allowed here).
            conn.send(
                entries(
                    12,
                    rid,
                    entry(Event.COMMITTED, b"k6", start=110, commit=120, value=b"dup"),
                    entry(Event.COMMITTED, b"k7", start=121, commit=122, value=b"new"),
                    entry(Event.INITIALIZED, b""),
                )
            )
            assert kv(await c.next())[:2] == (b"k7", b"new")
            conn.send(entries(10, rid, entry(Event.INITIALIZED, b"")))
            conn.send(resolved=([10, 12], 130, rid))
            assert await c.next() == ResolvedEvent(SPAN, 130)

    run(body)


def test_region_not_found_reloads_and_not_leader_moves_to_new_store() -> None:
    async def body() -> None:
        store1, store2 = ScriptedStore(), ScriptedStore()
        async with cluster([(region(10, b"", b"", stores=(1, 2)), 1)], {1: store1, 2: store2}) as c:
            run_feed(c, SPAN, 100)
            conn1 = await store1.next_conn()
            rid = (await _registered(conn1)).request_id
            conn1.send(error_event(10, rid, region_not_found=errorpb_pb2.RegionNotFound(region_id=10)))
            again = await _registered(conn1)
            assert again.region_id == 10 and again.checkpoint_ts == 100
            assert c.pd_state.calls.count("ScanRegions") >= 2
            leader = metapb_pb2.Peer(id=102, store_id=2)
            conn1.send(error_event(10, rid, not_leader=errorpb_pb2.NotLeader(region_id=10, leader=leader)))
            conn2 = await store2.next_conn()
            moved = await _registered(conn2)
            assert moved.region_id == 10 and moved.checkpoint_ts == 100
            conn2.send(entries(10, rid, entry(Event.INITIALIZED, b"")), resolved=([10], 101, rid))
            assert await c.next() == ResolvedEvent(SPAN, 101)

    run(body)


def test_server_is_busy_and_congested_back_off_then_retry() -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            rid = (await _registered(conn)).request_id
            busy = errorpb_pb2.ServerIsBusy(reason="scheduler", backoff_ms=50)
            conn.send(error_event(10, rid, server_is_busy=busy))
            assert (await _registered(conn)).region_id == 10
            conn.send(error_event(10, rid, congested=cdcpb_pb2.Congested(region_id=10)))
            assert (await _registered(conn)).region_id == 10

    run(body)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ({"compatibility": cdcpb_pb2.Compatibility(required_version="9.0")}, UnsupportedProtocolError),
        ({"cluster_id_mismatch": cdcpb_pb2.ClusterIDMismatch(current=8, request=7)}, ClusterIDMismatchError),
        ({"duplicate_request": cdcpb_pb2.DuplicateRequest(region_id=10)}, CdcflowError),
    ],
)
def test_fatal_region_errors_fail_the_feed(error: dict[str, Any], expected: type[Exception]) -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            rid = (await _registered(conn)).request_id
            conn.send(error_event(10, rid, **error))
            got = await c.next()
            assert isinstance(got, expected), got

    run(body)


def test_v2_unimplemented_falls_back_to_eventfeed() -> None:
    async def body() -> None:
        store = ScriptedStore(v2=False)
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            assert conn.method == "EventFeed"
            req = await _registered(conn)
            assert req.checkpoint_ts == 100
            # Without multiplexing the store may send resolved ts without a request id.
            conn.send(entries(10, req.request_id, entry(Event.INITIALIZED, b"")), resolved=([10], 105, 0))
            assert await c.next() == ResolvedEvent(SPAN, 105)
            assert c.client.v1_stores == {c.pd_state.stores[1]}

    run(body)


def test_broken_stream_resubscribes_every_region_from_its_resolved_ts() -> None:
    async def body() -> None:
        store = ScriptedStore()
        regions = [(region(10, b"", MID), 1), (region(11, MID, b""), 1)]
        async with cluster(regions, {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            r = [await _registered(conn), await _registered(conn)]
            rid = r[0].request_id
            conn.send(entries(10, rid, entry(Event.INITIALIZED, b"")), resolved=([10], 130, rid))
            conn.send(entries(11, rid, entry(Event.INITIALIZED, b"")), resolved=([11], 120, rid))
            assert await c.next() == ResolvedEvent(SPAN, 120)
            conn.abort(grpc.StatusCode.UNAVAILABLE)
            conn2 = await store.next_conn()
            again = {}
            for _ in range(2):
                req = await _registered(conn2)
                again[req.region_id] = req.checkpoint_ts
            assert again == {10: 130, 11: 120}

    run(body)


def test_unreachable_store_backs_off_then_fails_with_a_warning() -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}, retry_timeout=0.5) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            await _registered(conn)
            await c.servers[1].stop(None)  # the store goes away for good
            got = await c.next(timeout=30)
            assert isinstance(got, CdcflowError), got
            assert got.severity.value == "WARN" and got.retryable.value == "RETRY"
            assert "kept failing" in got.message

    run(body)


def test_feeds_share_one_stream_per_store_and_the_region_cache() -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            other = Span(2, b"m", b"n")
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            first = await _registered(conn)
            run_feed(c, other, 200)
            second = await _registered(conn)  # same stream: multiplexed by request id
            assert first.request_id != second.request_id
            assert (second.start_key, second.end_key, second.checkpoint_ts) == (
                encode_bytes(b"m"),
                encode_bytes(b"n"),
                200,
            )
            assert store.conns.empty()
            assert c.pd_state.calls.count("ScanRegions") == 1  # the second feed used the cache
            conn.send(
                entries(10, first.request_id, entry(Event.INITIALIZED, b"")),
                entries(10, second.request_id, entry(Event.INITIALIZED, b"")),
                resolved=([10], 300, second.request_id),
            )
            got = await c.next()
            assert got == ResolvedEvent(other, 300)
            await c.expect_quiet()  # the first feed's request id was not resolved

    run(body)


def test_abandoned_feed_does_not_block_the_shared_stream_and_close_ends_feeds() -> None:
    async def body() -> None:
        store = ScriptedStore()
        async with cluster([(region(10, b"", b""), 1)], {1: store}) as c:
            c.client._queue_size = 1
            stuck = c.client.feed(Span(2, b"m", b"n"), 100)
            first = asyncio.ensure_future(anext(stuck))  # subscribes, then nobody reads
            conn = await store.next_conn()
            abandoned = await _registered(conn)
            live_feed = run_feed(c, SPAN, 100)
            live = await _registered(conn)
            rows = [entry(Event.COMMITTED, b"m%d" % i, start=101, commit=102 + i, value=b"v") for i in range(5)]
            conn.send(entries(10, abandoned.request_id, *rows, entry(Event.INITIALIZED, b"")))
            await first  # one event taken; the rest fill the queue and block the stream's reader
            await stuck.aclose()  # the consumer goes away
            conn.send(
                entries(
                    10,
                    live.request_id,
                    entry(Event.COMMITTED, b"k1", start=101, commit=102, value=b"x"),
                    entry(Event.INITIALIZED, b""),
                )
            )
            assert kv(await c.next())[0] == b"k1"
            await c.client.close()
            # The feed of SPAN ends: its pump task finishes without an error.
            await asyncio.wait_for(live_feed, 5)
            assert c.events.empty()

    run(body)


def test_merge_widens_the_surviving_region_to_both_parts() -> None:
    async def body() -> None:
        store = ScriptedStore()
        regions = [(region(10, b"", MID), 1), (region(11, MID, b""), 1)]
        async with cluster(regions, {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            rid = (await _registered(conn)).request_id
            await _registered(conn)
            conn.send(entries(10, rid, entry(Event.INITIALIZED, b"")), resolved=([10], 150, rid))
            conn.send(entries(11, rid, entry(Event.INITIALIZED, b"")), resolved=([11], 120, rid))
            assert await c.next() == ResolvedEvent(SPAN, 120)
            # Region 11 merges into region 10; only region 11 is told so far.
            c.pd_state.regions = [(region(10, b"", b"", version=3), 1)]
            conn.send(error_event(11, rid, region_not_found=errorpb_pb2.RegionNotFound(region_id=11)))
            dereg = await conn.request()
            assert dereg.HasField("deregister") and dereg.region_id == 10
            widened = await _registered(conn)
            assert (widened.region_id, widened.start_key, widened.end_key) == (10, LO, HI)
            assert widened.checkpoint_ts == 120 and widened.region_epoch.version == 3
            conn.send(entries(10, rid, entry(Event.INITIALIZED, b"")), resolved=([10], 200, rid))
            assert await c.next() == ResolvedEvent(SPAN, 200)

    run(body)


def test_stream_break_after_a_merge_registers_the_merged_region_once_per_stream() -> None:
    async def body() -> None:
        store = ScriptedStore()
        regions = [(region(10, b"", MID), 1), (region(11, MID, b""), 1)]
        async with cluster(regions, {1: store}) as c:
            run_feed(c, SPAN, 100)
            conn = await store.next_conn()
            rid = (await _registered(conn)).request_id
            await _registered(conn)
            c.pd_state.regions = [(region(10, b"", b"", version=3), 1)]  # merged while the stream breaks
            conn.abort(grpc.StatusCode.UNAVAILABLE)
            conn2 = await store.next_conn()
            live: dict[int, tuple[bytes, bytes]] = {}
            while live.get(10) != (LO, HI):
                req = await conn2.request()
                if req.HasField("deregister"):
                    assert req.region_id in live
                    del live[req.region_id]
                else:
                    # Never a second registration of a region still registered on this stream.
                    assert req.region_id not in live, (req.region_id, live)
                    live[req.region_id] = (req.start_key, req.end_key)
            conn2.send(entries(10, rid, entry(Event.INITIALIZED, b"")), resolved=([10], 200, rid))
            assert await c.next() == ResolvedEvent(SPAN, 200)

    run(body)
