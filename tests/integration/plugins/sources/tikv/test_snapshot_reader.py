"""The snapshot reader (KvScan at a version, region errors, Percolator lock resolution)
against the playground: what it reads equals the playground's consistent snapshot."""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.rows import decode_row_value, encode_row_value, row_key
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.snapshot import SnapshotReader, SnapshotUnavailableError, region_ranges
from cdcflow.plugins.sources.tikv.tidb.keys import table_record_span

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=3, split_keys=250, ddl_every=0, seed=3) as playground:
        playground.bulk_load("customers", 2000)
        yield playground


def with_pd(test: Callable[[Playground, PDClient], Awaitable[None]]) -> Callable[[Playground], None]:
    """Run an async test body on its own loop with a PD client of the playground."""

    @functools.wraps(test)
    def run(pg: Playground) -> None:
        async def body() -> None:
            client = PDClient([pg.pd_address])
            await client.connect()
            try:
                await test(pg, client)
            finally:
                await client.close()

        asyncio.run(body())

    del run.__wrapped__  # pytest would otherwise ask for the wrapped test's arguments
    return run


def _span(pg: Playground, table: str = "customers") -> tuple[bytes, bytes]:
    return table_record_span(pg.table_id(table))


def _rows(pg: Playground, pairs: list[tuple[bytes, bytes]], table: str = "customers") -> list[dict[str, Any]]:
    definition = pg.catalog.find("shop", table)
    return [decode_row_value(definition, k, v) for k, v in pairs]


@with_pd
async def test_read_equals_snapshot_while_a_workload_runs(pg: Playground, pd: PDClient) -> None:
    start, end = _span(pg)
    pg.start_workload(200)
    try:
        await asyncio.sleep(0.2)
        ts = pg.now()
        reader = SnapshotReader(pd, page_size=97)
        try:
            pairs = await reader.read(start, end, ts)
        finally:
            await reader.close()
    finally:
        pg.stop_workload()
    assert [k for k, _ in pairs] == sorted(k for k, _ in pairs)
    assert _rows(pg, pairs) == pg.snapshot("customers", ts)
    assert reader.stats.pages >= len(pairs) // 97


@with_pd
async def test_ranges_per_region_read_in_parallel(pg: Playground, pd: PDClient) -> None:
    start, end = _span(pg)
    ranges = await region_ranges(pd, start, end)
    assert len(ranges) >= 2000 // 250
    assert ranges[0][0] == start and ranges[-1][1] == end
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    ts = pg.now()
    reader = SnapshotReader(pd)
    try:
        parts = await asyncio.gather(*(reader.read(lo, hi, ts) for lo, hi in ranges))
    finally:
        await reader.close()
    assert _rows(pg, [p for part in parts for p in part]) == pg.snapshot("customers", ts)


@with_pd
async def test_region_errors_splits_and_leader_moves_during_the_read(pg: Playground, pd: PDClient) -> None:
    start, end = _span(pg)
    ts = pg.now()
    expected = pg.snapshot("customers", ts)
    handles = [row["id"] for row in expected]
    table = pg.catalog.find("shop", "customers")
    for store in pg.cluster.store_ids():
        for kind in ("not_leader", "epoch_not_match", "region_not_found", "server_is_busy"):
            pg.kv_region_error(store, kind)
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            key = row_key(table, handles[(i * 37) % len(handles)])
            region = next(r for r in pg.regions() if r.contains(_enc(key)))
            if i % 2 and region.start != _enc(key):
                pg.split_region(key)
            else:
                pg.transfer_leader(region.id)
            time.sleep(0.005)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    reader = SnapshotReader(pd, page_size=31)
    try:
        pairs = await reader.read(start, end, ts)
    finally:
        stop.set()
        thread.join()
        await reader.close()
    assert _rows(pg, pairs) == expected
    errors = reader.stats.region_errors
    assert errors["not_leader"] >= 1 and errors["epoch_not_match"] >= 1
    assert errors["region_not_found"] >= 1 and errors["server_is_busy"] >= 1


def _enc(key: bytes) -> bytes:
    from cdcflow.plugins.sources.tikv.tidb.keys import encode_bytes

    return encode_bytes(key)


