"""The EventFeed client with a memory budget, against the playground: spilled, nothing changes.

Two clients feed the same span at once, one keeping everything in memory and
one whose regions must spill (budget 0: every pending prewrite, early commit
and held change on disk; or a small budget: some in memory, some on disk).
Without faults both yield exactly the same changes in the same order. With
splits, leader moves and stream resets while a large transaction's locks are
on disk, the spilled client still keeps the feed contract: every commit
delivered, nothing at or below a resolved ts it yielded, per key in
commit-ts order. The budget is checked on the accounted bytes.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.data.events import RawKVEvent
from cdcflow.core.testing import until
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground._keys import encode_key
from cdcflow.plugins.sources.tikv.eventfeed import EventFeedClient
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.spill import FeedMemory

from .test_eventfeed_playground import SPAN, Change, Recorder, _random_fault, key

pytestmark = pytest.mark.integration

BIG = 3000  # rows of the large transaction: ~1 MiB of pending prewrites


@dataclass
class Feed:
    client: EventFeedClient
    memory: FeedMemory
    recorder: Recorder
    task: asyncio.Task[None]


@asynccontextmanager
async def feeds(pg: Playground, start_ts: int, budgets: list[int | None]) -> AsyncIterator[list[Feed]]:
    """One client per budget, each feeding SPAN from ``start_ts`` into its Recorder."""
    pd = PDClient([pg.pd_address], retry_timeout=10.0)
    await pd.connect()
    out: list[Feed] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for i, budget in enumerate(budgets):
                memory = FeedMemory(budget, Path(tmp) / f"spill-{i}")
                client = EventFeedClient(pd, retry_timeout=30.0, backoff_max=0.5, memory=memory)
                rec = Recorder(start_ts)

                async def pump(client: EventFeedClient = client, rec: Recorder = rec) -> None:
                    async for ev in client.feed(SPAN, start_ts):
                        rec.take(ev)

                out.append(Feed(client, memory, rec, asyncio.create_task(pump())))
            yield out
        finally:
            for feed in out:
                feed.task.cancel()
                await asyncio.gather(feed.task, return_exceptions=True)
                await feed.client.close()
                # Spill files are gone with their subscriptions.
                assert feed.memory.directory is None or not feed.memory.directory.exists()
                assert feed.memory.used == 0
            await pd.close()
        for feed in out:
            if feed.task.done() and not feed.task.cancelled() and feed.task.exception() is not None:
                raise feed.task.exception()  # type: ignore[misc]


def _commit(pg: Playground, committed: list[Change], pairs: list[tuple[int, bytes | None]]) -> int:
    txn = pg.begin()
    for handle, value in pairs:
        if value is None:
            txn.delete(key(handle))
        else:
            txn.put(key(handle), value)
    commit_ts = txn.commit()
    committed.extend((key(h), commit_ts, v) for h, v in pairs)
    return commit_ts


def _settled(pg: Playground, clients: int) -> bool:
    """Whether every region has ``clients`` subscriptions at its leader whose scan was sent.

    What comes after on those streams meets the locks the scan reported; a
    commit made before that would reach a later scan as COMMITTED instead.
    """
    subs = pg.hub.subscriptions()
    start, end = encode_key(SPAN.start), encode_key(SPAN.end) if SPAN.end else b""
    for region in pg.regions():
        if not region.overlaps(start, end):
            continue
        live = [
            s
            for s in subs
            if s.region_id == region.id
            and s.initialized
            and not s.session.reset
            and s.session.store_id == region.leader_store
        ]
        if len(live) < clients:
            return False
    return True


def _sequence(rec: Recorder) -> list[tuple[bytes, bytes, bytes, int, int, bool]]:
    return [(e.key, e.value, e.old_value, e.start_ts, e.commit_ts, e.delete) for e in rec.events]


@pytest.mark.parametrize("budget", [0, 256 * 1024], ids=["all-on-disk", "some-on-disk"])
def test_a_spilled_feed_yields_exactly_what_the_in_memory_feed_yields(budget: int) -> None:
    async def body() -> None:
        committed: list[Change] = []
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
            commit = lambda pairs: asyncio.to_thread(_commit, pg, committed, pairs)  # noqa: E731
            await commit([(h, b"before") for h in range(5)])
            committed.clear()
            start = await asyncio.to_thread(pg.now)
            await commit([(h, b"scanned-%d" % h) for h in range(10)])  # COMMITTED rows of the scan
            locked = pg.begin()  # a lock the scan reports as PREWRITE, committed live
            for h in range(10, 20):
                locked.put(key(h), b"locked-%d" % h)
            await asyncio.to_thread(locked.prewrite)
            async with feeds(pg, start, [None, budget]) as (plain, spilled):
                # Both subscribed and INITIALIZED (a resolved ts counts only after that):
                # from here on both see the same live entries.
                await asyncio.gather(plain.recorder.wait_resolved(start + 1), spilled.recorder.wait_resolved(start + 1))
                big = pg.begin()
                for h in range(1000, 1000 + BIG):
                    big.put(key(h), b"big-%06d-" % h + b"x" * 200)
                await asyncio.to_thread(big.prewrite)
                doomed = pg.begin()
                doomed.put(key(5), b"rolled-back")
                await asyncio.to_thread(doomed.prewrite)
                await commit([(1, b"small-1"), (2, None)])  # committed while both are pending
                commit_ts = await asyncio.to_thread(locked.commit_prewritten)
                committed.extend((key(h), commit_ts, b"locked-%d" % h) for h in range(10, 20))
                await asyncio.to_thread(doomed.rollback)
                commit_ts = await asyncio.to_thread(big.commit_prewritten)
                committed.extend((key(h), commit_ts, b"big-%06d-" % h + b"x" * 200) for h in range(1000, 1000 + BIG))
                last = await commit([(1000, None), (3, b"last")])
                await asyncio.gather(plain.recorder.wait_resolved(last), spilled.recorder.wait_resolved(last))

                plain.recorder.check(committed, exactly_once=True)
                assert _sequence(spilled.recorder) == _sequence(plain.recorder)
                # All the large transaction's locks but what the budget holds (each > 200 bytes) went to disk.
                assert spilled.memory.spilled_entries >= BIG - budget // 200 and spilled.memory.peak <= budget
                assert plain.memory.spilled_entries == 0 and plain.memory.peak >= BIG * 200

    asyncio.run(asyncio.wait_for(body(), 180))


@pytest.mark.parametrize("scan_delay", [0.0, 0.2], ids=["scan-first", "scan-late"])
def test_splits_leader_moves_and_stream_resets_while_prewrites_are_on_disk(scan_delay: float) -> None:
    async def body() -> None:
        committed: list[Change] = []
        budget = 64 * 1024
        options: dict[str, Any] = {"stores": 3, "split_keys": 0, "resolved_ts_interval": 0.05, "ddl_every": 0}
        async with Playground(scan_delay=scan_delay, **options) as pg:
            commit = lambda pairs: asyncio.to_thread(_commit, pg, committed, pairs)  # noqa: E731
            start = await asyncio.to_thread(pg.now)
            big_keys = range(0, 2 * BIG, 2)  # even handles; odd ones stay free for other transactions
            await commit([(h, b"a%d" % h) for h in range(0, 2 * BIG, 100)])  # rows the big transaction overwrites
            async with feeds(pg, start, [None, budget]) as (plain, spilled):
                big = pg.begin()
                for h in big_keys:
                    big.put(key(h), b"big-%06d-" % h + b"x" * 200)
                await asyncio.to_thread(big.prewrite)
                # Every lock of the transaction reached the client, all but a budget's worth on disk.
                on_disk = BIG - budget // 200  # each entry takes more than 200 bytes
                await until(lambda: spilled.memory.spilled_entries >= on_disk, timeout=60)
                files = spilled.memory.files

                await asyncio.to_thread(pg.split_region, key(BIG + 1))
                await commit([(11, b"after-split"), (2 * BIG - 11, b"after-split")])  # both sides
                doomed = pg.begin()
                doomed.put(key(7), b"rolled-back")
                await asyncio.to_thread(doomed.prewrite)
                leaders = sorted({r.leader_store for r in pg.regions()})
                await asyncio.to_thread(pg.reset_streams, leaders[0])
                await asyncio.to_thread(doomed.rollback)
                await commit([(13, b"during-faults"), (2 * BIG - 13, b"during-faults")])
                await until(lambda: _settled(pg, clients=2), timeout=60)  # the reset's re-subscriptions scanned
                before = spilled.memory.spilled_entries
                for region in pg.regions():
                    await asyncio.to_thread(pg.transfer_leader, region.id)
                # Resubscribed at the new leaders, the regions read every lock again from the
                # scan, onto disk: the commit, sent after the scans, is then matched there.
                await until(lambda: _settled(pg, clients=2), timeout=60)
                await until(lambda: spilled.memory.spilled_entries >= before + on_disk, timeout=60)

                commit_ts = await asyncio.to_thread(big.commit_prewritten)
                committed.extend((key(h), commit_ts, b"big-%06d-" % h + b"x" * 200) for h in big_keys)
                last = await commit([(0, b"last"), (2 * BIG - 2, None), (11, None)])
                await asyncio.gather(
                    plain.recorder.wait_resolved(last, timeout=90), spilled.recorder.wait_resolved(last, timeout=90)
                )

                plain.recorder.check(committed, exactly_once=False)
                spilled.recorder.check(committed, exactly_once=False)
                # The resubscribed regions read the locks again (scanned) into new spill files.
                assert spilled.memory.files > files
                assert spilled.memory.peak <= budget
                assert spilled.memory.matched_on_disk >= on_disk
                assert sum(isinstance(e, RawKVEvent) for e in spilled.recorder.events) >= len(committed)

    asyncio.run(asyncio.wait_for(body(), 240))


@pytest.mark.parametrize("scan_delay", [0.0, 0.2], ids=["scan-first", "scan-late"])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_faults_with_every_entry_on_disk(seed: int, scan_delay: float) -> None:
    """The random fault walk of test_eventfeed_playground, with a client that keeps nothing in memory."""

    async def body() -> None:
        rng = random.Random(seed)
        committed: list[Change] = []
        options: dict[str, Any] = {"stores": 3, "split_keys": 0, "resolved_ts_interval": 0.05, "ddl_every": 0}
        async with Playground(scan_delay=scan_delay, **options) as pg:
            start = await asyncio.to_thread(pg.now)
            pending = pg.begin()  # a lock held across every fault, committed at the end
            pending.put(key(99), b"long-running")
            await asyncio.to_thread(pending.prewrite)
            async with feeds(pg, start, [0]) as (spilled,):
                for _ in range(10):
                    for _ in range(rng.randrange(1, 5)):
                        handles = rng.sample(range(40), rng.randrange(1, 4))
                        pairs = [(h, None if rng.random() < 0.2 else b"v%d" % rng.randrange(1000)) for h in handles]
                        await asyncio.to_thread(_commit, pg, committed, pairs)
                    await asyncio.to_thread(_random_fault, pg, rng)
                commit_ts = await asyncio.to_thread(pending.commit_prewritten)
                committed.append((key(99), commit_ts, b"long-running"))
                last = await asyncio.to_thread(_commit, pg, committed, [(0, b"end")])
                await spilled.recorder.wait_resolved(last, timeout=60)
                spilled.recorder.check(committed, exactly_once=False)
                assert spilled.memory.peak == 0 and spilled.memory.spilled_entries > 0

    asyncio.run(asyncio.wait_for(body(), 180))
