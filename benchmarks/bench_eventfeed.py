"""EventFeed throughput from the playground over loopback gRPC, with and without row decoding.

Run:  .venv/bin/python benchmarks/bench_eventfeed.py [--transactions N] [--rounds R]

The playground runs ``N`` transactions of its ``shop`` workload (inserts,
updates, deletes, multi-row and large transactions over tables with ints,
decimals, strings, datetimes and JSON; no DDL) after a start ts. Each
measurement opens, through the ``tikv`` source, one feed per shop table from
that start ts and stops when every change has arrived and every span is
resolved past the last commit: the whole path of region split, incremental
scan on the stores, gRPC, matching and resolved ts. It runs once only
counting the changes (decoding off) and once mounting each change into a
typed row with the TiDB mounter (decoding on), alternating so both see the
same machine load. The report is events/s of each and their ratio; absolute
numbers depend on the machine, the ratio shows what decoding costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import TYPE_CHECKING

from cdcflow.core.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig

if TYPE_CHECKING:
    from cdcflow.core.source import Mounter


async def _feed(
    source: TiKVSource, span: Span, start: int, last: int, mounter: Mounter | None, counts: dict[Span, int]
) -> None:
    async with contextlib.aclosing(source.feed(span, start)) as feed:
        async for ev in feed:
            if isinstance(ev, RawKVEvent):
                counts[span] += 1
                if mounter is not None and await mounter.mount(ev) is None:
                    raise RuntimeError(f"{ev.key.hex()} did not mount")
            elif isinstance(ev, ResolvedEvent) and ev.ts >= last:
                return


async def measure(source: TiKVSource, spans: list[Span], start: int, last: int, *, decoding: bool) -> tuple[int, float]:
    counts = dict.fromkeys(spans, 0)
    mounter = source.mounter() if decoding else None
    t0 = time.perf_counter()
    await asyncio.gather(*(_feed(source, span, start, last, mounter, counts) for span in spans))
    elapsed = time.perf_counter() - t0
    total = sum(counts.values())
    return total, total / elapsed


async def main(transactions: int, rounds: int) -> None:
    async with Playground(stores=3, split_keys=2000, resolved_ts_interval=0.02, ddl_every=0) as pg:
        start = await asyncio.to_thread(pg.now)
        stats = await asyncio.to_thread(pg.run_workload, transactions)
        source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
        await source.open()
        rates: dict[bool, list[float]] = {False: [], True: []}
        try:
            last = await source.current_ts()
            tables = [t for t in await source.list_tables() if t.schema == "shop"]
            spans = [span for t in tables for span in await source.spans_for(t)]
            events, _ = await measure(source, spans, start, last, decoding=True)  # warm-up; checks every row mounts
            for _ in range(rounds):
                for decoding in (False, True):
                    seen, rate = await measure(source, spans, start, last, decoding=decoding)
                    if seen != events:
                        raise RuntimeError(f"{seen} changes this time, {events} in the warm-up")
                    rates[decoding].append(rate)
        finally:
            await source.close()
        regions = len(pg.regions())
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"transactions={stats.transactions} changes={events} tables={len(tables)} regions={regions} rounds={rounds}")
    print(f"received, decoding off: {off:10.0f} events/s  {[round(r) for r in rates[False]]}")
    print(f"received, decoding on:  {on:10.0f} events/s  {[round(r) for r in rates[True]]}")
    print(f"ratio on/off: {on / off:.3f}  (decoding costs {100 * (1 - on / off):.1f}% of throughput)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--transactions", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.transactions, args.rounds))