def _lock_rows(pg: Playground, count: int, offset: int, ttl_ms: int) -> tuple[Any, list[bytes]]:
    """A transaction that rewrites ``count`` customers (from the ``offset``-th), prewritten only."""
    table = pg.catalog.find("shop", "customers")
    rows = pg.snapshot("customers")[offset : offset + count]
    txn = pg.begin(ttl_ms=ttl_ms)
    for row in rows:
        txn.put(row_key(table, row["id"]), encode_row_value(table, {**row, "name": f"txn-{txn.start_ts}"}))
    txn.prewrite()
    return txn, txn.keys


@with_pd
async def test_lock_of_a_transaction_that_commits_below_the_read_ts(pg: Playground, pd: PDClient) -> None:
    start, end = _span(pg)
    txn, keys = _lock_rows(pg, 3, 100, ttl_ms=60_000)
    commit_ts = pg.now()  # its commit ts is taken before the read ts...
    ts = pg.now()
    # ...but the commit lands while the reader waits on its locks.
    timer = threading.Timer(0.4, lambda: pg.cluster.mvcc.commit(keys, txn.start_ts, commit_ts))
    timer.start()
    reader = SnapshotReader(pd)
    try:
        pairs = await reader.read(start, end, ts)
    finally:
        timer.join()
        await reader.close()
    rows = _rows(pg, pairs)
    assert rows == pg.snapshot("customers", ts)
    assert sum(row["name"] == f"txn-{txn.start_ts}" for row in rows) == 3
    assert reader.stats.lock_waits >= 1


@with_pd
async def test_lock_of_a_transaction_that_rolls_back(pg: Playground, pd: PDClient) -> None:
    start, end = _span(pg)
    txn, _ = _lock_rows(pg, 3, 200, ttl_ms=60_000)
    ts = pg.now()
    timer = threading.Timer(0.3, txn.rollback)
    timer.start()
    reader = SnapshotReader(pd)
    try:
        pairs = await reader.read(start, end, ts)
    finally:
        timer.join()
        await reader.close()
    rows = _rows(pg, pairs)
    assert rows == pg.snapshot("customers", ts)
    assert not any(row["name"] == f"txn-{txn.start_ts}" for row in rows)


@with_pd
async def test_abandoned_lock_is_rolled_back_after_its_ttl(pg: Playground, pd: PDClient) -> None:
    start, end = _span(pg)
    _txn, _ = _lock_rows(pg, 2, 300, ttl_ms=300)
    ts = pg.now()
    reader = SnapshotReader(pd)
    try:
        pairs = await reader.read(start, end, ts)
    finally:
        await reader.close()
    assert _rows(pg, pairs) == pg.snapshot("customers", ts)
    assert reader.stats.resolved_rollback == 2
    assert not pg.locks()


@with_pd
async def test_secondary_lock_of_a_committed_transaction_is_committed_by_the_reader(
    pg: Playground, pd: PDClient
) -> None:
    start, end = _span(pg)
    txn, keys = _lock_rows(pg, 3, 400, ttl_ms=60_000)
    commit_ts = pg.now()
    pg.cluster.mvcc.commit(keys[:1], txn.start_ts, commit_ts)  # the primary only: the client died then
    ts = pg.now()
    reader = SnapshotReader(pd)
    try:
        pairs = await reader.read(start, end, ts)
    finally:
        await reader.close()
    rows = _rows(pg, pairs)
    assert sum(row["name"] == f"txn-{txn.start_ts}" for row in rows) == 3
    assert rows == pg.snapshot("customers", ts)
    assert reader.stats.resolved_commit == 2
    assert not pg.locks()


@with_pd
async def test_no_progress_is_a_retryable_error(pg: Playground, pd: PDClient) -> None:
    start, end = _span(pg)
    region = next(r for r in pg.regions() if r.contains(_enc(start)))
    pg.kv_region_error(region.leader_store, "server_is_busy", 10_000)
    reader = SnapshotReader(pd, retry_timeout=0.5)
    try:
        with pytest.raises(SnapshotUnavailableError) as raised:
            await reader.read(start, end, pg.now())
    finally:
        await reader.close()
        while pg.kv_faults.take(region.leader_store) is not None:
            pass
    assert raised.value.code == 3001 and raised.value.retryable
