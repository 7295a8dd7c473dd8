"""MySQL sink throughput next to a plain batched executemany, same rows, same MariaDB, same run.

    python -m benchmarks.bench_mysql_sink [--rows 40000] [--txn-rows 8] [--tables 4] [--only-tasks]

1. inserts: ``rows`` inserts in upstream transactions of ``txn-rows`` rows,
   through the sink (several worker counts) and through one connection doing
   ``executemany`` of 256-row batches with a commit each — the raw rate of
   the same rows into an identical table.
2. mixed: the test workload (inserts, updates that move keys, deletes, a
   key-less table) through the sink, next to the same changes applied one
   statement per row, one commit per upstream transaction.

3. tasks: the same inserts spread over ``tables`` tables, through the sink's
   partition writers (the Spark-task path: the task writer pickled to worker
   processes, one connection per partition, rows partitioned by table) with
   1 and 2 partitions at once, next to ``write_batch`` on the driver with 1
   and 4 workers, same rows, same run. Partitions run in a pool of worker
   processes started beforehand (as Spark's Python workers are), so the
   figures include shipping the rows to them but not starting them.

Ratios (sink / baseline) are what to compare across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from cdcflow.core.data.events import DDLEvent, MicroBatch, OpType, RowChange
from cdcflow.core.data.sink import SinkContext, TaskWriter
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


def _tables_with_rows(
    server: MariaDB, rows: list[dict[str, Any]], tables: int, txn_rows: int
) -> tuple[str, list[MicroBatch]]:
    """A database with ``tables`` tables and batches of 2048 inserts; each upstream
    transaction writes one table, the tables in turn."""
    db = new_database(server)
    with server.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        for t in range(tables):
            cur.execute(TABLE_DDL.replace("items", f"items{t}"))
    changes = [
        insert(db, f"items{(i // txn_rows) % tables}", r, commit_ts=1000 + i // txn_rows) for i, r in enumerate(rows)
    ]
    size = 2048
    batches = [
        MicroBatch("bench", n, 0, changes[min(i + size, len(changes)) - 1].commit_ts, changes[i : i + size])
        for n, i in enumerate(range(0, len(changes), size))
    ]
    return db, batches


def _write_partition(writer: TaskWriter, head: MicroBatch, partition: int, rows: list[RowChange]) -> int:
    """One partition of a batch, as a Spark task writes it (in a worker process)."""
    part = writer.open(head, partition)
    try:
        for i in range(0, len(rows), 4096):
            part.write(rows[i : i + 4096])
        part.flush()
    finally:
        part.close()
    return len(rows)


def _warm(_: int) -> int:
    import cdcflow.plugins.sinks.mysql.tasks  # noqa: F401 - the first task should not pay the imports

    return 0


def sink_tables_driver(server: MariaDB, rows: list[dict[str, Any]], tables: int, txn_rows: int, workers: int) -> float:
    db, batches = _tables_with_rows(server, rows, tables, txn_rows)
    sink = MySQLSink(MySQLSinkConfig(uri=server.uri, worker_count=workers, max_txn_row=256, checkpoint_schema=db))
    sink.open(SinkContext(f"bench-{db}"))
    started = time.perf_counter()
    for batch in batches:
        sink.write_batch(batch)
    elapsed = time.perf_counter() - started
    sink.close()
    return len(rows) / elapsed


def sink_tables_tasks(
    server: MariaDB, pool: ProcessPoolExecutor, rows: list[dict[str, Any]], tables: int, txn_rows: int, partitions: int
) -> float:
    """Each batch: the task writer (from the driver), every partition in a worker process
    at once (rows partitioned by table), then ``commit_batch`` on the driver."""
    db, batches = _tables_with_rows(server, rows, tables, txn_rows)
    sink = MySQLSink(MySQLSinkConfig(uri=server.uri, max_txn_row=256, checkpoint_schema=db))
    sink.open(SinkContext(f"bench-{db}"))
    started = time.perf_counter()
    for batch in batches:
        writer = sink.task_writer(sorted({r.table for r in batch.rows}))
        head = MicroBatch(batch.changefeed_id, batch.batch_id, batch.start_ts, batch.end_ts)
        parts: list[list[RowChange]] = [[] for _ in range(partitions)]
        for row in batch.rows:
            parts[int(row.table.table.removeprefix("items")) % partitions].append(row)
        futures = [pool.submit(_write_partition, writer, head, p, mine) for p, mine in enumerate(parts) if mine]
        for future in futures:
            future.result()
        sink.commit_batch(head)
    elapsed = time.perf_counter() - started
    sink.close()
    return len(rows) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--txn-rows", type=int, default=8)
    parser.add_argument("--mixed-txns", type=int, default=3_000)
    parser.add_argument("--tables", type=int, default=4, help="tables of the 'tasks' figures")
    parser.add_argument("--only-tasks", action="store_true", help="only the 'tasks' figures (and their baseline)")
    args = parser.parse_args()
    rows = _rows(args.rows)
    results: dict[str, Any] = {"rows": args.rows, "txn_rows": args.txn_rows}
    with start_mariadb() as server:
        baseline_executemany(server, rows[:2000])  # warm the server
        results["inserts_executemany_rows_per_s"] = round(baseline_executemany(server, rows))
        base = results["inserts_executemany_rows_per_s"]
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(_warm, range(4)))
            results["tasks_tables"] = args.tables
            for workers in (1, 4):
                rate = sink_tables_driver(server, rows, args.tables, args.txn_rows, workers)
                results[f"tasks_driver_w{workers}_rows_per_s"] = round(rate)
                results[f"tasks_driver_w{workers}_ratio"] = round(rate / base, 3)
            for partitions in (1, 2):
                rate = sink_tables_tasks(server, pool, rows, args.tables, args.txn_rows, partitions)
                results[f"tasks_partitions{partitions}_rows_per_s"] = round(rate)
                results[f"tasks_partitions{partitions}_ratio"] = round(rate / base, 3)
        if args.only_tasks:
            print(json.dumps(results, indent=2))
            return
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
