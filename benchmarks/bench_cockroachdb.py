"""The cockroachdb source: rows/s from the CockroachDB playground's changefeeds, next to its emission rate.

    .venv/bin/python -m benchmarks.bench_cockroachdb [--transactions 20000] [--master local[2]]

A backlog of ``--transactions`` shop-workload transactions (inserts, updates, deletes; no DDL)
is committed to the CockroachDB playground first, as fast as it commits them; then, in the same
run, each stage reads it from a sinkless changefeed per table started with ``cursor`` below the
backlog (the three tables at once), timed until every row is through:

* **commit** — the playground committing the backlog (row statements/s).
* **feed** — the playground's own emission rate: the changefeed rows a plain psycopg 3 client
  receives over pgwire (``CREATE CHANGEFEED … WITH updated, mvcc_timestamp, diff, resolved``),
  nothing done with them.
* **convert** — the same feed rows through the pure ``convert_rows`` (feed rows → RowChanges)
  in this process, no I/O.
* **source** — ``CockroachDBSource.feed`` per table span: pgwire, conversion, resolved ts; the
  RowChanges/s the pipeline would get.
* **e2e** — a ``cdcflow run`` capture process (cockroachdb source, Spark pipeline on
  ``--master``, Kafka sink producing Open Protocol to librdkafka's mock cluster in this
  process), once warm (its checkpoint has passed a first live commit), while another
  ``--transactions`` are committed as fast as the playground commits them: the rows / the
  seconds from the first commit until the persisted checkpoint passes the last one (the
  commits compete with the capture for the CPU, as in bench_e2e). Checkpoint lag sampled
  every 0.2 s meanwhile (p50 / p99).

The playground, the psycopg client and the source share this process (one GIL), so the feed,
convert and source figures are bounds for this machine, not CockroachDB's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
import types
import uuid
from pathlib import Path
from typing import Any

import psycopg
import yaml

from benchmarks.bench_e2e import PARTITIONS, LagSampler, percentile
from cdcflow.core.data.events import ResolvedEvent, RowChange
from cdcflow.plugins.sinks.kafka.mock import MockCluster, mock_cluster
from cdcflow.plugins.sources.cockroach_playground import CockroachPlayground
from cdcflow.plugins.sources.cockroachdb import CockroachDBSource, CockroachDBSourceConfig
from cdcflow.plugins.sources.cockroachdb.convert import FeedRow, Resolved, convert_rows
from cdcflow.plugins.sources.cockroachdb.hlc import HLC, cursor_for
from cdcflow.plugins.sources.cockroachdb.options import changefeed_statement
from tests.e2e.e2e_kafka import CaptureProcess

TABLES = ("customers", "products", "orders")


async def raw_feeds(dsn: str, start: HLC, last: HLC) -> tuple[float, dict[str, list[FeedRow]]]:
    """Every changefeed row above ``start`` of each table, read by plain psycopg until resolved past ``last``."""
    rows: dict[str, list[FeedRow]] = {t: [] for t in TABLES}

    async def one(table: str) -> None:
        statement = changefeed_statement(table, start, resolved_seconds=0.1)
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            async for name, key, value in conn.cursor().stream(statement):
                if name is None:
                    if HLC.parse(json.loads(value)["resolved"]) >= last:
                        return
                    continue
                rows[table].append(FeedRow(name, key, value))
        finally:
            await conn.close()  # how a sinkless changefeed is cancelled

    started = time.perf_counter()
    await asyncio.gather(*(one(t) for t in TABLES))
    return time.perf_counter() - started, rows


async def source_feeds(dsn: str, start_ts: int, last_ts: int) -> tuple[float, list[int]]:
    """RowChanges from ``CockroachDBSource.feed`` of every table span until resolved past ``last_ts``."""
    source = CockroachDBSource(CockroachDBSourceConfig(dsn=dsn, resolved_interval=0.1))
    await source.open()
    commit_ts: list[int] = []
    try:
        spans = [s for t in await source.list_tables() for s in await source.spans_for(t)]

        async def one(span: Any) -> None:
            async with contextlib.aclosing(source.feed(span, start_ts)) as feed:
                async for event in feed:
                    if isinstance(event, RowChange):
                        commit_ts.append(event.commit_ts)
                    elif isinstance(event, ResolvedEvent) and event.ts >= last_ts:
                        return

        started = time.perf_counter()
        await asyncio.gather(*(one(s) for s in spans))
        return time.perf_counter() - started, commit_ts
    finally:
        await source.close()


def convert(pg: CockroachPlayground, rows: dict[str, list[FeedRow]], start: HLC) -> float:
    async def schemas() -> dict[str, Any]:
        source = CockroachDBSource(CockroachDBSourceConfig(dsn=pg.dsn))
        await source.open()
        try:
            return {t.table: await source.table_schema(t, start.commit_ts) for t in await source.list_tables()}
        finally:
            await source.close()

    by_name = asyncio.run(schemas())
    started = time.perf_counter()
    for feed in rows.values():
        converted = convert_rows(feed, by_name)
        assert not any(isinstance(r, Resolved) for r in converted)
    return time.perf_counter() - started


def end_to_end(pg: CockroachPlayground, cluster: MockCluster, master: str, transactions: int) -> dict[str, Any]:
    """A warm capture (checkpoint moving on live commits), then ``transactions`` committed as fast as the
    playground commits them: the rows / the seconds from the first commit until the persisted checkpoint
    passes the last one."""
    topic = f"bench-crdb-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    with tempfile.TemporaryDirectory() as tmp:
        unused = types.SimpleNamespace(pd_address="127.0.0.1:1", status_address="127.0.0.1:1")
        start_ts = pg.now().commit_ts
        capture = CaptureProcess(
            Path(tmp),
            unused,  # type: ignore[arg-type]  # the source is replaced below
            cluster.bootstrap_servers,
            topic,
            start_ts,
            partitions=PARTITIONS,
            master=master,
        )
        settings = yaml.safe_load(capture.file.read_text())
        settings["connectors"][0]["source"] = {
            "type": "cockroachdb",
            "dsn": pg.dsn,
            "resolved-interval": 0.3,
            "table-poll-interval": 0.3,
        }
        capture.file.write_text(yaml.safe_dump(settings))
        started = time.perf_counter()
        capture.start()
        try:
            pg.workload.step()  # warm-up: Spark up and a first batch through every stage
            capture.wait_checkpoint(pg.now().commit_ts, timeout=600)
            startup = time.perf_counter() - started
            position = len(pg.store.log)
            sampler = LagSampler(capture)
            sampler.start()
            began = time.perf_counter()
            for _ in range(transactions):
                pg.workload.step()
            committed = time.perf_counter() - began
            last_ts = pg.now().commit_ts
            capture.wait_checkpoint(last_ts, timeout=1800)
            seconds = time.perf_counter() - began
            lags = sampler.stop()
        finally:
            capture.stop()
    rows = sum(len(commit.writes) for commit in pg.store.log[position:])
    return {
        "master": master,
        "startup_s": round(startup, 1),
        "rows": rows,
        "commit_s": round(committed, 1),
        "until_checkpoint_s": round(seconds, 1),
        "rows_per_s": round(rows / seconds),
        "checkpoint_lag_p50_s": round(percentile(lags, 50), 1),
        "checkpoint_lag_p99_s": round(percentile(lags, 99), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=20_000, help="workload transactions in the backlog")
    parser.add_argument("--master", default="local[2]", help="Spark master of the end-to-end capture")
    parser.add_argument("--no-e2e", action="store_true", help="skip the end-to-end stage")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with CockroachPlayground(rate=0, seed=3) as pg:
        start = pg.now()
        time.sleep(0.01)  # the backlog starts in a later ts bucket than ``start``
        began = time.perf_counter()
        for _ in range(args.transactions):
            pg.workload.step()
        commit_s = time.perf_counter() - began
        last = pg.now()
        stats = pg.workload.stats
        report["transactions"] = stats.transactions
        report["commit_rows_per_s"] = round(stats.rows / commit_s)

        feed_s, feed_rows = asyncio.run(raw_feeds(pg.dsn, start, last))
        rows = sum(len(r) for r in feed_rows.values())
        report["feed_rows"] = rows
        report["feed_rows_per_s"] = round(rows / feed_s)

        report["convert_rows_per_s"] = round(rows / convert(pg, feed_rows, start))

        start_ts, last_ts = start.commit_ts, last.commit_ts
        assert cursor_for(start_ts) >= start
        source_s, commit_ts = asyncio.run(source_feeds(pg.dsn, start_ts, last_ts))
        assert len(commit_ts) == rows, f"the source yielded {len(commit_ts)} rows, the feeds {rows}"
        report["source_rows_per_s"] = round(rows / source_s)

        if not args.no_e2e:
            e2e = end_to_end(pg, mock_cluster(3), args.master, args.transactions)
            report["e2e"] = e2e
            report["e2e_over_feed"] = round(e2e["rows_per_s"] / report["feed_rows_per_s"], 3)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
