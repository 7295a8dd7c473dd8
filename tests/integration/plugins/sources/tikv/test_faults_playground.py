"""Upstream faults seen through the ``tikv`` source: PD down for a while, a corrupt row value.

* PD down for seconds: PD calls back off and retry; a feed that must reload
  regions meanwhile recovers when PD returns, with every change delivered;
  a call whose retry budget runs out fails with PDUnavailableError (3001, a
  Warning), and the same call succeeds once PD is back.
* A corrupt row value committed into the playground's MVCC store reaches the
  feed like any write; mounting it raises RowDecodeError naming the table,
  the key (hex) and the commit ts (a Warning), and later rows still mount.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from cdcflow.core.data.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.core.errors import ErrorCode, PDUnavailableError, Severity
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.tidb.keys import record_key
from cdcflow.plugins.sources.tikv.tidb.mounter import RowDecodeError

pytestmark = pytest.mark.integration


class Collected:
    def __init__(self) -> None:
        self.events: list[RawKVEvent] = []
        self.resolved = 0

    async def pump(self, source: TiKVSource, span: Span, start: int) -> None:
        async with contextlib.aclosing(source.feed(span, start)) as feed:
            async for ev in feed:
                if isinstance(ev, ResolvedEvent):
                    self.resolved = ev.ts
                elif isinstance(ev, RawKVEvent):
                    self.events.append(ev)

    async def wait_resolved(self, ts: int, timeout: float = 60.0) -> None:
        async def loop() -> None:
            while self.resolved < ts:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(loop(), timeout)


def _put(pg: Playground, pairs: list[tuple[bytes, bytes]]) -> int:
    txn = pg.begin()
    for key, value in pairs:
        txn.put(key, value)
    return txn.commit()


def test_pd_down_for_seconds_backs_off_and_recovers() -> None:
    async def body() -> None:
        async with Playground(stores=2, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
            source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await source.open()
            probe = PDClient([pg.pd_address], retry_timeout=1.0)
            try:
                orders = next(t for t in await source.list_tables() if t.table == "orders")
                (span,) = await source.spans_for(orders)
                start = await source.current_ts()
                got = Collected()
                task = asyncio.create_task(got.pump(source, span, start))
                keys = [record_key(orders.table_id, 10_000 + i) for i in range(20)]
                first = await asyncio.to_thread(_put, pg, [(k, b"v") for k in keys[:10]])
                await got.wait_resolved(first)

                await asyncio.to_thread(pg.stop_pd)
                # The split makes the feed reload the region from PD, which is down.
                await asyncio.to_thread(pg.split_region, keys[5])
                commits = [await asyncio.to_thread(_put, pg, [(k, b"v")]) for k in keys[10:]]
                with pytest.raises(PDUnavailableError) as info:
                    await probe.connect()
                assert info.value.code == ErrorCode.ErrPDUnavailable and info.value.severity == Severity.WARN
                # Long enough for the feed's PD channel to back off reconnecting for seconds:
                # a client finding the leader again must not inherit that backoff.
                await asyncio.sleep(6.0)
                assert not task.done()  # still retrying, not failed
                assert got.resolved < commits[-1]  # the split range waits for PD
                await asyncio.to_thread(pg.start_pd)

                await probe.connect()  # the same call works once PD is back
                last = await source.current_ts()
                await got.wait_resolved(last)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                delivered = {(ev.key, ev.commit_ts) for ev in got.events}
                assert {(k, c) for k, c in zip(keys[10:], commits, strict=True)} <= delivered
                assert {ev.key for ev in got.events} == set(keys)
            finally:
                await probe.close()
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 180))


def test_a_corrupt_row_value_fails_mounting_with_table_key_and_commit_ts() -> None:
    async def body() -> None:
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
            source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await source.open()
            try:
                orders = next(t for t in await source.list_tables() if t.table == "orders")
                (span,) = await source.spans_for(orders)
                start = await source.current_ts()
                got = Collected()
                task = asyncio.create_task(got.pump(source, span, start))
                bad_key = record_key(orders.table_id, 4242)
                # A v2 row header announcing 3 columns over 2 bytes of data.
                bad_commit = await asyncio.to_thread(_put, pg, [(bad_key, b"\x80\x00\x03\x00\x00\x00\x01")])
                await asyncio.to_thread(pg.run_workload, 20)
                last = await source.current_ts()
                await got.wait_resolved(last)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

                mounter = source.mounter()
                assert mounter is not None
                bad = [ev for ev in got.events if ev.key == bad_key]
                assert [ev.commit_ts for ev in bad] == [bad_commit]
                with pytest.raises(RowDecodeError) as info:
                    await mounter.mount(bad[0])
                err = info.value
                assert "shop.orders" in err.message
                assert bad_key.hex() in err.message and str(bad_commit) in err.message
                assert err.detail["key"] == bad_key.hex() and err.detail["commit_ts"] == bad_commit
                assert err.severity == Severity.WARN
                # Not a crash of the mounter: the other rows of the table still mount.
                others = [ev for ev in got.events if ev.key != bad_key]
                assert others
                for ev in others:
                    assert await mounter.mount(ev) is not None
            finally:
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 180))
