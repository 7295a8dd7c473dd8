"""Per-row CPU cost of a task: mounting the playground's shop rows, and encoding them as Open Protocol.

Run:  .venv/bin/python benchmarks/bench_rowpath.py [--rows N] [--rounds R] [--profile mount|encode]

Builds ``N`` raw writes spread over the three ``shop`` tables (the
playground workload's schema: ints, unsigned, varchar, decimal, double,
datetime, timestamp, duration, enum, JSON, nullable columns; one insert in
two, then updates with old values and deletes), all committed in one batch's
ts range with two schema versions of each table, and measures in each round,
in one process:

* mount — the batch mounter a Spark task gets (:class:`TiDBBatchMounter`):
  ``mount_many`` over the whole list when the mounter has it, else ``mount``
  per event;
* encode — :class:`OpenProtocolCodec.encode_rows` over the mounted rows, in
  chunks of 4,096 rows (what a task hands its Kafka writer at a time).

It prints rows/s of each (median over rounds). The same file runs against
another checkout by putting a ``cdcflow`` directory whose ``core`` and
``plugins`` link to that checkout first on ``PYTHONPATH``, so two builds
compare under the same machine load. ``--profile`` runs one stage under
cProfile and prints its top costs.
"""

from __future__ import annotations

import argparse
import cProfile
import pickle
import pstats
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from cdcflow.core.data.events import RawKVEvent, RowChange, Span
from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
from cdcflow.plugins.sources.playground.catalog import Column
from cdcflow.plugins.sources.playground.shop import SHOP_TABLES, random_value
from cdcflow.plugins.sources.tikv.tidb import keys, rowcodec
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBBatchMounter
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBColumn, TiDBDatabase, TiDBTable
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore

#: Rows handed to a task's writers at a time (core.data.pipeline.tasks).
CHUNK = 4_096
FIRST_TABLE_ID = 100


def build(rows: int, seed: int = 7) -> tuple[TiDBBatchMounter, list[RawKVEvent]]:
    """A batch mounter over the shop tables (two versions each) and ``rows`` raw writes."""
    rng = random.Random(seed)
    store = SchemaStore()
    store.add_database(TiDBDatabase(1, "shop"))
    tables: list[tuple[int, list[Column]]] = []
    for i, (name, spec) in enumerate(sorted(SHOP_TABLES.items())):
        table_id = FIRST_TABLE_ID + i
        columns = [Column(n + 1, col_name, ft) for n, (col_name, ft) in enumerate(spec)]
        tidb = TiDBTable(
            table_id,
            name,
            tuple(TiDBColumn(c.id, c.name, offset, c.ft) for offset, c in enumerate(columns)),
            pk_is_handle=True,
        )
        for ts in (10, 1_000 + rows):  # a second version mid-batch: rows above it use it
            store.add_table(1, "shop", tidb, ts)
        tables.append((table_id, columns))
    snapshot = store.snapshot(0, 10_000 + 4 * rows)
    events: list[RawKVEvent] = []
    live: dict[int, list[tuple[int, bytes]]] = {tid: [] for tid, _ in tables}
    for n in range(rows):
        table_id, columns = tables[n % len(tables)]
        span = Span(table_id, *keys.table_record_span(table_id))
        commit_ts = 2_000 + 2 * n
        rows_of = live[table_id]
        choice = rng.random()
        value = rowcodec.encode_row({c.id: (c.ft, random_value(rng, c)) for c in columns[1:]})
        if not rows_of or choice < 0.5:
            handle = len(rows_of) + 1 + 1_000_000 * n
            rows_of.append((handle, value))
            events.append(RawKVEvent(span, keys.record_key(table_id, handle), value, b"", commit_ts - 1, commit_ts))
        elif choice < 0.85:
            i = rng.randrange(len(rows_of))
            handle, old = rows_of[i]
            rows_of[i] = (handle, value)
            key = keys.record_key(table_id, handle)
            events.append(RawKVEvent(span, key, value, old, commit_ts - 1, commit_ts))
        else:
            handle, old = rows_of.pop(rng.randrange(len(rows_of)))
            key = keys.record_key(table_id, handle)
            events.append(RawKVEvent(span, key, b"", old, commit_ts - 1, commit_ts, delete=True))
    return snapshot_mounter(snapshot), events


def snapshot_mounter(snapshot: SchemaStore) -> TiDBBatchMounter:
    return TiDBBatchMounter(snapshot)


def mount_all(mounter: TiDBBatchMounter, events: Sequence[RawKVEvent]) -> list[RowChange]:
    many = getattr(mounter, "mount_many", None)
    mounted: list[Any] = many(events) if many is not None else [mounter.mount(e) for e in events]
    rows = [r for r in mounted if r is not None]
    if len(rows) != len(events):
        raise SystemExit(f"{len(events) - len(rows)} events did not mount")
    return rows


def encode_all(codec: OpenProtocolCodec, rows: Sequence[RowChange]) -> int:
    messages = 0
    for i in range(0, len(rows), CHUNK):
        messages += len(codec.encode_rows(rows[i : i + CHUNK]))
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", choices=("mount", "encode"), help="profile one stage instead")
    args = parser.parse_args()
    mounter, events = build(args.rows)
    rows = mount_all(pickle.loads(pickle.dumps(mounter)), events)
    if args.profile:
        profiler = cProfile.Profile()
        codec = OpenProtocolCodec(OpenProtocolConfig())
        profiler.enable()
        if args.profile == "mount":
            mount_all(pickle.loads(pickle.dumps(mounter)), events)
        else:
            encode_all(codec, rows)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    mount_rates, encode_rates = [], []
    for _ in range(args.rounds):
        task_mounter = pickle.loads(pickle.dumps(mounter))  # a new task: nothing cached yet
        start = time.perf_counter()
        rows = mount_all(task_mounter, events)
        mount_rates.append(len(events) / (time.perf_counter() - start))
        codec = OpenProtocolCodec(OpenProtocolConfig())
        start = time.perf_counter()
        encode_all(codec, rows)
        encode_rates.append(len(rows) / (time.perf_counter() - start))
    print(f"rows={args.rows} rounds={args.rounds}")
    for name, rates in (("mount", mount_rates), ("encode", encode_rates)):
        rounds = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"{name + ':':8}{statistics.median(rates):,.0f} rows/s  (rounds: {rounds})")


if __name__ == "__main__":
    main()
