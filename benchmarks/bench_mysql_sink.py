"""MySQL sink throughput next to a plain batched executemany, same rows, same MariaDB, same run.

    python -m benchmarks.bench_mysql_sink [--rows 40000] [--txn-rows 8]

1. inserts: ``rows`` inserts in upstream transactions of ``txn-rows`` rows,
   through the sink (several worker counts) and through one connection doing
   ``executemany`` of 256-row batches with a commit each — the raw rate of
   the same rows into an identical table.
2. mixed: the test workload (inserts, updates that move keys, deletes, a
   key-less table) through the sink, next to the same changes applied one
   statement per row, one commit per upstream transaction.

Ratios (sink / baseline) are what to compare across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from cdcflow.core.data.events import DDLEvent, MicroBatch, OpType
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.testing import ListSink, ListSource, drive, insert
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from tests.fixtures.mariadb import MariaDB, new_database, start_mariadb
from tests.fixtures.workload import NOTES_DDL, ORDERS_DDL, make_workload

TABLE_DDL = "CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(64), qty INT, price DECIMAL(10,2))"


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"item-{i}", "qty": i % 97, "price": f"{i % 1000}.25"} for i in range(n)]


def _fresh_table(server: MariaDB) -> str:
    db = new_database(server)
    with server.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(TABLE_DDL)
    return db


def baseline_executemany(server: MariaDB, rows: list[dict[str, Any]]) -> float:
    db = _fresh_table(server)
    values = [(r["id"], r["name"], r["qty"], r["price"]) for r in rows]
    conn = server.connect(db)
    started = time.perf_counter()
    with conn.cursor() as cur:
        for i in range(0, len(values), 256):
            cur.executemany("INSERT INTO items (id, name, qty, price) VALUES (%s, %s, %s, %s)", values[i : i + 256])
            conn.commit()
    elapsed = time.perf_counter() - started
    conn.close()
    return len(rows) / elapsed


def sink_inserts(server: MariaDB, rows: list[dict[str, Any]], txn_rows: int, workers: int) -> float:
    db = _fresh_table(server)
    changes = [insert(db, "items", r, commit_ts=1000 + i // txn_rows) for i, r in enumerate(rows)]
    batch_size = 2048
    batches = [
        MicroBatch("bench", n, 0, changes[min(i + batch_size, len(changes)) - 1].commit_ts, changes[i : i + batch_size])
        for n, i in enumerate(range(0, len(changes), batch_size))
    ]
    sink = MySQLSink(MySQLSinkConfig(uri=server.uri, worker_count=workers, max_txn_row=256, checkpoint_schema=db))
    sink.open(SinkContext(f"bench-{db}"))
    started = time.perf_counter()
    for batch in batches:
        sink.write_batch(batch)
    elapsed = time.perf_counter() - started
    sink.close()
    return len(rows) / elapsed


def baseline_mixed_per_row(server: MariaDB, txns: int) -> tuple[int, float]:
    db = new_database(server)
    w = make_workload(db, txns=txns, alter=False)
    with server.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(ORDERS_DDL)
        cur.execute(NOTES_DDL)
    rows = w.row_changes()
    conn = server.connect(db)
    started = time.perf_counter()
    last = None
    with conn.cursor() as cur:
        for row in rows:
            if last is not None and row.commit_ts != last:
                conn.commit()
            last = row.commit_ts
            table = row.table.table
            if row.op is OpType.INSERT:
                after = row.after or {}
                cols = ", ".join(after)
                cur.execute(
                    f"INSERT INTO {table} ({cols}) VALUES ({', '.join(['%s'] * len(after))})", tuple(after.values())
                )
            elif table == "orders":
                before = row.before or {}
                if row.op is OpType.DELETE:
                    cur.execute("DELETE FROM orders WHERE id = %s", (before["id"],))
                else:
                    after = row.after or {}
                    cur.execute(
                        "UPDATE orders SET id = %s, name = %s, qty = %s WHERE id = %s",
                        (after["id"], after["name"], after["qty"], before["id"]),
                    )
            else:
                before = row.before or {}
                cur.execute("DELETE FROM notes WHERE msg <=> %s AND n <=> %s LIMIT 1", (before["msg"], before["n"]))
        conn.commit()
    elapsed = time.perf_counter() - started
    conn.close()
    return len(rows), len(rows) / elapsed


def sink_mixed(server: MariaDB, txns: int, workers: int) -> float:
    db = new_database(server)
    w = make_workload(db, txns=txns, alter=False, resolve_every=max(1, txns // 20))
    with server.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(ORDERS_DDL)
        cur.execute(NOTES_DDL)
    # Cut the micro-batches first (as the runtime would), then time only the sink.
    recorder = ListSink()
    asyncio.run(drive(ListSource.of([e for e in w.events if not isinstance(e, DDLEvent)]), [recorder]))
    sink = MySQLSink(MySQLSinkConfig(uri=server.uri, worker_count=workers, checkpoint_schema=db))
    sink.open(SinkContext(f"m-{db}"))
    started = time.perf_counter()
    for batch_id in sorted(recorder.batches):
        sink.write_batch(recorder.batches[batch_id])
    elapsed = time.perf_counter() - started
    sink.close()
    return len(w.row_changes()) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--txn-rows", type=int, default=8)
    parser.add_argument("--mixed-txns", type=int, default=3_000)
    args = parser.parse_args()
    rows = _rows(args.rows)
    results: dict[str, Any] = {"rows": args.rows, "txn_rows": args.txn_rows}
    with start_mariadb() as server:
        baseline_executemany(server, rows[:2000])  # warm the server
        results["inserts_executemany_rows_per_s"] = round(baseline_executemany(server, rows))
        for workers in (1, 4, 16):
            rate = sink_inserts(server, rows, args.txn_rows, workers)
            results[f"inserts_sink_w{workers}_rows_per_s"] = round(rate)
            results[f"inserts_sink_w{workers}_ratio"] = round(rate / results["inserts_executemany_rows_per_s"], 3)
        changes, per_row = baseline_mixed_per_row(server, args.mixed_txns)
        results["mixed_changes"] = changes
        results["mixed_per_row_statements_rows_per_s"] = round(per_row)
        for workers in (1, 4):
            rate = sink_mixed(server, args.mixed_txns, workers)
            results[f"mixed_sink_w{workers}_rows_per_s"] = round(rate)
            results[f"mixed_sink_w{workers}_ratio"] = round(rate / per_row, 3)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
