"""Fuzz: the EventFeed client against a malicious TiKV store, over real gRPC.

The store answers the client's registration with hostile ChangeDataEvent
frames — random bytes, or well-formed messages with hostile fields (unknown
event and op types, keys outside the region and the span, commit ts below
start ts, empty or large values, resolved ts going backwards, unknown region
and request ids, region errors) — and then with a well-formed INITIALIZED and
resolved ts. Whatever it sent, the feed either goes on (it reaches that
resolved ts, every change it yielded inside its span and above its start ts)
or ends with a coded CdcflowError, within a bounded time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.core.errors import CdcflowError
from cdcflow.plugins.sources.tikv.eventfeed import EventFeedClient
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, errorpb_pb2, metapb_pb2, pdpb_pb2_grpc
from cdcflow.plugins.sources.tikv.pd import PDClient
from tests.unit.fuzz.profiles import scaled
from tests.unit.plugins.sources.tikv.scripted import PDState, ScriptedPD, region, start_server

Event = cdcpb_pb2.Event
Row = cdcpb_pb2.Event.Row
SPAN = Span(1, b"k", b"l")
START_TS = 100
FINAL_TS = 10_000
U64 = st.integers(0, 2**64 - 1)

#: A frame is raw bytes, or ("events", [callable(request) -> Event]) / ("resolved", regions, ts, rid)
KEYS = st.one_of(st.sampled_from([b"k1", b"k2", b"k", b"kz"]), st.binary(max_size=12))

ROWS = st.builds(
    Row,
    start_ts=st.one_of(st.integers(START_TS - 5, START_TS + 50), U64),
    commit_ts=st.one_of(st.integers(0, START_TS + 60), U64),
    type=st.one_of(
        st.sampled_from([Event.INITIALIZED, Event.COMMITTED, Event.PREWRITE, Event.COMMIT, Event.ROLLBACK]),
        st.integers(0, 50),
    ),
    op_type=st.integers(0, 10),
    key=KEYS,
    value=st.one_of(st.just(b""), st.binary(max_size=16), st.just(b"v" * 200_000)),
    old_value=st.binary(max_size=8),
    generation=U64,
)
ERRORS = st.sampled_from(
    [
        cdcpb_pb2.Error(not_leader=errorpb_pb2.NotLeader(region_id=10, leader=metapb_pb2.Peer(store_id=1))),
        cdcpb_pb2.Error(not_leader=errorpb_pb2.NotLeader(region_id=10, leader=metapb_pb2.Peer(store_id=99))),
        cdcpb_pb2.Error(epoch_not_match=errorpb_pb2.EpochNotMatch()),
        cdcpb_pb2.Error(region_not_found=errorpb_pb2.RegionNotFound(region_id=10)),
        cdcpb_pb2.Error(server_is_busy=errorpb_pb2.ServerIsBusy(backoff_ms=2**60)),
        cdcpb_pb2.Error(duplicate_request=cdcpb_pb2.DuplicateRequest(region_id=10)),
        cdcpb_pb2.Error(compatibility=cdcpb_pb2.Compatibility(required_version="9.9.9")),
        cdcpb_pb2.Error(cluster_id_mismatch=cdcpb_pb2.ClusterIDMismatch(current=1, request=2)),
        cdcpb_pb2.Error(),
    ]
)


@st.composite
def frames(draw: st.DrawFn) -> list[Any]:
    out: list[Any] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["bytes", "entries", "entries", "resolved", "error", "admin"]))
        region_id = draw(st.one_of(st.just(10), U64))
        own_request = draw(st.booleans()) or draw(st.booleans())
        if kind == "bytes":
            out.append(draw(st.binary(max_size=64)))
        elif kind == "entries":
            out.append(
                ("event", region_id, own_request, {"entries": Event.Entries(entries=draw(st.lists(ROWS, max_size=6)))})
            )
        elif kind == "error":
            out.append(("event", region_id, own_request, {"error": draw(ERRORS)}))
        elif kind == "admin":
            out.append(("event", region_id, own_request, {"resolved_ts": draw(U64)}))
        else:
            out.append(("resolved", [region_id, *draw(st.lists(U64, max_size=3))], draw(U64), own_request))
    return out


class MaliciousStore:
    """A store that sends ``script`` on its first stream, then behaves (INITIALIZED, resolved ts)."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.streams = 0

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self._serve,
            request_deserializer=cdcpb_pb2.ChangeDataRequest.FromString,
            response_serializer=lambda b: b,  # the frames are bytes already: any bytes at all
        )
        return grpc.method_handlers_generic_handler("cdcpb.ChangeData", {"EventFeedV2": method, "EventFeed": method})

    async def _serve(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
        self.streams += 1
        hostile = self.streams == 1
        async for req in requests:
            if req.HasField("deregister"):
                continue
            rid = req.request_id
            if hostile:
                hostile = False
                for frame in self.script:
                    yield self._bytes(frame, rid, req.region_id)
            yield cdcpb_pb2.ChangeDataEvent(
                events=[
                    Event(
                        region_id=req.region_id,
                        request_id=rid,
                        entries=Event.Entries(entries=[Row(type=Event.INITIALIZED)]),
                    )
                ]
            ).SerializeToString()
            yield cdcpb_pb2.ChangeDataEvent(
                resolved_ts=cdcpb_pb2.ResolvedTs(regions=[req.region_id], ts=FINAL_TS, request_id=rid)
            ).SerializeToString()

    @staticmethod
    def _bytes(frame: Any, rid: int, region_id: int) -> bytes:
        if isinstance(frame, bytes):
            return frame
        if frame[0] == "event":
            _, rgn, own, fields = frame
            event = Event(region_id=region_id if rgn == 10 else rgn, request_id=rid if own else rid + 1, **fields)
            return cdcpb_pb2.ChangeDataEvent(events=[event]).SerializeToString()
        _, regions, ts, own = frame
        regions = [region_id if r == 10 else r for r in regions]
        return cdcpb_pb2.ChangeDataEvent(
            resolved_ts=cdcpb_pb2.ResolvedTs(regions=regions, ts=ts, request_id=rid if own else 0)
        ).SerializeToString()


async def _run(script: list[Any]) -> list[Any]:
    state = PDState(regions=[(region(10, b"", b""), 1)])
    pd_server, pd_address = await start_server((pdpb_pb2_grpc.add_PDServicer_to_server, ScriptedPD(state)))
    state.leader_address = pd_address
    store = MaliciousStore(script)
    store_server = grpc.aio.server()
    store_server.add_generic_rpc_handlers((store.handler(),))
    port = store_server.add_insecure_port("127.0.0.1:0")
    await store_server.start()
    state.stores[1] = f"127.0.0.1:{port}"
    pd = PDClient([pd_address], retry_timeout=2.0, rpc_timeout=2.0)
    await pd.connect()
    client = EventFeedClient(pd, retry_timeout=2.0, backoff_max=0.05)
    seen: list[Any] = []
    try:

        async def consume() -> None:
            async for ev in client.feed(SPAN, START_TS):
                seen.append(ev)
                if isinstance(ev, ResolvedEvent) and ev.ts >= FINAL_TS:
                    return

        try:
            await asyncio.wait_for(consume(), 20)
        except CdcflowError as exc:
            seen.append(exc)
    finally:
        await client.close()
        await pd.close()
        await store_server.stop(None)
        await pd_server.stop(None)
    return seen


@scaled(0.1)
@given(frames())
def test_malicious_store(script: list[Any]) -> None:
    seen = asyncio.run(_run(script))  # a hang fails as TimeoutError from wait_for
    assert seen, "the feed yielded nothing and did not fail"
    last = seen[-1]
    if isinstance(last, CdcflowError):
        assert last.code is not None, f"uncoded error: {last!r}"
    else:
        assert isinstance(last, ResolvedEvent) and last.ts >= FINAL_TS
    resolved = START_TS
    for ev in seen:
        if isinstance(ev, RawKVEvent):
            assert SPAN.contains(ev.key), ev
            assert ev.commit_ts > resolved, ev
            assert ev.commit_ts >= ev.start_ts, ev
        elif isinstance(ev, ResolvedEvent):
            assert ev.ts > resolved
            resolved = ev.ts


# --------------------------------------------------------------------------- regressions


def _outcome(script: list[Any]) -> Any:
    seen = asyncio.run(_run(script))
    return seen[-1]


def test_frame_that_is_not_a_change_data_event_resets_the_stream_and_the_feed_goes_on() -> None:
    assert _outcome([b"\xff\xff"]) == ResolvedEvent(SPAN, FINAL_TS)


def test_server_is_busy_with_a_huge_backoff_does_not_stall_the_feed() -> None:
    busy = cdcpb_pb2.Error(server_is_busy=errorpb_pb2.ServerIsBusy(backoff_ms=2**60))
    assert _outcome([("event", 10, True, {"error": busy})]) == ResolvedEvent(SPAN, FINAL_TS)


def test_duplicate_request_and_cluster_mismatch_are_coded() -> None:
    dup = _outcome(
        [("event", 10, True, {"error": cdcpb_pb2.Error(duplicate_request=cdcpb_pb2.DuplicateRequest(region_id=10))})]
    )
    assert isinstance(dup, CdcflowError) and dup.code == 6001
    mismatch = cdcpb_pb2.Error(cluster_id_mismatch=cdcpb_pb2.ClusterIDMismatch(current=1, request=2))
    other = _outcome([("event", 10, True, {"error": mismatch})])
    assert isinstance(other, CdcflowError) and other.code == 1001


def test_commit_ts_below_start_ts_resubscribes_the_region_and_is_not_yielded() -> None:
    bad = Row(type=Event.COMMITTED, key=b"k1", start_ts=102, commit_ts=101, value=b"x")
    seen = asyncio.run(_run([("event", 10, True, {"entries": Event.Entries(entries=[bad])})]))
    assert not [ev for ev in seen if isinstance(ev, RawKVEvent)]
    assert seen[-1] == ResolvedEvent(SPAN, FINAL_TS)
