"""The EventFeed client resolves the locks that hold a region's resolved ts back (real gRPC,
the playground upstream): an abandoned transaction (a client prewrote and died) is rolled back
or, if its primary was committed, committed; a live transaction's lock is left alone.

Each test first shows the problem with a client without the resolver (the resolved ts stays
below the lock for many resolve intervals), then what the resolver changes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from cdcflow.core.data.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.mvcc import TxnError
from cdcflow.plugins.sources.tikv.eventfeed import EventFeedClient
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.tidb.keys import record_key, table_record_span

pytestmark = pytest.mark.integration

#: The resolve-lock interval of these tests (TiCDC's is 20 s): a region whose resolved ts
#: stands still this long has its locks resolved.
INTERVAL = 0.3
#: How long a client without the resolver is watched: many intervals.
HELD_FOR = 8 * INTERVAL

_tables = itertools.count(501)


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=2, split_keys=0, ddl_every=0, resolved_ts_interval=0.05) as playground:
        yield playground


@pytest.fixture
def table() -> int:
    """A table id of its own per test (the playground is shared by the module)."""
    return next(_tables)


@dataclass
class Recorder:
    events: list[RawKVEvent] = field(default_factory=list)
    resolved: int = 0

    def changes(self) -> list[tuple[bytes, int, bytes]]:
        return [(e.key, e.commit_ts, e.value) for e in self.events]


@asynccontextmanager
async def feeding(
    pg: Playground, table: int, start_ts: int, interval: float
) -> AsyncIterator[tuple[EventFeedClient, Recorder]]:
    """A client (``resolve_lock_interval`` = ``interval``; 0: no resolver) feeding ``table`` from ``start_ts``."""
    pd = PDClient([pg.pd_address], retry_timeout=10.0)
    await pd.connect()
    client = EventFeedClient(pd, retry_timeout=30.0, backoff_max=0.5, resolve_lock_interval=interval)
    rec = Recorder()

    async def pump() -> None:
        async for ev in client.feed(Span(table, *table_record_span(table)), start_ts):
            if isinstance(ev, ResolvedEvent):
                assert ev.ts >= rec.resolved
                rec.resolved = ev.ts
            else:
                assert isinstance(ev, RawKVEvent)
                assert ev.commit_ts > max(rec.resolved, start_ts)
                rec.events.append(ev)

    task = asyncio.create_task(pump())
    try:
        yield client, rec
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
        await pd.close()
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


async def wait_for(predicate: object, timeout: float = 20.0) -> None:
    assert callable(predicate)
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def held_without_resolver(pg: Playground, table: int, start_ts: int, lock_ts: int, floor: int) -> None:
    """A client without the resolver: its resolved ts reaches ``floor`` (the commits before the
    lock are resolved) but never passes the lock's start ts, interval after interval."""
    async with feeding(pg, table, start_ts, interval=0) as (client, rec):
        await wait_for(lambda: rec.resolved >= floor)
        await asyncio.sleep(HELD_FOR)
        # A region resolves up to its oldest lock's start ts (nothing can commit at or below it).
        assert floor <= rec.resolved <= lock_ts
        assert client.resolve_lock_passes == 0


def test_abandoned_lock_is_rolled_back_and_the_resolved_ts_moves_past_it(pg: Playground, table: int) -> None:
    async def body() -> None:
        start = pg.now()
        txn = pg.begin()
        txn.put(record_key(table, 1), b"before")
        before = txn.commit()
        abandoned = pg.begin(ttl_ms=100)  # the client prewrote and died
        abandoned.put(record_key(table, 2), b"never")
        abandoned.put(record_key(table, 3), b"never either")
        abandoned.prewrite()

        await held_without_resolver(pg, table, start, abandoned.start_ts, before)
        assert len(pg.locks()) == 2
        # The resolver's KV requests meet region errors first: it re-locates and retries.
        for store in pg.cluster.store_ids():
            pg.kv_region_error(store, "epoch_not_match")
            pg.kv_region_error(store, "not_leader")

        async with feeding(pg, table, start, INTERVAL) as (client, rec):
            await wait_for(lambda: rec.resolved > abandoned.start_ts)
            after = pg.begin()
            after.put(record_key(table, 4), b"after")
            after_ts = after.commit()
            await wait_for(lambda: rec.resolved >= after_ts)
        assert rec.changes() == [(record_key(table, 1), before, b"before"), (record_key(table, 4), after_ts, b"after")]
        assert not pg.locks()
        assert client.lock_stats.resolved_rollback == 2
        assert client.lock_stats.resolved_commit == 0
        assert client.lock_stats.region_errors.get("epoch_not_match", 0) >= 1
        with pytest.raises(TxnError):
            abandoned.commit_prewritten()  # rolled back: it can never commit now
        assert pg.cluster.mvcc.get(record_key(table, 2), pg.now()) is None

    asyncio.run(asyncio.wait_for(body(), 60))


def test_committed_primary_commits_the_abandoned_secondaries_once(pg: Playground, table: int) -> None:
    async def body() -> None:
        start = pg.now()
        txn = pg.begin()
        txn.put(record_key(table, 9), b"before")
        before = txn.commit()
        abandoned = pg.begin(ttl_ms=100)
        abandoned.put(record_key(table, 1), b"primary")  # the first key is the primary
        abandoned.put(record_key(table, 2), b"secondary")
        abandoned.put(record_key(table, 3), b"secondary too")
        abandoned.prewrite()
        commit_ts = abandoned.commit_primary()  # decided, then the client died
        assert [k for k, _ in pg.locks()] == [record_key(table, 2), record_key(table, 3)]

        await held_without_resolver(pg, table, start, abandoned.start_ts, before)

        async with feeding(pg, table, start, INTERVAL) as (client, rec):
            await wait_for(lambda: rec.resolved > commit_ts)
        assert not pg.locks()
        assert client.lock_stats.resolved_commit == 2
        assert client.lock_stats.resolved_rollback == 0
        # Every row of the transaction once, at its commit ts.
        assert sorted(rec.changes()) == [
            (record_key(table, 1), commit_ts, b"primary"),
            (record_key(table, 2), commit_ts, b"secondary"),
            (record_key(table, 3), commit_ts, b"secondary too"),
            (record_key(table, 9), before, b"before"),
        ]
        assert pg.cluster.mvcc.get(record_key(table, 3), pg.now()) == b"secondary too"

    asyncio.run(asyncio.wait_for(body(), 60))


def test_live_transaction_lock_is_left_alone(pg: Playground, table: int) -> None:
    async def body() -> None:
        start = pg.now()
        live = pg.begin(ttl_ms=600_000)  # alive: its owner is still working on it
        live.put(record_key(table, 1), b"slow")
        live.prewrite()
        async with feeding(pg, table, start, INTERVAL) as (client, rec):
            # The resolver looks at the lagging region several times and leaves the lock.
            await wait_for(lambda: client.lock_stats.lock_waits >= 3)
            assert [k for k, _ in pg.locks()] == [record_key(table, 1)]
            assert rec.resolved <= live.start_ts
            assert client.lock_stats.resolved_rollback == client.lock_stats.resolved_commit == 0
            assert not rec.events
            commit_ts = live.commit_prewritten()  # the owner commits after all
            await wait_for(lambda: rec.resolved >= commit_ts)
        assert rec.changes() == [(record_key(table, 1), commit_ts, b"slow")]

    asyncio.run(asyncio.wait_for(body(), 60))
