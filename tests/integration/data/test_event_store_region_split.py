"""A region split mid-transaction makes TiKV send committed changes again; the event
store publishes each change once, so a sink reading its chunks gets each change once.

The ``tikv`` source (txnkv mode) feeds one key span of the playground into an
:class:`EventStore`; one transaction commits, a second is prewritten, the region is
split between the two, and the second commits. The split resubscribes both halves
from the region's resolved ts, below the first commit, so its changes arrive twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from cdcflow.core.data.events import RawKVEvent, ResolvedEvent
from cdcflow.core.data.logservice import EventStore, event_from_record
from cdcflow.core.data.logservice.records import batch_to_records, read_record_batches
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig

pytestmark = pytest.mark.integration

KEYS = [b"a%03d" % i for i in range(100)]


def test_a_region_split_mid_transaction_reaches_the_chunks_once(tmp_path: Path) -> None:
    async def body() -> None:
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.5, ddl_every=0, create_tables=False) as pg:
            config = TiKVSourceConfig(pd=[pg.pd_address], kv_api="txnkv", key_spans=[[b"a".hex(), b"b".hex()]])
            source = TiKVSource(config)
            await source.open()
            store = EventStore(tmp_path / "store", "cf", fsync=False)
            [table] = await source.list_tables()
            [span] = await source.spans_for(table)
            start = await source.current_ts()
            store.add_span(span, start, replicating=True)
            received: list[RawKVEvent] = []
            resolved = start

            async def feed() -> None:
                nonlocal resolved
                async for event in source.feed(span, start):
                    if isinstance(event, ResolvedEvent):
                        resolved = event.ts
                        store.resolve(span, event.ts)
                    else:
                        assert isinstance(event, RawKVEvent)
                        received.append(event)
                        store.put(span, event)

            async def until(condition: object, what: str) -> None:
                for _ in range(600):
                    if condition():  # type: ignore[operator]
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"timed out waiting for {what}")

            task = asyncio.create_task(feed())
            try:
                await until(lambda: resolved > start, "the feed to resolve")  # subscribed
                first = pg.begin()
                for key in KEYS:
                    first.put(key, b"v1")
                first_ts = await asyncio.to_thread(first.commit)
                await until(lambda: len(received) == len(KEYS), "the first transaction's changes")
                second = pg.begin()
                for key in KEYS:
                    second.put(key, b"v2")
                await asyncio.to_thread(second.prewrite)
                await asyncio.to_thread(pg.split_region, b"a050")  # mid-transaction
                second_ts = await asyncio.to_thread(second.commit_prewritten)
                await until(lambda: store.published_ts >= second_ts, "the second transaction's cut")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await source.close()

            sent = Counter((e.key, e.commit_ts, e.start_ts) for e in received)
            assert any(n > 1 for n in sent.values()), "the split made the source send changes again"
            published = []
            for chunk in store.chunks_between(start, store.published_ts):
                for batch in read_record_batches(store.directory / chunk.file):
                    published.extend(
                        event_from_record(r, store.span_of, store.schemas) for r in batch_to_records(batch)
                    )
            once = Counter((e.key, e.commit_ts, e.start_ts) for e in published)
            assert set(once) == set(sent)
            assert all(n == 1 for n in once.values()), [k for k, n in once.items() if n > 1][:5]
            assert {e.commit_ts for e in published} == {first_ts, second_ts}
            assert len(published) == 2 * len(KEYS)
            store.close()

    asyncio.run(asyncio.wait_for(body(), 120))
