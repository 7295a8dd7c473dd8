"""Row mounting cost: TiDBMounter against splitting the same row values.

Run:  .venv/bin/python benchmarks/bench_mounter.py [--rows N] [--rounds R]

Builds ``N`` row writes of one table (bigint PK handle, varchar, decimal,
timestamp, JSON, with a schema store holding a few versions) and measures,
alternating in each round so both see the same machine load:

* baseline — ``rowcodec.decode_row`` only (split the value into columns);
* mount — ``TiDBMounter.mount``: key decoding, schema lookup at commit_ts − 1,
  typed values of every column, the RowChange.

It reports rows/s of each (median over rounds) and the ratio mount/baseline,
which is what the typed decoding and schema work cost relative to the
cheapest possible pass over the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import decimal
import statistics
import time

from cdcflow.core.data.events import RawKVEvent, Span
from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.sources.tikv.tidb import keys, rowcodec
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, Flag
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBMounter
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBColumn, TiDBDatabase, TiDBTable
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore

TABLE_ID = 4242
COLUMNS = (
    TiDBColumn(1, "id", 0, FieldType(TypeCode.LONGLONG, Flag.NOT_NULL | Flag.PRI_KEY)),
    TiDBColumn(2, "name", 1, FieldType(TypeCode.VARCHAR, flen=64)),
    TiDBColumn(3, "price", 2, FieldType(TypeCode.NEWDECIMAL, flen=12, decimal=2)),
    TiDBColumn(4, "at", 3, FieldType(TypeCode.TIMESTAMP, decimal=3)),
    TiDBColumn(5, "doc", 4, FieldType(TypeCode.JSON)),
)


def build(rows: int) -> tuple[TiDBMounter, list[RawKVEvent]]:
    table = TiDBTable(TABLE_ID, "items", COLUMNS, pk_is_handle=True)
    store = SchemaStore()
    store.add_database(TiDBDatabase(1, "bench"))
    for ts in (0, 100, 200, 300):
        store.add_table(1, "bench", table, ts)
    span = Span(TABLE_ID, *keys.table_record_span(TABLE_ID))
    at = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    events = []
    for i in range(rows):
        value = rowcodec.encode_row(
            {
                2: (COLUMNS[1].type, f"item-{i}"),
                3: (COLUMNS[2].type, decimal.Decimal(i) / 100),
                4: (COLUMNS[3].type, at + dt.timedelta(seconds=i)),
                5: (COLUMNS[4].type, {"i": i, "tags": ["a", "b"]}),
            }
        )
        events.append(RawKVEvent(span, keys.record_key(TABLE_ID, i), value, b"", 1000, 1001 + i))
    return TiDBMounter(store), events


async def measure(mounter: TiDBMounter, events: list[RawKVEvent]) -> tuple[float, float]:
    start = time.perf_counter()
    for e in events:
        rowcodec.decode_row(e.value)
    baseline = time.perf_counter() - start
    start = time.perf_counter()
    for e in events:
        if await mounter.mount(e) is None:
            raise SystemExit("a row did not mount")
    mount = time.perf_counter() - start
    return len(events) / baseline, len(events) / mount


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    mounter, events = build(args.rows)
    results = [asyncio.run(measure(mounter, events)) for _ in range(args.rounds)]
    base = statistics.median(r[0] for r in results)
    mount = statistics.median(r[1] for r in results)
    print(f"rows={args.rows} rounds={args.rounds}")
    print(f"baseline decode_row: {base:,.0f} rows/s")
    print(f"TiDBMounter.mount:   {mount:,.0f} rows/s")
    print(f"mount / baseline time ratio: {base / mount:.2f}")


if __name__ == "__main__":
    main()
