"""PD's gRPC API as the playground serves it, exercised through the generated stubs."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import grpc
import pytest

from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv.kvproto import pdpb_pb2
from cdcflow.plugins.sources.tikv.tidb.keys import encode_bytes, record_key

from .feed_client import PD

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=3, split_keys=0, create_tables=False) as playground:
        yield playground


@pytest.fixture
def pd(pg: Playground) -> Iterator[PD]:
    client = PD(pg)
    yield client
    client.close()


def test_members_name_the_pd_address(pg: Playground, pd: PD) -> None:
    members = pd.stub.GetMembers(pdpb_pb2.GetMembersRequest(header=pd.header))
    assert members.header.cluster_id == pg.cluster_id
    assert members.leader.client_urls == [f"http://{pg.pd_address}"]


def test_tso_batches_are_strictly_increasing(pd: PD) -> None:
    requests = [pdpb_pb2.TsoRequest(header=pd.header, count=n) for n in (1, 5, 3, 10)]
    previous_last = 0
    for request, response in zip(requests, pd.stub.Tso(iter(requests)), strict=True):
        last = response.timestamp.physical << 18 | response.timestamp.logical
        first = last - response.count + 1
        assert response.count == request.count
        assert first > previous_last
        previous_last = last
    assert previous_last >> 18 == pytest.approx(time.time() * 1000, abs=60_000)


def test_cluster_id_mismatch_is_a_header_error(pd: PD) -> None:
    wrong = pdpb_pb2.RequestHeader(cluster_id=12345)
    response = pd.stub.GetRegion(pdpb_pb2.GetRegionRequest(header=wrong, region_key=b""))
    assert response.header.error.type == pdpb_pb2.UNKNOWN
    assert "mismatch cluster id" in response.header.error.message


def test_regions_cover_the_key_space_after_splits(pg: Playground, pd: PD) -> None:
    pg.split_region(record_key(7, 100))
    pg.split_region(record_key(7, 200))
    scan = pd.stub.ScanRegions(pdpb_pb2.ScanRegionsRequest(header=pd.header, start_key=b"", limit=0))
    metas = [r.region for r in scan.regions]
    assert metas[0].start_key == b"" and metas[-1].end_key == b""
    for left, right in itertools.pairwise(metas):
        assert left.end_key == right.start_key
    assert encode_bytes(record_key(7, 100)) in {m.start_key for m in metas}

    middle = pd.region(record_key(7, 150))
    assert middle.region.start_key == encode_bytes(record_key(7, 100))
    assert middle.region.end_key == encode_bytes(record_key(7, 200))
    assert middle.leader.store_id in {p.store_id for p in middle.region.peers}
    by_id = pd.stub.GetRegionByID(pdpb_pb2.GetRegionByIDRequest(header=pd.header, region_id=middle.region.id))
    assert by_id.region == middle.region
    prev = pd.stub.GetPrevRegion(pdpb_pb2.GetRegionRequest(header=pd.header, region_key=middle.region.start_key))
    assert prev.region.end_key == middle.region.start_key

    limited = pd.stub.ScanRegions(
        pdpb_pb2.ScanRegionsRequest(header=pd.header, start_key=middle.region.start_key, limit=1)
    )
    assert [r.region.id for r in limited.regions] == [middle.region.id]
    assert list(limited.region_metas) == [middle.region]


def test_all_stores_have_serving_addresses(pg: Playground, pd: PD) -> None:
    stores = pd.stub.GetAllStores(pdpb_pb2.GetAllStoresRequest(header=pd.header)).stores
    assert {s.id: s.address for s in stores} == pg.store_addresses
    for store in stores:
        assert store.address.startswith("127.0.0.1:")
        grpc.channel_ready_future(grpc.insecure_channel(store.address)).result(timeout=10)


def test_service_gc_safepoints_hold_gc_back_until_their_ttl_expires(pg: Playground, pd: PD) -> None:
    def update(service: bytes, ttl: int, safe_point: int) -> int:
        request = pdpb_pb2.UpdateServiceGCSafePointRequest(
            header=pd.header, service_id=service, TTL=ttl, safe_point=safe_point
        )
        response = pd.stub.UpdateServiceGCSafePoint(request)
        assert response.service_id == service
        return int(response.min_safe_point)

    assert update(b"short", 1, 100) == 100
    assert update(b"long", 60, 200) == 100
    assert pg.advance_gc(1000) == 100  # held back by "short"
    time.sleep(1.2)  # let the 1 s TTL of "short" lapse
    assert pg.advance_gc(1000) == 200  # now by "long"
    gc = pd.stub.GetGCSafePoint(pdpb_pb2.GetGCSafePointRequest(header=pd.header))
    assert gc.safe_point == 200
    # Below the minimum service safepoint: not stored; the minimum that stands is returned.
    assert update(b"late", 60, 150) == 200
    assert pg.advance_gc(1000) == 200
    assert update(b"long", 60, 300) == 300
    assert pg.advance_gc(1000) == 300
    assert pg.advance_gc(100) == 300  # never goes back
    assert update(b"long", 0, 0) == 1000  # TTL <= 0 removes the service; gc_worker's 1000 remains


async def _async_use() -> tuple[int, int]:
    async with Playground(stores=1, create_tables=False) as pg:
        txn = pg.begin()
        txn.put(record_key(1, 1), b"v")
        commit_ts = txn.commit()
        return commit_ts, len(pg.store_addresses)


def test_async_context_manager() -> None:
    import asyncio

    commit_ts, stores = asyncio.run(_async_use())
    assert commit_ts > 0 and stores == 1


def test_embedded_playground_is_shared_in_the_process() -> None:
    from cdcflow.plugins.sources.playground.embedded import embedded_playground, stop_embedded_playground

    first = embedded_playground(stores=1, rate=0)
    try:
        assert embedded_playground(stores=5) is first
        assert len(first.store_addresses) == 1
        client = PD(first)
        try:
            assert client.stub.GetMembers(pdpb_pb2.GetMembersRequest()).header.cluster_id == first.cluster_id
        finally:
            client.close()
    finally:
        stop_embedded_playground()
    stop_embedded_playground()
    second = embedded_playground(stores=1, rate=0)
    try:
        assert second is not first
    finally:
        stop_embedded_playground()
