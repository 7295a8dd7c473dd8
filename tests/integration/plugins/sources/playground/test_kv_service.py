"""The playground's ``tikvpb.Tikv`` reads over real gRPC: KvScan at a version, locks
as KeyError.locked, CheckTxnStatus / ResolveLock, ScanLock, region errors, and the bulk loader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.rows import decode_row_value, encode_row_value, row_key
from cdcflow.plugins.sources.tikv.kvproto import kvrpcpb_pb2, metapb_pb2, tikvpb_pb2_grpc
from cdcflow.plugins.sources.tikv.tidb.keys import decode_bytes, table_record_span

from .feed_client import PD


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=2, split_keys=300, ddl_every=0) as playground:
        playground.bulk_load("customers", 1000)
        yield playground


class Kv:
    def __init__(self, pg: Playground) -> None:
        self.pg = pg
        self.pd = PD(pg)
        self.channels: dict[str, grpc.Channel] = {}

    def stub(self, store_id: int) -> Any:
        address = self.pd.store_address(store_id)
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return tikvpb_pb2_grpc.TikvStub(self.channels[address])

    def context(self, raw_key: bytes) -> tuple[int, kvrpcpb_pb2.Context]:
        resp = self.pd.region(raw_key)
        region, leader = resp.region, resp.leader
        ctx = kvrpcpb_pb2.Context(region_id=region.id, region_epoch=region.region_epoch, peer=leader)
        return leader.store_id, ctx

    def scan(self, start: bytes, end: bytes, version: int, limit: int = 10_000) -> list[Any]:
        """Every pair of [start, end) at version, region by region, without resolving locks."""
        pairs: list[Any] = []
        key = start
        while True:
            store, ctx = self.context(key)
            req = kvrpcpb_pb2.ScanRequest(context=ctx, start_key=key, end_key=end, version=version, limit=limit)
            resp = self.stub(store).KvScan(req)
            assert not resp.HasField("region_error"), resp.region_error
            pairs.extend(resp.pairs)
            region_end = self.pd.region(key).region.end_key
            if not region_end:
                return pairs
            key = decode_bytes(region_end)[0]
            if key >= end:
                return pairs

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.pd.close()


@pytest.fixture
def kv(pg: Playground) -> Iterator[Kv]:
    client = Kv(pg)
    yield client
    client.close()


def _span(pg: Playground, table: str) -> tuple[bytes, bytes]:
    return table_record_span(pg.table_id(table))


def test_bulk_load_fills_and_splits(pg: Playground) -> None:
    start, end = _span(pg, "customers")
    rows = pg.snapshot("customers")
    assert len(rows) >= 1000
    # At most split_keys keys per region: the table spans several regions.
    from cdcflow.plugins.sources.tikv.tidb.keys import encode_bytes

    inside = [r for r in pg.regions() if r.overlaps(encode_bytes(start), encode_bytes(end))]
    assert len(inside) >= 1000 // 300


def test_scan_at_a_version_equals_the_snapshot(pg: Playground, kv: Kv) -> None:
    table = pg.catalog.find("shop", "customers")
    start, end = _span(pg, "customers")
    before = pg.now()
    pg.run_workload(30)
    after = pg.now()
    for ts in (before, after):
        pairs = kv.scan(start, end, ts)
        assert all(not p.HasField("error") for p in pairs)
        decoded = [decode_row_value(table, p.key, p.value) for p in pairs]
        assert decoded == pg.snapshot("customers", ts)


def test_scan_limit_and_key_only(pg: Playground, kv: Kv) -> None:
    start, end = _span(pg, "customers")
    store, ctx = kv.context(start)
    req = kvrpcpb_pb2.ScanRequest(context=ctx, start_key=start, end_key=end, version=pg.now(), limit=7, key_only=True)
    resp = kv.stub(store).KvScan(req)
    assert len(resp.pairs) == 7
    assert all(p.value == b"" and p.key for p in resp.pairs)
    assert [p.key for p in resp.pairs] == sorted(p.key for p in resp.pairs)


def test_lock_is_reported_then_committed_through_resolve_lock(pg: Playground, kv: Kv) -> None:
    start, end = _span(pg, "customers")
    table = pg.catalog.find("shop", "customers")
    pairs_before = kv.scan(start, end, pg.now())[:2]
    keys = [p.key for p in pairs_before]
    txn = pg.begin(ttl_ms=60_000)
    for pair in pairs_before:
        row = decode_row_value(table, pair.key, pair.value)
        txn.put(pair.key, encode_row_value(table, {**row, "name": "locked"}))
    txn.prewrite()
    read_ts = pg.now()
    pairs = kv.scan(keys[0], keys[1] + b"\x00", read_ts)
    locked = [p.error.locked for p in pairs if p.HasField("error")]
    assert [lk.key for lk in locked] == keys
    assert {lk.lock_version for lk in locked} == {txn.start_ts}
    assert {lk.primary_lock for lk in locked} == {keys[0]}
    # A reader at a version below the lock's start ts does not see it.
    assert all(not p.HasField("error") for p in kv.scan(keys[0], keys[1] + b"\x00", txn.start_ts - 1))

    store, ctx = kv.context(keys[0])
    check = kvrpcpb_pb2.CheckTxnStatusRequest(
        context=ctx, primary_key=keys[0], lock_ts=txn.start_ts, caller_start_ts=read_ts, current_ts=pg.now()
    )
    status = kv.stub(store).KvCheckTxnStatus(check)
    assert status.lock_ttl == 60_000 and status.commit_version == 0
    assert status.lock_info.lock_version == txn.start_ts

    commit_ts = txn.commit_prewritten()
    status = kv.stub(store).KvCheckTxnStatus(check)
    assert (status.lock_ttl, status.commit_version) == (0, commit_ts)
    assert not pg.locks()
    after = kv.scan(keys[0], keys[1] + b"\x00", pg.now())
    assert [p.key for p in after] == keys
    assert [decode_row_value(table, p.key, p.value)["name"] for p in after] == ["locked", "locked"]
    # A reader below the commit ts but above the lock's start ts is still served the old values.
    assert [decode_row_value(table, p.key, p.value) for p in kv.scan(keys[0], keys[1] + b"\x00", commit_ts - 1)] == [
        decode_row_value(table, p.key, p.value) for p in pairs_before
    ]


def test_expired_lock_is_rolled_back_by_check_txn_status(pg: Playground, kv: Kv) -> None:
    start, end = _span(pg, "customers")
    key = kv.scan(start, end, pg.now())[-1].key
    txn = pg.begin(ttl_ms=1)
    txn.delete(key)
    txn.prewrite()
    import time

    time.sleep(0.01)
    store, ctx = kv.context(key)
    check = kvrpcpb_pb2.CheckTxnStatusRequest(
        context=ctx, primary_key=key, lock_ts=txn.start_ts, current_ts=pg.now(), rollback_if_not_exist=True
    )
    status = kv.stub(store).KvCheckTxnStatus(check)
    assert (status.lock_ttl, status.commit_version, status.action) == (0, 0, kvrpcpb_pb2.TTLExpireRollback)
    assert not pg.locks()
    from cdcflow.plugins.sources.playground.mvcc import TxnError

    with pytest.raises(TxnError):
        txn.commit_prewritten()  # the reader rolled it back: it can never commit now
    assert kv.scan(key, key + b"\x00", pg.now())[0].key == key  # the delete never happened


def test_resolve_lock_rolls_back_secondaries(pg: Playground, kv: Kv) -> None:
    start, end = _span(pg, "customers")
    keys = [p.key for p in kv.scan(start, end, pg.now())[10:12]]
    txn = pg.begin(ttl_ms=60_000)
    for key in keys:
        txn.delete(key)
    txn.prewrite()
    store, ctx = kv.context(keys[1])
    # Only the listed key: the secondary is rolled back, the primary keeps its lock.
    req = kvrpcpb_pb2.ResolveLockRequest(context=ctx, start_version=txn.start_ts, keys=[keys[1]])
    assert not kv.stub(store).KvResolveLock(req).HasField("region_error")
    assert [k for k, _ in pg.locks()] == [keys[0]]
    # Without keys: every lock of the transaction in the region.
    store, ctx = kv.context(keys[0])
    req = kvrpcpb_pb2.ResolveLockRequest(context=ctx, start_version=txn.start_ts)
    assert not kv.stub(store).KvResolveLock(req).HasField("region_error")
    assert not pg.locks()
    assert [p.key for p in kv.scan(keys[0], keys[1] + b"\x00", pg.now())] == keys  # rolled back: still there


def test_scan_lock_lists_the_region_locks_below_max_version(pg: Playground, kv: Kv) -> None:
    start, end = _span(pg, "customers")
    keys = [p.key for p in kv.scan(start, end, pg.now())[20:24]]
    older = pg.begin(ttl_ms=60_000)
    for key in keys[:3]:
        older.delete(key)
    older.prewrite()
    newer = pg.begin(ttl_ms=60_000)
    newer.delete(keys[3])
    newer.prewrite()
    try:
        store, ctx = kv.context(keys[0])

        def scan_lock(max_version: int, limit: int = 0, lo: bytes = start, hi: bytes = end) -> list[Any]:
            req = kvrpcpb_pb2.ScanLockRequest(
                context=ctx, max_version=max_version, start_key=lo, end_key=hi, limit=limit
            )
            resp = kv.stub(store).KvScanLock(req)
            assert not resp.HasField("region_error"), resp.region_error
            return list(resp.locks)

        # Every lock at or below max_version, in key order, with its transaction and primary.
        locks = scan_lock(newer.start_ts)
        assert [(lk.key, lk.lock_version) for lk in locks] == [
            *((k, older.start_ts) for k in keys[:3]),
            (keys[3], newer.start_ts),
        ]
        assert [lk.primary_lock for lk in locks] == [keys[0]] * 3 + [keys[3]]
        assert all(lk.lock_ttl == 60_000 for lk in locks)
        # A lock above max_version is not listed; limit and the key bounds cut the answer.
        assert [lk.key for lk in scan_lock(newer.start_ts - 1)] == keys[:3]
        assert [lk.key for lk in scan_lock(newer.start_ts, limit=2)] == keys[:2]
        assert [lk.key for lk in scan_lock(newer.start_ts, lo=keys[1], hi=keys[3])] == keys[1:3]
        # A request for another store's region is a region error, as for KvScan.
        other = next(s for s in pg.cluster.store_ids() if s != store)
        req = kvrpcpb_pb2.ScanLockRequest(context=ctx, max_version=newer.start_ts, start_key=start)
        assert kv.stub(other).KvScanLock(req).HasField("region_error")
        assert pg.kv_stats.requests().get("KvScanLock", 0) >= 5
    finally:
        older.rollback()
        newer.rollback()
    assert not pg.locks()


def test_region_errors(pg: Playground, kv: Kv) -> None:
    start, end = _span(pg, "customers")
    store, ctx = kv.context(start)
    req = kvrpcpb_pb2.ScanRequest(context=ctx, start_key=start, end_key=end, version=pg.now(), limit=10)
    other = next(s for s in pg.cluster.store_ids() if s != store)

    # A store that is not the leader names the leader.
    wrong_peer = kvrpcpb_pb2.Context(region_id=ctx.region_id, region_epoch=ctx.region_epoch)
    resp = kv.stub(other).KvScan(kvrpcpb_pb2.ScanRequest(context=wrong_peer, start_key=start, version=pg.now()))
    assert resp.region_error.not_leader.leader.store_id == store

    # A stale epoch gets the current region.
    stale = kvrpcpb_pb2.Context(
        region_id=ctx.region_id,
        region_epoch=metapb_pb2.RegionEpoch(version=ctx.region_epoch.version - 1, conf_ver=1),
        peer=ctx.peer,
    )
    resp = kv.stub(store).KvScan(kvrpcpb_pb2.ScanRequest(context=stale, start_key=start, version=pg.now()))
    assert ctx.region_id in [r.id for r in resp.region_error.epoch_not_match.current_regions]

    resp = kv.stub(store).KvScan(
        kvrpcpb_pb2.ScanRequest(context=kvrpcpb_pb2.Context(region_id=424242), start_key=start, version=pg.now())
    )
    assert resp.region_error.region_not_found.region_id == 424242

    # Injected, on demand, then served normally again.
    for kind in ("not_leader", "epoch_not_match", "region_not_found", "server_is_busy"):
        pg.kv_region_error(store, kind)
        assert kv.stub(store).KvScan(req).region_error.HasField(kind)
    assert len(kv.stub(store).KvScan(req).pairs) == 10

    # After a split the old epoch is refused.
    mid = kv.scan(start, end, pg.now())[3].key
    pg.split_region(mid)
    resp = kv.stub(store).KvScan(req)
    assert resp.region_error.HasField("epoch_not_match")

    with pytest.raises(Exception, match="unknown KV region error"):
        pg.kv_region_error(store, "bogus")


def test_churn_splits_or_moves_the_leader_before_value_scans(pg: Playground, kv: Kv) -> None:
    start, end = _span(pg, "customers")
    errors_before = pg.kv_stats.region_errors()
    scans_before = pg.kv_stats.requests().get("KvScan", 0)
    churned_before = dict(pg.kv_faults.churned)
    regions_before = len(pg.regions())
    store, ctx = kv.context(start)
    key_only = kvrpcpb_pb2.ScanRequest(context=ctx, start_key=start, end_key=end, version=pg.now(), key_only=True)
    values = kvrpcpb_pb2.ScanRequest(context=ctx, start_key=start, end_key=end, version=pg.now(), limit=5)
    pg.kv_churn(every=2, times=2)
    try:
        # Key-only scans (a plan's sampling) are not counted; every 2nd value scan meets a change.
        assert not kv.stub(store).KvScan(key_only).HasField("region_error")
        assert not kv.stub(store).KvScan(values).HasField("region_error")
        assert kv.stub(store).KvScan(values).region_error.HasField("epoch_not_match")  # split first
        assert len(pg.regions()) == regions_before + 1
        store, ctx = kv.context(start)
        values.context.CopyFrom(ctx)
        assert not kv.stub(store).KvScan(values).HasField("region_error")
        moved = kv.stub(store).KvScan(values).region_error  # then the leader moved
        assert moved.HasField("not_leader") and moved.not_leader.leader.store_id != store
        store, ctx = kv.context(start)
        values.context.CopyFrom(ctx)
        for _ in range(3):  # both changes made: no more
            assert not kv.stub(store).KvScan(values).HasField("region_error")
    finally:
        pg.kv_churn(1, 0)
    churned = {k: v - churned_before.get(k, 0) for k, v in pg.kv_faults.churned.items()}
    assert churned == {"split": 1, "leader": 1}
    errors = pg.kv_stats.region_errors()
    assert errors["epoch_not_match"] - errors_before.get("epoch_not_match", 0) == 1
    assert errors["not_leader"] - errors_before.get("not_leader", 0) == 1
    assert pg.kv_stats.requests()["KvScan"] - scans_before == 8
    with pytest.raises(Exception, match="every must be at least 1"):
        pg.kv_churn(every=0, times=1)


def test_stats_count_status_checks_per_transaction(pg: Playground, kv: Kv) -> None:
    table = pg.catalog.find("shop", "customers")
    row = pg.snapshot("customers")[50]
    txn = pg.begin(ttl_ms=60_000)
    key = row_key(table, row["id"])
    txn.put(key, encode_row_value(table, {**row, "name": "checked"}))
    txn.prewrite()
    try:
        assert pg.kv_stats.txn_checks(txn.start_ts) == 0
        store, ctx = kv.context(key)
        request = kvrpcpb_pb2.CheckTxnStatusRequest(
            context=ctx, primary_key=key, lock_ts=txn.start_ts, caller_start_ts=pg.now(), current_ts=pg.now()
        )
        assert kv.stub(store).KvCheckTxnStatus(request).lock_ttl == 60_000
        assert kv.stub(store).KvCheckTxnStatus(request).lock_ttl == 60_000
        assert pg.kv_stats.txn_checks(txn.start_ts) == 2
    finally:
        txn.rollback()
