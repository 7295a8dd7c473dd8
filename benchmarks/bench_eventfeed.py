"""EventFeed throughput from the playground over loopback gRPC, with and without row decoding.

Run:  .venv/bin/python benchmarks/bench_eventfeed.py [--transactions N] [--rounds R]
      .venv/bin/python benchmarks/bench_eventfeed.py --memory [--rows N] [--budget 16MiB] [--scan]

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

Memory mode measures the feed alone: ONE transaction of ``--rows`` rows into
``shop.orders``, fed by an EventFeed client in a child process (so its RSS is
the feed's, not the playground's) whose regions may hold ``--budget`` bytes
(``0``: no limit) before spilling. Live (default): the feed is subscribed
first, so the rows arrive as PREWRITEs held until their COMMITs. ``--scan``:
the feed starts below the commit afterwards, so the rows arrive from the
incremental scan and are held until INITIALIZED. The child drops each change
as it arrives (as an event store that spills) and reports its RSS before the
transaction, its peak RSS (VmHWM), and the client's accounting (peak bytes,
spills, entries written to disk).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcflow.core.config.units import parse_bytes
from cdcflow.core.data.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key
from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig
from cdcflow.plugins.sources.tikv.eventfeed import EventFeedClient
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.spill import FeedMemory
from cdcflow.plugins.sources.tikv.tidb.keys import table_record_span

if TYPE_CHECKING:
    from cdcflow.core.data.source import Mounter


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


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


async def _feed_child(
    pd_address: str, span: Span, start_ts: int, budget: int, scan: bool, conn: Connection
) -> dict[str, Any]:
    """The child: feed ``span`` from ``start_ts``, drop the changes, report memory at the end."""
    pd = PDClient([pd_address])
    await pd.connect()
    spill_dir = Path(tempfile.mkdtemp(prefix="bench-feed-"))
    memory = FeedMemory(budget or None, spill_dir)
    client = EventFeedClient(pd, memory=memory)
    changes, commit_ts = 0, None
    # Scanned rows arrive before the first resolved ts: the baseline is taken before subscribing.
    rss_before = _kib("VmRSS") if scan else 0
    try:
        async with contextlib.aclosing(client.feed(span, start_ts)) as feed:
            async for ev in feed:
                if isinstance(ev, RawKVEvent):
                    changes += 1
                elif commit_ts is None:
                    rss_before = rss_before or _kib("VmRSS")
                    conn.send("ready")
                    commit_ts = await asyncio.to_thread(conn.recv)
                elif ev.ts >= commit_ts:
                    break
    finally:
        await client.close()
        await pd.close()
    return {
        "changes": changes,
        "rss_before_mib": round(rss_before / 1024),
        "peak_rss_mib": round(_kib("VmHWM") / 1024),
        "peak_minus_before_mib": round((_kib("VmHWM") - rss_before) / 1024),
        "accounted_peak_mib": round(memory.peak / 2**20, 1),
        "spills": memory.spills,
        "entries_to_disk": memory.spilled_entries,
        "spill_files": memory.files,
    }


def _child_main(pd_address: str, span: Span, start_ts: int, budget: int, scan: bool, conn: Connection) -> None:
    conn.send(asyncio.run(_feed_child(pd_address, span, start_ts, budget, scan, conn)))


def _bulk_order(n: int) -> dict[str, Any]:
    return {"customer_id": n % 977, "product_id": n % 311, "quantity": 1 + n % 9, "status": "new"}


def memory(rows: int, budget: int, scan: bool) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with Playground(stores=1, split_keys=0, resolved_ts_interval=0.1, ddl_every=0) as pg:
        table = pg.catalog.find("shop", "orders")
        span = Span(table.id, *table_record_span(table.id))
        start_ts = pg.now()
        txn = pg.begin()
        for n in range(rows):
            txn.put(row_key(table, 10_000_000 + n), encode_row_value(table, _bulk_order(n)))
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child_main, args=(pg.pd_address, span, start_ts, budget, scan, child))
        started = 0.0
        if scan:
            commit_ts = txn.commit()  # before the feed: the rows come from the incremental scan
            started = time.perf_counter()
            proc.start()
            parent.recv()
        else:
            proc.start()
            parent.recv()  # subscribed and resolved once: the rows come live
            started = time.perf_counter()
            commit_ts = txn.commit()
        del txn
        parent.send(pg.now())
        report: dict[str, Any] = parent.recv()
        proc.join()
    report.update(rows=rows, budget_mib=round(budget / 2**20, 1), path="scan" if scan else "live")
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["commit_ts"] = commit_ts
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--transactions", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="one huge transaction; report the feed's peak RSS")
    parser.add_argument("--rows", type=int, default=1_000_000, help="memory mode: rows of the transaction")
    parser.add_argument("--budget", type=parse_bytes, default=parse_bytes("16MiB"), help="memory mode: 0 = no limit")
    parser.add_argument("--scan", action="store_true", help="memory mode: rows from the incremental scan")
    args = parser.parse_args()
    if args.memory:
        print(json.dumps(memory(args.rows, args.budget, args.scan), indent=2))
    else:
        asyncio.run(main(args.transactions, args.rounds))
