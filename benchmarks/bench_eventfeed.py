"""EventFeed throughput from the playground over loopback gRPC, with and without row decoding.

Run:  .venv/bin/python benchmarks/bench_eventfeed.py [--rows N] [--rounds R]

The playground is loaded with ``N`` TiDB rows (rowcodec v2 values: bigint,
varchar, double, datetime) committed after a start ts; each measurement opens
a feed of the table's span from that start ts and stops when every row has
arrived and the span is resolved past the last commit. So one measurement is
the whole path: region split, incremental scan on the stores, gRPC, matching,
resolved ts. It is done twice per round, once only counting the changes
(decoding off) and once decoding each row key and value into Python values
(decoding on), alternating so both see the same machine load. The report is
events/s of each and their ratio — absolute numbers depend on the machine,
the ratio shows what decoding costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import statistics
import time
from typing import Any

from cdcflow.core.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv.eventfeed import EventFeedClient
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, TypeCode
from cdcflow.plugins.sources.tikv.tidb.keys import decode_record_key, record_key, table_record_span
from cdcflow.plugins.sources.tikv.tidb.rowcodec import decode_column, decode_row, encode_row

TABLE = 4242
COLUMNS = {
    2: FieldType(TypeCode.LONGLONG),
    3: FieldType(TypeCode.VARCHAR, flen=64),
    4: FieldType(TypeCode.DOUBLE),
    5: FieldType(TypeCode.DATETIME, decimal=0),
}


def row_value(i: int) -> bytes:
    when = dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i)
    values = (i * 7, f"name-{i:08d}", i * 1.5, when)
    return encode_row({cid: (ft, v) for (cid, ft), v in zip(COLUMNS.items(), values, strict=True)})


def decode(ev: RawKVEvent) -> dict[int, Any]:
    handle = decode_record_key(ev.key).handle
    raw = decode_row(ev.value)
    row = {cid: decode_column(ft, raw.get(cid)) for cid, ft in COLUMNS.items()}
    row[1] = handle
    return row


def load(pg: Playground, rows: int, batch: int = 200) -> int:
    last = 0
    for lo in range(0, rows, batch):
        txn = pg.begin()
        for i in range(lo, min(lo + batch, rows)):
            txn.put(record_key(TABLE, i), row_value(i))
        last = txn.commit()
    return last


async def measure(client: EventFeedClient, span: Span, start: int, last: int, rows: int, *, decoding: bool) -> float:
    seen = 0
    t0 = time.perf_counter()
    async with contextlib.aclosing(client.feed(span, start)) as feed:
        async for ev in feed:
            if isinstance(ev, RawKVEvent):
                seen += 1
                if decoding:
                    decode(ev)
            elif isinstance(ev, ResolvedEvent) and ev.ts >= last and seen >= rows:
                break
    elapsed = time.perf_counter() - t0
    if seen < rows:
        raise RuntimeError(f"only {seen} of {rows} changes arrived")
    return seen / elapsed


async def main(rows: int, rounds: int) -> None:
    async with Playground(stores=3, split_keys=2000, resolved_ts_interval=0.02) as pg:
        start = await asyncio.to_thread(pg.now)
        last = await asyncio.to_thread(load, pg, rows)
        span = Span(TABLE, *table_record_span(TABLE))
        pd = PDClient([pg.pd_address])
        await pd.connect()
        client = EventFeedClient(pd)
        rates: dict[bool, list[float]] = {False: [], True: []}
        try:
            await measure(client, span, start, last, rows, decoding=False)  # warm-up: connections, caches
            for _ in range(rounds):
                for decoding in (False, True):
                    rates[decoding].append(await measure(client, span, start, last, rows, decoding=decoding))
        finally:
            await client.close()
            await pd.close()
        regions = len([r for r in pg.regions()])
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"rows={rows} regions={regions} rounds={rounds} (median of each)")
    print(f"received, decoding off: {off:10.0f} events/s  {[round(r) for r in rates[False]]}")
    print(f"received, decoding on:  {on:10.0f} events/s  {[round(r) for r in rates[True]]}")
    print(f"ratio on/off: {on / off:.3f}  (decoding costs {100 * (1 - on / off):.1f}% of throughput)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.rounds))
