"""TiKV's ChangeData service as the playground serves it, through the generated stubs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, pdpb_pb2
from cdcflow.plugins.sources.tikv.tidb.keys import record_key

from .feed_client import PD, Event, Feed, rows_of

pytestmark = pytest.mark.integration

T = 901  # table id used by these tests


def key(handle: int) -> bytes:
    return record_key(T, handle)


@pytest.fixture
def pg() -> Iterator[Playground]:
    with Playground(stores=3, split_keys=0, resolved_ts_interval=0.05, create_tables=False) as playground:
        yield playground


@pytest.fixture
def pd(pg: Playground) -> Iterator[PD]:
    client = PD(pg)
    yield client
    client.close()


def put(pg: Playground, *pairs: tuple[int, bytes]) -> int:
    txn = pg.begin()
    for handle, value in pairs:
        txn.put(key(handle), value)
    return txn.commit()


def leader_feed(pg: Playground, pd: PD, handle: int, **kw: object) -> tuple[Feed, object]:
    region = pd.region(key(handle))
    return Feed(pd.store_address(region.leader.store_id), **kw), region.region  # type: ignore[arg-type]


def test_incremental_scan_then_live_stream(pg: Playground, pd: PD) -> None:
    put(pg, (1, b"a1"))
    checkpoint = pg.now()
    put(pg, (2, b"b1"))
    put(pg, (1, b"a2"))
    pending = pg.begin()
    pending.put(key(3), b"c1")
    pending.prewrite()

    feed, region = leader_feed(pg, pd, 1)
    try:
        feed.register(pg, region, checkpoint)
        feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
        committed = rows_of(feed.messages, Event.COMMITTED)
        assert [(r.key, r.value, r.old_value) for r in committed] == [
            (key(1), b"a2", b"a1"),  # the write at or below the checkpoint is not repeated
            (key(2), b"b1", b""),
        ]
        assert all(r.commit_ts > checkpoint for r in committed)
        prewrites = rows_of(feed.messages, Event.PREWRITE)
        assert [(r.key, r.start_ts, r.value) for r in prewrites] == [(key(3), pending.start_ts, b"c1")]

        commit_ts = pending.commit_prewritten()
        live = feed.wait_for(lambda m: rows_of(m, Event.COMMIT))
        assert [(r.key, r.start_ts, r.commit_ts, r.op_type) for r in live] == [
            (key(3), pending.start_ts, commit_ts, Event.Row.PUT)
        ]
        update = pg.begin()
        update.put(key(2), b"b2")
        update.delete(key(1))
        update.commit()
        feed.wait_for(lambda m: len(rows_of(m, Event.COMMIT)) == 3)
        commits = rows_of(feed.messages, Event.COMMIT)
        assert all(r.value == b"" and r.old_value == b"" for r in commits)  # values travel with PREWRITE
        prewrites = {r.key: r for r in rows_of(feed.messages, Event.PREWRITE) if r.start_ts == update.start_ts}
        assert (prewrites[key(2)].value, prewrites[key(2)].old_value) == (b"b2", b"b1")
        assert (prewrites[key(1)].op_type, prewrites[key(1)].value, prewrites[key(1)].old_value) == (
            Event.Row.DELETE,
            b"",
            b"a2",
        )
        assert {r.key: r.op_type for r in commits[1:]} == {key(2): Event.Row.PUT, key(1): Event.Row.DELETE}
    finally:
        feed.close()


def test_prewrite_commit_rollback_interleavings(pg: Playground, pd: PD) -> None:
    feed, region = leader_feed(pg, pd, 1)
    try:
        feed.register(pg, region, pg.now())
        feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
        t1, t2, t3 = pg.begin(), pg.begin(), pg.begin()
        t1.put(key(10), b"x")
        t2.put(key(11), b"y")
        t3.put(key(12), b"z")
        t1.prewrite()
        t2.prewrite()
        t3.prewrite()
        t2.rollback()
        c3 = t3.commit_prewritten()
        c1 = t1.commit_prewritten()
        feed.wait_for(lambda m: len(rows_of(m, Event.COMMIT)) == 2)
        kinds = [(r.type, r.start_ts) for r in feed.rows() if r.type != Event.INITIALIZED]
        assert kinds == [
            (Event.PREWRITE, t1.start_ts),
            (Event.PREWRITE, t2.start_ts),
            (Event.PREWRITE, t3.start_ts),
            (Event.ROLLBACK, t2.start_ts),
            (Event.COMMIT, t3.start_ts),
            (Event.COMMIT, t1.start_ts),
        ]
        assert [r.commit_ts for r in rows_of(feed.messages, Event.COMMIT)] == [c3, c1]
        # A conflicting prewrite on a locked key is refused and leaves no trace in the feed.
        blocked, blocker = pg.begin(), pg.begin()
        blocker.put(key(13), b"first")
        blocker.prewrite()
        blocked.put(key(13), b"second")
        with pytest.raises(Exception, match="locked"):
            blocked.prewrite()
        blocker.rollback()
        feed.wait_for(lambda m: len(rows_of(m, Event.ROLLBACK)) == 2)
        assert [r.start_ts for r in rows_of(feed.messages, Event.PREWRITE)][-1] == blocker.start_ts
    finally:
        feed.close()


def test_resolved_ts_is_held_back_by_the_oldest_lock(pg: Playground, pd: PD) -> None:
    feed, region = leader_feed(pg, pd, 1, v2=True)
    try:
        feed.register(pg, region, pg.now(), request_id=42)
        feed.wait_for(lambda m: feed.resolved())
        lock = pg.begin()
        lock.put(key(20), b"held")
        lock.prewrite()
        seen = len(feed.resolved())
        feed.wait_for(lambda m: len(feed.resolved()) >= seen + 3)
        later = feed.resolved()[seen + 1 :]
        assert all(r.ts == lock.start_ts for r in later), later
        assert all(r.request_id == 42 and list(r.regions) == [region.id] for r in later)
        commit_ts = lock.commit_prewritten()
        feed.wait_for(lambda m: feed.resolved()[-1].ts > commit_ts)
        values = [r.ts for r in feed.resolved()]
        assert values == sorted(values)  # never goes backwards
    finally:
        feed.close()


def test_split_sends_epoch_not_match_with_the_new_regions(pg: Playground, pd: PD) -> None:
    put(pg, (1, b"a"), (5, b"b"))
    feed, region = leader_feed(pg, pd, 1)
    try:
        feed.register(pg, region, pg.now())
        feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
        left, right = pg.split_region(key(5))
        error = feed.wait_for(lambda m: feed.errors())[0]
        assert error.region_id == region.id
        current = error.error.epoch_not_match.current_regions
        assert [(r.id, r.region_epoch.version) for r in current] == [(left.id, left.version), (right.id, right.version)]
        assert right.version == region.region_epoch.version + 1
        # The stale epoch is refused on registration too.
        feed.register(pg, region, pg.now(), request_id=2)
        feed.wait_for(lambda m: len(feed.errors()) == 2)
        assert feed.errors()[1].error.HasField("epoch_not_match")
        # The split stream no longer carries the right half's changes.
        put(pg, (6, b"c"))
        fresh, new_region = leader_feed(pg, pd, 6)
        try:
            fresh.register(pg, new_region, 0)
            fresh.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
            assert {r.key for r in rows_of(fresh.messages, Event.COMMITTED)} == {key(5), key(6)}
        finally:
            fresh.close()
        assert key(6) not in {r.key for r in feed.rows()}
    finally:
        feed.close()


def test_merge_sends_region_not_found_and_epoch_not_match(pg: Playground, pd: PD) -> None:
    left, right = pg.split_region(key(50))
    feed_l, region_l = leader_feed(pg, pd, 1)
    feed_r, region_r = leader_feed(pg, pd, 50)
    try:
        feed_l.register(pg, region_l, pg.now())
        feed_r.register(pg, region_r, pg.now())
        feed_l.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
        feed_r.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
        merged = pg.merge_regions(right.id, left.id)
        assert merged.id == left.id and merged.end == right.end
        assert feed_r.wait_for(lambda m: feed_r.errors())[0].error.region_not_found.region_id == right.id
        assert feed_l.wait_for(lambda m: feed_l.errors())[0].error.HasField("epoch_not_match")
    finally:
        feed_l.close()
        feed_r.close()


def test_leader_transfer_sends_not_leader_with_the_new_leader(pg: Playground, pd: PD) -> None:
    feed, region = leader_feed(pg, pd, 1)
    try:
        feed.register(pg, region, pg.now())
        feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
        old_leader = pd.region(key(1)).leader.store_id
        moved = pg.transfer_leader(region.id)
        assert moved.leader_store != old_leader
        error = feed.wait_for(lambda m: feed.errors())[0].error
        assert error.not_leader.leader.store_id == moved.leader_store
        assert error.not_leader.leader.id == moved.peer_on(moved.leader_store)
        # Registering at the old leader again is refused the same way.
        feed.register(pg, pd.region(key(1)).region, pg.now(), request_id=2)
        feed.wait_for(lambda m: len(feed.errors()) == 2)
        assert feed.errors()[1].error.not_leader.leader.store_id == moved.leader_store
    finally:
        feed.close()


def test_unknown_region_and_cluster_id_mismatch(pg: Playground, pd: PD) -> None:
    feed, region = leader_feed(pg, pd, 1)
    try:
        feed.send(cdcpb_pb2.ChangeDataRequest(header=cdcpb_pb2.Header(cluster_id=pg.cluster_id), region_id=999999))
        feed.register(pg, region, 0, request_id=2, cluster_id=pg.cluster_id + 1)
        feed.wait_for(lambda m: len(feed.errors()) == 2)
        not_found, mismatch = (e.error for e in feed.errors())
        assert not_found.region_not_found.region_id == 999999
        assert (mismatch.cluster_id_mismatch.current, mismatch.cluster_id_mismatch.request) == (
            pg.cluster_id,
            pg.cluster_id + 1,
        )
    finally:
        feed.close()


def test_server_busy_and_congested_then_accepted(pg: Playground, pd: PD) -> None:
    feed, region = leader_feed(pg, pd, 1)
    store = pd.region(key(1)).leader.store_id
    pg.server_busy(store, 1)
    pg.server_busy(store, 1, congested=True)
    try:
        for request_id in (1, 2, 3):
            feed.register(pg, region, 0, request_id=request_id)
        feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
        busy, congested = (e.error for e in feed.errors())
        assert busy.server_is_busy.backoff_ms > 0
        assert congested.congested.region_id == region.id
    finally:
        feed.close()


def test_store_restart_breaks_streams_and_comes_back(pg: Playground, pd: PD) -> None:
    put(pg, (1, b"a"))
    store = pd.region(key(1)).leader.store_id
    address = pd.store_address(store)
    feed, region = leader_feed(pg, pd, 1)
    feed.register(pg, region, 0)
    feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
    pg.restart_store(store, downtime=0.2)
    feed.wait_for(lambda m: feed.error is not None)
    assert feed.error is not None and feed.error.code() == grpc.StatusCode.UNAVAILABLE
    feed.close()
    assert pd.store_address(store) == address
    again = Feed(address)
    try:
        again.register(pg, region, 0)
        again.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
        assert [r.key for r in rows_of(again.messages, Event.COMMITTED)] == [key(1)]
    finally:
        again.close()


def test_stream_reset_fails_open_streams(pg: Playground, pd: PD) -> None:
    feed, region = leader_feed(pg, pd, 1)
    feed.register(pg, region, 0)
    feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
    assert pg.reset_streams(pd.region(key(1)).leader.store_id) == 1
    feed.wait_for(lambda m: feed.error is not None)
    assert feed.error is not None and feed.error.code() == grpc.StatusCode.UNAVAILABLE
    feed.close()


def test_v2_features_header_and_deregister(pg: Playground, pd: PD) -> None:
    bad, region = leader_feed(pg, pd, 1, v2=True, features="stream-multiplexing,time-travel")
    bad.send(cdcpb_pb2.ChangeDataRequest())
    bad.wait_for(lambda m: bad.error is not None)
    assert bad.error is not None and bad.error.code() == grpc.StatusCode.UNIMPLEMENTED
    bad.close()

    feed, region = leader_feed(pg, pd, 1, v2=True)
    try:
        # Two requests for the same region on one multiplexed stream are fine.
        feed.register(pg, region, pg.now(), request_id=1)
        feed.register(pg, region, pg.now(), request_id=2)
        feed.wait_for(lambda m: len(rows_of(m, Event.INITIALIZED)) == 2)
        feed.send(
            cdcpb_pb2.ChangeDataRequest(
                header=cdcpb_pb2.Header(cluster_id=pg.cluster_id),
                request_id=1,
                deregister=cdcpb_pb2.ChangeDataRequest.Deregister(),
            )
        )
        feed.wait_for(lambda m: len(feed.resolved()) > 2 and feed.resolved()[-1].request_id == 2)
        put(pg, (1, b"after"))
        feed.wait_for(lambda m: rows_of(m, Event.COMMIT))
        committed = [e for m in feed.messages for e in m.events if e.HasField("entries")][-1]
        assert committed.request_id == 2
    finally:
        feed.close()


def test_eventfeed_v1_fallback_when_v2_is_disabled() -> None:
    with Playground(stores=1, eventfeed_v2=False, resolved_ts_interval=0.05, create_tables=False) as pg:
        pd = PD(pg)
        v2, region = leader_feed(pg, pd, 1, v2=True)
        v2.send(cdcpb_pb2.ChangeDataRequest())
        v2.wait_for(lambda m: v2.error is not None)
        assert v2.error is not None and v2.error.code() == grpc.StatusCode.UNIMPLEMENTED
        v2.close()
        v1, region = leader_feed(pg, pd, 1)
        try:
            v1.register(pg, region, pg.now(), request_id=5)
            v1.register(pg, region, pg.now(), request_id=6)
            v1.wait_for(lambda m: v1.errors() and v1.resolved())
            assert v1.errors()[0].error.duplicate_request.region_id == region.id
            assert v1.resolved()[0].request_id == 0  # no multiplexing: one batch per stream
        finally:
            v1.close()
            pd.close()


def test_no_commit_at_or_below_a_sent_resolved_ts_under_load() -> None:
    """The resolved-ts guarantee, checked on the wire while the workload commits concurrently."""
    with Playground(stores=1, split_keys=0, resolved_ts_interval=0.005, seed=9, ddl_every=30) as pg:
        pd = PD(pg)
        feed = Feed(pd.store_address(1), v2=True)
        try:
            regions = [
                pd.stub.GetRegionByID(pdpb_pb2.GetRegionByIDRequest(header=pd.header, region_id=r.id)).region
                for r in pg.regions()
            ]
            for request_id, region in enumerate(regions, start=1):
                feed.register(pg, region, pg.now(), request_id=request_id)
            feed.wait_for(lambda m: len(rows_of(m, Event.INITIALIZED)) == len(regions))
            pg.start_workload(2000)
            feed.wait_for(lambda m: len(rows_of(m, Event.COMMIT)) > 300, timeout=120)
            stats = pg.stop_workload()
            last = stats.last_commit_ts
            feed.wait_for(lambda m: m[-1].HasField("resolved_ts") and m[-1].resolved_ts.ts > last)
        finally:
            feed.close()
            pd.close()
        resolved: dict[int, int] = {}
        commits = 0
        for message in feed.messages:
            if message.HasField("resolved_ts"):
                for region_id in message.resolved_ts.regions:
                    assert message.resolved_ts.ts >= resolved.get(region_id, 0)
                    resolved[region_id] = message.resolved_ts.ts
            for event in message.events:
                assert not event.HasField("error"), event
                for row in event.entries.entries:
                    if row.type == Event.COMMIT:
                        commits += 1
                        assert row.commit_ts > resolved.get(event.region_id, 0), (row, resolved[event.region_id])
        assert commits > 300 and len(resolved) == len(regions)


def test_live_rows_may_overtake_a_delayed_incremental_scan() -> None:
    with Playground(stores=1, split_keys=0, create_tables=False, scan_delay=0.5) as pg:
        pd = PD(pg)
        early = pg.begin()
        early.put(key(30), b"early")
        early.prewrite()
        feed, region = leader_feed(pg, pd, 30)
        try:
            feed.register(pg, region, pg.now())
            # Wait until the hub holds the subscription, then commit before the scan is delivered.
            while not pg.hub.subscriptions():
                time.sleep(0.005)
            commit_ts = early.commit_prewritten()
            feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
            order = [(r.type, r.start_ts) for r in feed.rows()]
            assert order == [
                (Event.COMMIT, early.start_ts),  # live, ahead of the scan
                (Event.PREWRITE, early.start_ts),  # the lock as the scan's snapshot saw it
                (Event.INITIALIZED, 0),
            ]
            assert rows_of(feed.messages, Event.COMMIT)[0].commit_ts == commit_ts
            assert not feed.resolved() or feed.messages.index(
                next(m for m in feed.messages if m.HasField("resolved_ts"))
            ) > next(i for i, m in enumerate(feed.messages) if rows_of([m], Event.INITIALIZED))
        finally:
            feed.close()
            pd.close()
