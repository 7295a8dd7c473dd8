"""The EventFeed client against the playground upstream (real PD and ChangeData servers over gRPC).

Every test records what it committed and checks the feed against it:

* every committed change above the start ts is yielded (at least once);
* no change is yielded at or below a resolved ts the feed already yielded
  (duplicates after a fault may only appear above the frontier);
* per key, the first deliveries come in commit-ts order;
* without faults, each change is yielded exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from cdcflow.core.data.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv.eventfeed import EventFeedClient
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.tidb.keys import record_key, table_record_span

pytestmark = pytest.mark.integration

TABLE = 77
SPAN = Span(TABLE, *table_record_span(TABLE))

Change = tuple[bytes, int, bytes | None]  # key, commit ts, value (None: delete)


def key(handle: int) -> bytes:
    return record_key(TABLE, handle)


@dataclass
class Recorder:
    """What the feed yielded, checked against the feed contract as it arrives."""

    start_ts: int
    events: list[RawKVEvent] = field(default_factory=list)
    resolved: int = 0
    violations: list[str] = field(default_factory=list)
    moved: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self, ev: Any) -> None:
        if isinstance(ev, ResolvedEvent):
            if ev.ts < self.resolved:
                self.violations.append(f"resolved went back from {self.resolved} to {ev.ts}")
            self.resolved = ev.ts
        else:
            assert isinstance(ev, RawKVEvent)
            if ev.commit_ts <= max(self.resolved, self.start_ts):
                self.violations.append(f"{ev.key.hex()}@{ev.commit_ts} at or below resolved {self.resolved}")
            self.events.append(ev)
        self.moved.set()

    async def wait_resolved(self, ts: int, timeout: float = 30.0) -> None:
        async def loop() -> None:
            while self.resolved < ts:
                self.moved.clear()
                await self.moved.wait()

        await asyncio.wait_for(loop(), timeout)

    def changes(self) -> list[Change]:
        return [(e.key, e.commit_ts, None if e.delete else e.value) for e in self.events]

    def check(self, committed: list[Change], *, exactly_once: bool) -> None:
        assert not self.violations, self.violations
        got = self.changes()
        assert set(got) == set(committed)
        if exactly_once:
            assert len(got) == len(set(got)), "duplicates without a fault"
        first: dict[bytes, list[int]] = defaultdict(list)
        seen: set[Change] = set()
        for change in got:
            if change not in seen:
                seen.add(change)
                first[change[0]].append(change[1])
        for k, ts in first.items():
            assert ts == sorted(ts), f"key {k.hex()} out of commit-ts order: {ts}"


@dataclass
class Env:
    pg: Playground
    pd: PDClient
    client: EventFeedClient
    committed: list[Change] = field(default_factory=list)

    async def put(self, *pairs: tuple[int, bytes | None]) -> int:
        def run() -> int:
            txn = self.pg.begin()
            for handle, value in pairs:
                if value is None:
                    txn.delete(key(handle))
                else:
                    txn.put(key(handle), value)
            return txn.commit()

        commit_ts = await asyncio.to_thread(run)
        self.committed += [(key(h), commit_ts, v) for h, v in pairs]
        return commit_ts

    async def fault(self, action: Callable[[], Any]) -> Any:
        return await asyncio.to_thread(action)


#: Incremental-scan delay of the current test's playground (parametrized by the autouse fixture below).
_SCAN_DELAY: list[float] = [0.0]


@pytest.fixture(autouse=True, params=[0.0, 0.2], ids=["scan-first", "scan-late"])
def scan_delay(request: pytest.FixtureRequest) -> float:
    """Every test runs with the scan first and with live rows overtaking a late incremental scan.

    TiKV runs a region's incremental scan and its live stream concurrently, so
    live PREWRITE/COMMIT rows may arrive before the scan's rows of older commits.
    """
    _SCAN_DELAY[0] = request.param
    return float(request.param)


@asynccontextmanager
async def env(**options: Any) -> AsyncIterator[Env]:
    options.setdefault("scan_delay", _SCAN_DELAY[0])
    options.setdefault("stores", 3)
    options.setdefault("split_keys", 0)
    options.setdefault("resolved_ts_interval", 0.05)
    async with Playground(**options) as pg:
        pd = PDClient([pg.pd_address], retry_timeout=10.0)
        await pd.connect()
        client = EventFeedClient(pd, retry_timeout=30.0, backoff_max=0.5)
        try:
            yield Env(pg, pd, client)
        finally:
            await client.close()
            await pd.close()


@asynccontextmanager
async def feeding(e: Env, start_ts: int) -> AsyncIterator[Recorder]:
    rec = Recorder(start_ts)

    async def pump() -> None:
        async for ev in e.client.feed(SPAN, start_ts):
            rec.take(ev)

    task = asyncio.create_task(pump())
    try:
        yield rec
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 120))


def test_incremental_scan_then_live_stream_exactly_once() -> None:
    async def body() -> None:
        async with env() as e:
            await e.put((1, b"before"))
            e.committed.clear()  # at or below the start ts: must not be yielded
            start = await asyncio.to_thread(e.pg.now)
            await e.put((2, b"scan-2"))
            await e.put((1, b"scan-1"), (3, b"scan-3"))
            pending = e.pg.begin()
            pending.put(key(4), b"locked-before-feed")
            await asyncio.to_thread(pending.prewrite)
            doomed = e.pg.begin()
            doomed.put(key(5), b"rolled-back")
            await asyncio.to_thread(doomed.prewrite)
            async with feeding(e, start) as rec:
                commit_ts = await asyncio.to_thread(pending.commit_prewritten)
                e.committed.append((key(4), commit_ts, b"locked-before-feed"))
                await asyncio.to_thread(doomed.rollback)
                await e.put((2, None))
                last = await e.put((6, b"live-6"), (1, b"live-1"))
                await rec.wait_resolved(last)
            rec.check(e.committed, exactly_once=True)

    run(body)


def test_split_and_leader_transfer_mid_stream() -> None:
    async def body() -> None:
        async with env() as e:
            start = await asyncio.to_thread(e.pg.now)
            async with feeding(e, start) as rec:
                for i in range(20):
                    await e.put((i, b"a%d" % i))
                await rec.wait_resolved(e.committed[-1][1])
                _left, right = await e.fault(lambda: e.pg.split_region(key(10)))
                for i in range(20):
                    await e.put((i, b"b%d" % i))
                await e.fault(lambda: e.pg.transfer_leader(right.id))
                for i in range(0, 20, 3):
                    await e.put((i, b"c%d" % i), (19 - i, b"c%d" % (19 - i)))
                await e.fault(lambda: e.pg.split_region(key(5)))
                last = await e.put((5, b"last"))
                await rec.wait_resolved(last)
            rec.check(e.committed, exactly_once=False)

    run(body)


def test_store_restart_mid_stream() -> None:
    async def body() -> None:
        async with env() as e:
            start = await asyncio.to_thread(e.pg.now)
            async with feeding(e, start) as rec:
                for i in range(10):
                    await e.put((i, b"a%d" % i))
                leaders = {r.leader_store for r in e.pg.regions()}
                restart = asyncio.create_task(e.fault(lambda: e.pg.restart_store(min(leaders), 0.5)))
                for i in range(10):
                    await e.put((i, b"b%d" % i))
                await restart
                last = await e.put((3, b"after-restart"))
                await rec.wait_resolved(last)
            rec.check(e.committed, exactly_once=False)

    run(body)


def test_transaction_spanning_regions_is_whole_before_its_resolved_ts() -> None:
    async def body() -> None:
        async with env() as e:
            for split in (10, 20, 30):
                await e.fault(lambda split=split: e.pg.split_region(key(split)))
            start = await asyncio.to_thread(e.pg.now)
            async with feeding(e, start) as rec:
                handles = [1, 11, 21, 31]
                commit_ts = await e.put(*[(h, b"txn") for h in handles])
                await rec.wait_resolved(commit_ts)
                # Once resolved past the commit, every row of the transaction is there.
                assert {ev.key for ev in rec.events if ev.commit_ts == commit_ts} == {key(h) for h in handles}
            rec.check(e.committed, exactly_once=True)

    run(body)


def test_eventfeed_fallback_and_server_busy() -> None:
    async def body() -> None:
        async with env(eventfeed_v2=False) as e:
            start = await asyncio.to_thread(e.pg.now)
            for store_id in e.pg.store_addresses:
                await e.fault(lambda store_id=store_id: e.pg.server_busy(store_id, 1))
            async with feeding(e, start) as rec:
                last = await e.put((1, b"x"), (2, b"y"))
                await rec.wait_resolved(last)
            assert e.client.v1_stores
            rec.check(e.committed, exactly_once=True)

    run(body)


def test_region_merge_mid_stream() -> None:
    async def body() -> None:
        async with env() as e:
            left, right = await e.fault(lambda: e.pg.split_region(key(10)))
            start = await asyncio.to_thread(e.pg.now)
            async with feeding(e, start) as rec:
                for i in range(0, 20, 2):
                    await e.put((i, b"a%d" % i))
                await rec.wait_resolved(e.committed[-1][1])
                await e.fault(lambda: e.pg.merge_regions(right.id, left.id))
                for i in range(20):
                    await e.put((i, b"b%d" % i))
                last = await e.put((15, b"last"))
                await rec.wait_resolved(last)
                await e.fault(lambda: e.pg.split_region(key(7)))
                last = await e.put((3, b"after-split"), (17, b"after-split"))
                await rec.wait_resolved(last)
            rec.check(e.committed, exactly_once=False)

    run(body)


@pytest.mark.parametrize("seed", [int(s) for s in os.environ.get("CDCFLOW_FAULT_SEEDS", "1,2,3").split(",")])
def test_random_faults_during_a_write_stream(seed: int) -> None:
    """Writes interleaved with random splits, merges, leader moves, stream resets, busy stores and restarts.

    More seeds: ``CDCFLOW_FAULT_SEEDS=1,2,...,40 pytest -k random_faults``.
    """

    async def body() -> None:
        rng = random.Random(seed)
        async with env() as e:
            start = await asyncio.to_thread(e.pg.now)
            # A lock held across every fault, committed at the end: a live transaction (its
            # client would keep it alive with heartbeats), so the feed's lock resolver must
            # leave it alone however long a loaded machine takes over the faults.
            pending = e.pg.begin(ttl_ms=600_000)
            pending.put(key(99), b"long-running")
            await asyncio.to_thread(pending.prewrite)
            async with feeding(e, start) as rec:
                for _ in range(12):
                    for _ in range(rng.randrange(1, 5)):
                        handles = rng.sample(range(40), rng.randrange(1, 4))
                        await e.put(
                            *[(h, None if rng.random() < 0.2 else b"v%d" % rng.randrange(1000)) for h in handles]
                        )
                    await e.fault(lambda: _random_fault(e.pg, rng))
                commit_ts = await asyncio.to_thread(pending.commit_prewritten)
                e.committed.append((key(99), commit_ts, b"long-running"))
                last = await e.put((0, b"end"))
                await rec.wait_resolved(last, timeout=60)
            rec.check(e.committed, exactly_once=False)

    run(body)


def _random_fault(pg: Playground, rng: random.Random) -> None:
    regions = sorted(pg.regions(), key=lambda r: r.start)
    stores = sorted(pg.store_addresses)
    kind = rng.choice(["split", "split", "merge", "leader", "reset", "busy", "restart"])
    if kind == "split":
        handle = rng.randrange(1, 40)
        with contextlib.suppress(Exception):  # the key may already be a boundary
            pg.split_region(key(handle))
    elif kind == "merge" and len(regions) > 1:
        i = rng.randrange(len(regions) - 1)
        pg.merge_regions(regions[i + 1].id, regions[i].id)
    elif kind == "leader":
        pg.transfer_leader(rng.choice(regions).id)
    elif kind == "reset":
        pg.reset_streams(rng.choice(stores))
    elif kind == "busy":
        pg.server_busy(rng.choice(stores), rng.randrange(1, 3), congested=rng.random() < 0.5)
    elif kind == "restart":
        pg.restart_store(rng.choice(stores), 0.2)
