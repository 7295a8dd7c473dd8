"""Catch-up: rows/s of a changefeed started below a backlog already committed upstream.

    .venv/bin/python -m benchmarks.bench_catchup [--rows 1000000] [--masters local[1] local[2] standalone]
        [--sinks kafka spark] [--kafka-partition table index-value] [--max-batch-rows N]
        [--spark-conf KEY=VALUE ...]
    .venv/bin/python -m benchmarks.bench_catchup --metrics-overhead [--rows 200000] [--masters local[2]] [--rounds 3]

The backlog is committed to the playground (the shop workload, no DDL) before any
capture starts, so committing does not compete with the run; then, per sink and Spark
master, a ``cdcflow run`` capture (tikv source over gRPC, Spark pipeline; ``kafka``: Open
Protocol to librdkafka's mock cluster, ``spark``: change-log tables under the capture's
warehouse, counted afterwards: a run whose change logs do not hold every row change
fails) starts a changefeed below the backlog. Reported per run:

* **first batch** — from the capture's start until Spark plans its first micro-batch (the
  offset log's entry 0), and **from the first batch** — every backlog row / the seconds from
  then until the persisted checkpoint passes the last row: the pipeline's rate, whatever
  moment the first checkpoint happens to be seen;
* **start-up** — from the capture's start until the persisted checkpoint first moves
  (Spark's start and the first bounded batch);
* **catch-up** — the rows above that first checkpoint / the seconds from then until the
  persisted checkpoint passes the last committed row (batch by batch: the checkpoint's
  distinct values and the lag, wall clock − checkpoint, sampled every 0.2 s from the
  capture's metastore);
* **source has all** — when the capture's event store published past the last row
  (the EventFeed scan done; watched from the capture's start, so it may come before
  the first micro-batch), and the **pipeline alone** rate after it: the rows still
  above the checkpoint then / the time to the end — the pipeline with the cores to
  itself, without the scan (gRPC, decoding, sorting) competing for them;
* **cores** — what each kind of process spent, in cores (CPU-seconds / wall seconds),
  from the first batch, over the catch-up and over the pipeline-alone part
  (:mod:`benchmarks.cputime`): the capture's driver, Spark's Python workers, the JVM's
  task threads, JIT compilers, GC and the rest, and the playground (this process,
  serving the scan). On a 2-core machine a
  total near 2 says the run is bound by the cores, and the kinds say by whose work;

and, in the same run on the same rows, the two raw stages next to it:

* **mount** — the committed row events decoded in one process as a write task decodes
  them: ``TiDBMounter.mount_many`` over chunks of 4,096 events (the batch path, with the
  C row decoder where it is built); ``mount_one_by_one_rows_per_s`` is the same events
  through ``mount_event``, one at a time, for comparison;
* **produce** (``kafka``) — the mounted rows encoded as Open Protocol (not timed), then
  produced pre-encoded by a plain idempotent librdkafka producer to the same mock cluster;
* **plain write** (``spark``) — the mounted rows as change-log records (made with the
  Spark sink's own helpers, not timed), one ``createDataFrame`` per table written as
  Parquet partitioned as the change log is, in a ``local[2]`` session of this process:
  the least any Spark writer of these rows must do.

``--kafka-partition`` runs the Kafka catch-up once per partition rule given for the shop
tables. Under ``table`` (the default, TiCDC's) every row of a table is kept in order, so a
batch's tables are the units its tasks share: the three shop tables, about a third of the
rows each, split no better than two thirds and one third over two tasks. Under
``index-value`` only the rows of one key are kept in order and a batch splits by key over
every task: the same work, with nothing but the cores to bound how it spreads.
``--max-batch-rows`` sets the captures' ``server.spark.max-batch-rows``: each micro-batch
also costs a fixed part (Spark's offset and commit logs, planning, the job's start), which
a larger bound spreads over more rows.

A master is a Spark master URL (``local[N]``, ``spark://host:port`` of a running cluster)
or ``standalone``: a Spark standalone master and worker (2 cores) started on this machine
for that run from the pyspark distribution (:mod:`cdcflow.core.testing.servers.spark`),
the capture's driver in its own process and the executors in the worker's JVMs.

``--spark-conf`` adds Spark properties to every capture of the run (``server.spark.conf``),
so that a setting can be compared against the defaults in alternating runs.

Metrics-overhead mode runs the catch-up on the first master with ``server.metrics`` on
(the capture's ``/metrics`` scraped every second during the catch-up, fifteen times
Prometheus's usual rate) and off, ``--rounds`` pairs, alternating which side runs first,
each on a fresh backlog; it reports each side's mean catch-up and pipeline-alone rates,
the overhead in percent of the rate without metrics, and the spread of the runs. The
catch-up is the pipeline at full speed, so what metrics cost shows there; the live
benchmark's rate is the playground's commit rate (``bench_e2e --metrics-overhead``).

Targets (docs/explanation/log-service-and-pipeline.md): catch-up on local[2] at least
50 % of the slowest raw stage, and local[2] at least 1.6 × local[1]; into Spark tables,
at least 70 % of the plain write (``over_plain_write``). Scaling is reported per sink.
The ratios and the scaling compare the rates from the first batch: the catch-up rate
counts only the rows above the first checkpoint move, which may come after several
batches (of a 309,716-row backlog: after the first 99,756 rows in most runs, after
283,243 in some), and then times a few seconds of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from benchmarks import cputime
from benchmarks.bench_e2e import (
    PARTITIONS,
    LagSampler,
    Recorder,
    Scraper,
    mount_all,
    parse_spark_conf,
    percentile,
    produce_raw,
)
from cdcflow.core.config.settings import DEFAULT_MAX_BATCH_ROWS
from cdcflow.core.data.events import RawKVEvent, RowChange
from cdcflow.core.data.logservice.manifest import MANIFEST_NAME, read_manifest
from cdcflow.plugins.sinks.kafka.mock import MockCluster, mock_cluster
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBMounter
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore
from cdcflow.plugins.sources.tikv.tidb.status_api import StatusAPIClient
from tests.e2e.e2e_kafka import CaptureProcess

#: Rows per workload transaction of the shop workload, roughly (for --rows → transactions).
_ROWS_PER_TXN = 6.4
#: The spark sink of ``--sinks spark`` unless ``--spark-uri`` says otherwise.
SPARK_URI = "spark://?mode=changelog"
#: A run that has not caught up by then is reported as failed.
_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Target:
    """What a run's capture writes to and how: ``kafka`` (the mock cluster) under the
    partition rule ``kafka_rule`` (empty: the default table rule), or ``spark`` tables at
    ``spark_uri``; ``max_batch_rows``: its ``server.spark.max-batch-rows`` (None: the default)."""

    sink: str = "kafka"
    spark_uri: str = ""
    kafka_rule: str = ""
    max_batch_rows: int | None = None

    @property
    def name(self) -> str:
        """``kafka``, ``spark``, or either with the rule or URI that is not the default."""
        option = self.kafka_rule if self.sink == "kafka" else self.spark_uri.replace(SPARK_URI, "")
        return f"{self.sink} {option}" if option else self.sink

    def configure(self, capture: CaptureProcess) -> None:
        """Rewrite the capture's connectors file for this target."""
        if self.sink == "spark":
            _to_spark_tables(capture, self.spark_uri or SPARK_URI)
        elif self.kafka_rule:
            _dispatch_by(capture, self.kafka_rule)
        if self.max_batch_rows is not None:
            doc = yaml.safe_load(capture.file.read_text())
            doc["server"]["spark"]["max-batch-rows"] = self.max_batch_rows
            capture.file.write_text(yaml.safe_dump(doc))


def catch_up(
    pg: Playground,
    cluster: MockCluster,
    master: str,
    start_ts: int,
    last_ts: int,
    commit_ts: list[int],
    *,
    metrics: bool = True,
    scrape: bool = False,
    spark_conf: dict[str, str] | None = None,
    target: Target = Target(),
) -> dict[str, Any]:
    if master == "standalone":
        from cdcflow.core.testing.servers import start_spark_cluster

        with start_spark_cluster(cores=2) as spark:
            conf = {**spark.driver_conf(), **(spark_conf or {})}
            run = _catch_up(
                pg,
                cluster,
                spark.master_url,
                start_ts,
                last_ts,
                commit_ts,
                conf,
                metrics=metrics,
                scrape=scrape,
                target=target,
            )
        run["master"] = f"standalone ({spark.master_url}, 1 worker, 2 cores)"
        return run
    return _catch_up(
        pg,
        cluster,
        master,
        start_ts,
        last_ts,
        commit_ts,
        spark_conf,
        metrics=metrics,
        scrape=scrape,
        target=target,
    )


def _catch_up(
    pg: Playground,
    cluster: MockCluster,
    master: str,
    start_ts: int,
    last_ts: int,
    commit_ts: list[int],
    spark_conf: dict[str, str] | None = None,
    *,
    metrics: bool = True,
    scrape: bool = False,
    target: Target = Target(),
) -> dict[str, Any]:
    sink, spark_uri = target.sink, target.spark_uri
    topic = f"bench-catchup-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)  # the mock cluster creates topics only from this process
    with tempfile.TemporaryDirectory() as tmp:
        # Every span at once (adds_per_tick=0), as the two-phase scheduler starts a changefeed.
        capture = CaptureProcess(
            Path(tmp),
            pg,
            cluster.bootstrap_servers,
            topic,
            start_ts,
            partitions=PARTITIONS,
            master=master,
            adds_per_tick=0,
            spark_conf=spark_conf,
            metrics=metrics,
        )
        target.configure(capture)
        started, started_wall = time.perf_counter(), time.time()
        capture.start()
        assert capture.proc is not None
        cpu = cputime.CpuMeter(capture.proc.pid)
        try:
            progress = _Progress(Path(tmp) / "data", cpu, last_ts)
            first_checkpoint = _first_move(capture, progress, start_ts, started)
            first_move = time.perf_counter()
            cpu.mark("first move")
            sampler = LagSampler(capture)
            sampler.start()
            scraper = Scraper(capture) if metrics and scrape else None
            if scraper is not None:
                scraper.start()
            checkpoints: set[int] = set()
            while True:
                state, checkpoint = capture.checkpoint()
                checkpoints.add(checkpoint)
                if checkpoint >= last_ts:
                    break
                progress.poll(checkpoint)
                _check(capture, state, started)
                time.sleep(0.1)
            done, done_wall = time.perf_counter(), time.time()
            cpu.mark("done")
            lags = sampler.stop()
            scrapes = scraper.stop() if scraper is not None else 0
        finally:
            capture.stop()
        if sink == "spark":
            found = _count_changelog(Path(tmp) / "lake")
            if found != len(commit_ts):
                kept = Path(tempfile.mkdtemp(prefix="cdcflow-bench-failed-"))
                shutil.copytree(tmp, kept, dirs_exist_ok=True)
                raise RuntimeError(
                    f"{spark_uri or SPARK_URI} on {master}: the change logs hold {found} row changes, "
                    f"not {len(commit_ts)}: see {kept} (the capture's log, data directory and tables)"
                )
    # The rows of the first batch(es) are done when the checkpoint first moves: the rate
    # counts the rows above that checkpoint, over the time from then to the end.
    seconds = done - first_move
    rows_after = sum(1 for ts in commit_ts if ts > first_checkpoint)
    if not rows_after:
        raise RuntimeError(f"the first checkpoint move ({first_checkpoint}) covered the whole backlog: add --rows")
    # After the source has it all the pipeline has the cores to itself: its own rate.
    ingested_at, checkpoint_then = progress.ingested or (done, last_ts)
    first_batch = progress.first_batch
    rows_left = sum(1 for ts in commit_ts if ts > checkpoint_then)
    # Every row, from the first micro-batch's start to the checkpoint passing the last:
    # unlike the catch-up rate it does not depend on when the first checkpoint was seen.
    batches_s = done_wall - first_batch if first_batch is not None else None
    return {
        "sink": sink,
        **({"spark_uri": spark_uri or SPARK_URI} if sink == "spark" else {}),
        **({"partition_rule": target.kafka_rule or "table"} if sink == "kafka" else {}),
        **({"max_batch_rows": target.max_batch_rows} if target.max_batch_rows is not None else {}),
        "master": master,
        "first_batch_s": round(first_batch - started_wall, 1) if first_batch is not None else None,
        "from_first_batch_s": round(batches_s, 1) if batches_s else None,
        "from_first_batch_rows_per_s": round(len(commit_ts) / batches_s) if batches_s else None,
        "startup_s": round(first_move - started, 1),
        "source_has_all_s": round(ingested_at - started, 1),
        "rows_left_then": rows_left,
        "pipeline_alone_rows_per_s": round(rows_left / (done - ingested_at)) if done > ingested_at else None,
        "rows_in_first_batches": len(commit_ts) - rows_after,
        "catch_up_s": round(seconds, 1),
        "catch_up_rows_per_s": round(rows_after / seconds),
        "checkpoint_values_seen": len(checkpoints),
        "checkpoint_lag_p50_s": round(percentile(lags, 50), 1),
        "checkpoint_lag_p99_s": round(percentile(lags, 99), 1),
        "metrics": metrics,
        "metrics_scrapes": scrapes,
        # Cores each kind of process used: over the catch-up (the playground serving
        # the scan is this process), and once the source had every row.
        "cores_from_first_batch": cpu.cores("first batch", "done"),
        "cores_during_catch_up": cpu.cores("first move", "done"),
        "cores_pipeline_alone": cpu.cores("source has all", "done"),
        "spark_conf": spark_conf or {},
    }


def _to_spark_tables(capture: CaptureProcess, uri: str) -> None:
    """Point the capture's connector at Spark tables (``uri``, under its warehouse directory)
    instead of Kafka."""
    doc = yaml.safe_load(capture.file.read_text())
    doc["connectors"][0]["sinks"] = [{"uri": uri}]
    capture.file.write_text(yaml.safe_dump(doc))


def _dispatch_by(capture: CaptureProcess, rule: str) -> None:
    """Have the capture's Kafka sink choose every row's partition by ``rule`` (a
    ``dispatchers`` rule's ``partition``) instead of the default table rule. The rule
    matches ``*.*``: a rule for only some tables leaves the rest to the table rule, which
    keeps each table's rows in order."""
    doc = yaml.safe_load(capture.file.read_text())
    doc["connectors"][0]["sinks"][0]["dispatchers"] = [{"matcher": ["*.*"], "partition": rule}]
    capture.file.write_text(yaml.safe_dump(doc))


def _count_changelog(lake: Path) -> int:
    """Row changes in the change logs of every shop table (every batch)."""
    import pyarrow.dataset as ds

    rows = 0
    for root in sorted(lake.glob("shop/*/changelog")):
        rows += ds.dataset(str(root), format="parquet", partitioning="hive").count_rows()
    return rows


def plain_write(rows: list[RowChange], tmp: Path) -> float:
    """Rows/s of a plain Spark write of ``rows`` in the change log's layout: per table one
    ``createDataFrame`` of its change-log records (made beforehand with the sink's own
    helpers, untimed) written as Parquet partitioned as the sink partitions it — the
    least any Spark writer of these rows must do. A ``local[2]`` session of this process;
    a first write of a few rows per table warms it, untimed."""
    from cdcflow.plugins.sinks.spark.batchframe import changelog_ddl
    from cdcflow.plugins.sinks.spark.frames import changelog_records, decimal_ints, image_columns
    from cdcflow.plugins.sinks.spark.session import spark_session

    by_table: dict[tuple[str, str], list[RowChange]] = {}
    for row in rows:
        by_table.setdefault((row.table.schema, row.table.table), []).append(row)
    tables = []
    for changes in by_table.values():
        types = image_columns(changes)
        records = changelog_records(decimal_ints(changes, types), list(types), 0)
        tables.append((records, changelog_ddl(types)))
    spark = spark_session("local[2]", str(tmp / "warehouse"), {"spark.ui.enabled": "false"})
    try:
        spark.sparkContext.setLogLevel("ERROR")

        def write(n: int, records: list[tuple[Any, ...]], ddl: str, where: str) -> None:
            frame = spark.createDataFrame(records, schema=ddl, verifySchema=False)
            frame.write.mode("append").partitionBy("commit_date", "batch_id").parquet(str(tmp / where / str(n)))

        for n, (records, ddl) in enumerate(tables):
            write(n, records[:1000], ddl, "warm")
        started = time.perf_counter()
        for n, (records, ddl) in enumerate(tables):
            write(n, records, ddl, "plain")
        return len(rows) / (time.perf_counter() - started)
    finally:
        spark.stop()


@dataclass
class _Progress:
    """What a run has reached besides the checkpoint, polled with it every 0.1 s."""

    data_dir: Path
    cpu: cputime.CpuMeter
    last_ts: int
    #: Wall clock: when Spark planned micro-batch 0 (its offset log's entry 0).
    first_batch: float | None = None
    #: When the capture's event store published past the last row (the scan done), and
    #: the persisted checkpoint then.
    ingested: tuple[float, int] | None = None

    def poll(self, checkpoint: int) -> None:
        if self.first_batch is None:
            self.first_batch = _first_batch_at(self.data_dir)
            if self.first_batch is not None:
                self.cpu.mark("first batch")
        if self.ingested is None and _published_ts(self.data_dir) >= self.last_ts:
            self.ingested = (time.perf_counter(), checkpoint)
            self.cpu.mark("source has all")


def _rate(run: dict[str, Any]) -> float:
    """The rate a run's ratios compare: from the first batch (every row, whatever batch the
    first checkpoint move happens to follow), else the catch-up's."""
    return float(run["from_first_batch_rows_per_s"] or run["catch_up_rows_per_s"])


def _first_move(capture: CaptureProcess, progress: _Progress, start_ts: int, started: float) -> int:
    """Wait for the persisted checkpoint's first move above ``start_ts``; returns it."""
    while True:
        state, checkpoint = capture.checkpoint()
        progress.poll(checkpoint)
        if checkpoint and checkpoint > start_ts:
            return checkpoint
        _check(capture, state, started)
        time.sleep(0.1)


def _first_batch_at(data_dir: Path) -> float | None:
    """When the capture's Spark query planned its first micro-batch (the wall-clock time
    of its offset log's entry 0), or None before it has."""
    for entry in data_dir.glob("changefeeds/*/spark-checkpoint/offsets/0"):
        return entry.stat().st_mtime
    return None


def _published_ts(data_dir: Path) -> int:
    """The lowest published ts over the capture's event stores (0: none yet)."""
    published = [read_manifest(m.parent) for m in data_dir.rglob(MANIFEST_NAME)]
    return min((m.published_ts for m in published if m is not None), default=0)


def _check(capture: CaptureProcess, state: str, started: float) -> None:
    if not capture.alive() or state in ("failed", "error") or time.perf_counter() - started > _TIMEOUT_S:
        raise RuntimeError(f"the changefeed is {state or 'not running'}: see {capture.log}")


def backlog(rows: int) -> tuple[Playground, Recorder, int, int, float]:
    """A playground holding ``rows`` committed row changes: (playground, recorder, start ts,
    last ts, seconds it took to commit them)."""
    pg = Playground(stores=3, seed=5, ddl_every=0, split_keys=0)
    pg.start()
    recorder = Recorder(pg)
    start_ts = pg.now()
    recorder.on = True
    began = time.perf_counter()
    pg.run_workload(max(1, round(rows / _ROWS_PER_TXN)))
    recorder.on = False
    return pg, recorder, start_ts, pg.now(), time.perf_counter() - began


def metrics_overhead(rows: int, master: str, rounds: int) -> dict[str, Any]:
    """Catch-up rates with ``server.metrics`` on (scraped every second) and off, alternating
    which goes first from round to round, each run on a backlog of its own."""
    cluster = mock_cluster(3)
    runs: list[dict[str, Any]] = []
    for round_ in range(rounds):
        for metrics in (True, False) if round_ % 2 == 0 else (False, True):
            pg, recorder, start_ts, last_ts, _ = backlog(rows)
            try:
                commit_ts = [e.commit_ts for e in recorder.events]
                run = catch_up(pg, cluster, master, start_ts, last_ts, commit_ts, metrics=metrics, scrape=True)
            finally:
                pg.stop()
            runs.append({"round": round_, **run})
    report: dict[str, Any] = {"rows": rows, "master": master, "runs": runs}
    for key in ("catch_up_rows_per_s", "pipeline_alone_rows_per_s"):
        on = [r[key] for r in runs if r["metrics"] and r[key]]
        off = [r[key] for r in runs if not r["metrics"] and r[key]]
        if on and off:
            mean_on, mean_off = statistics.mean(on), statistics.mean(off)
            report[f"{key}_metrics_on"] = round(mean_on)
            report[f"{key}_metrics_off"] = round(mean_off)
            report[f"{key}_overhead_percent"] = round((mean_off - mean_on) / mean_off * 100, 2)
            # The spread of each side: an overhead inside it is not told apart from noise.
            report[f"{key}_spread_percent"] = round(max(max(on) - min(on), max(off) - min(off)) / mean_off * 100, 2)
    return report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="row changes in the backlog (approximately)")
    parser.add_argument(
        "--metrics-overhead",
        action="store_true",
        help="catch-up with server.metrics on (scraped every second) and off, alternating, on the first master",
    )
    parser.add_argument("--rounds", type=int, default=3, help="metrics-overhead mode: on/off pairs of runs")
    parser.add_argument(
        "--masters",
        nargs="+",
        default=["local[1]", "local[2]"],
        help="Spark masters to run (standalone: a local master + worker)",
    )
    parser.add_argument(
        "--sinks",
        nargs="+",
        choices=("kafka", "spark"),
        default=["kafka"],
        help="sinks to catch up into: kafka (Open Protocol, the mock cluster), spark (change-log tables)",
    )
    parser.add_argument(
        "--spark-uri",
        action="append",
        default=[],
        metavar="URI",
        help=f"the spark sink's URI, one run each (default {SPARK_URI}; e.g. add &frame-writes=true); repeatable",
    )
    parser.add_argument(
        "--kafka-partition",
        nargs="+",
        default=["table"],
        choices=("table", "index-value", "ts"),
        metavar="RULE",
        help="the kafka sink's partition rule for the shop tables, one run each (default table, TiCDC's "
        "default: a table's rows in order, each table one task's work in a batch; index-value: rows "
        "of one key in order, a batch split by key; ts)",
    )
    parser.add_argument(
        "--max-batch-rows",
        type=int,
        metavar="N",
        help=f"server.spark.max-batch-rows of every capture (default: the setting's, {DEFAULT_MAX_BATCH_ROWS:,})",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark property for every capture of the run (server.spark.conf); repeatable",
    )
    return parser


def _targets(args: argparse.Namespace) -> list[Target]:
    """A target per sink and per ``--spark-uri`` (spark) or ``--kafka-partition`` rule (kafka)."""
    targets: list[Target] = []
    for sink in args.sinks:
        if sink == "spark":
            options = [Target(sink, spark_uri=uri) for uri in args.spark_uri or [SPARK_URI]]
        else:
            options = [Target(sink, kafka_rule="" if rule == "table" else rule) for rule in args.kafka_partition]
        targets += [replace(target, max_batch_rows=args.max_batch_rows) for target in options]
    return targets


#: Events a write task hands its mounter at a time (the event store's record batches).
MOUNT_CHUNK = 4_096


async def mount_batches(status_address: str, start_ts: int, events: list[RawKVEvent]) -> tuple[float, list[RowChange]]:
    """Seconds and rows of mounting ``events`` as a write task does (``mount_many`` per
    chunk), with the schemas at ``start_ts`` (the backlog has no DDL)."""
    store = SchemaStore()
    async with StatusAPIClient(f"http://{status_address}") as client:
        await store.load(client, start_ts)
    mounter = TiDBMounter(store)
    started = time.perf_counter()
    rows = [
        row
        for i in range(0, len(events), MOUNT_CHUNK)
        for row in mounter.mount_many(events[i : i + MOUNT_CHUNK])
        if row is not None
    ]
    return time.perf_counter() - started, rows


def raw_mount(
    report: dict[str, Any], status_address: str, start_ts: int, events: list[RawKVEvent]
) -> tuple[float, list[RowChange]]:
    """The raw mount stage (:func:`mount_batches`), next to one event at a time (reported, not used)."""
    one_s, one_by_one = asyncio.run(mount_all(status_address, start_ts, events))
    report["mount_one_by_one_rows_per_s"] = round(len(events) / one_s)
    mount_s, mounted = asyncio.run(mount_batches(status_address, start_ts, events))
    if mounted != one_by_one:
        raise SystemExit("mount_many and mount_event gave different rows")
    return mount_s, mounted


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    conf = parse_spark_conf(parser, args.spark_conf)
    if args.metrics_overhead:
        print(json.dumps(metrics_overhead(args.rows, args.masters[0], args.rounds), indent=2))
        return
    cluster = mock_cluster(3)
    report: dict[str, Any] = {}
    mounted: list[RowChange] = []
    # A playground per run: a finished changefeed's GC safepoint stays in PD (its TTL),
    # and the next one, starting below the same backlog, would be refused with 5001.
    targets = _targets(args)
    done: list[tuple[Target, dict[str, Any]]] = []
    for target, master in itertools.product(targets, args.masters):
        pg, recorder, start_ts, last_ts, load_s = backlog(args.rows)
        try:
            commit_ts = [e.commit_ts for e in recorder.events]
            run = catch_up(pg, cluster, master, start_ts, last_ts, commit_ts, spark_conf=conf, target=target)
            done.append((target, run))
            if not mounted:
                rows = len(recorder.events)
                report["rows"] = rows
                report["load_s"] = round(load_s, 1)
                mount_s, mounted = raw_mount(report, pg.status_address, start_ts, recorder.events)
        finally:
            pg.stop()
    runs = [run for _, run in done]
    mount = rows / mount_s
    report["mount_rows_per_s"] = round(mount)
    slowest: dict[str, float] = {}
    if "kafka" in args.sinks:
        produce_s, _ = produce_raw(cluster.bootstrap_servers, f"bench-catchup-raw-{uuid.uuid4().hex[:8]}", mounted)
        produce = len(mounted) / produce_s
        report["raw_produce_rows_per_s"] = round(produce)
        slowest["kafka"] = min(mount, produce)
    if "spark" in args.sinks:
        with tempfile.TemporaryDirectory(prefix="cdcflow-bench-") as tmp:
            plain = plain_write(mounted, Path(tmp))
        report["plain_write_rows_per_s"] = round(plain)
        slowest["spark"] = min(mount, plain)
    for run in runs:
        rate = _rate(run)
        run["over_slowest_raw_stage"] = round(rate / slowest[run["sink"]], 3)
        if run["sink"] == "spark":
            run["over_plain_write"] = round(rate / report["plain_write_rows_per_s"], 3)
    report["runs"] = runs
    _report_scaling(report, targets, done)
    print(json.dumps(report, indent=2))


def _report_scaling(report: dict[str, Any], targets: list[Target], done: list[tuple[Target, dict[str, Any]]]) -> None:
    """Each target's last master's rate over its first's, from the first batch and alone."""
    for target in targets:
        own = [run for of, run in done if of == target]
        if len(own) >= 2:
            first, last = own[0], own[-1]
            name = target.name
            report[f"{name}_scaling_last_over_first"] = round(_rate(last) / _rate(first), 2)
            alone = [first["pipeline_alone_rows_per_s"], last["pipeline_alone_rows_per_s"]]
            if all(alone):
                report[f"{name}_pipeline_alone_scaling"] = round(alone[1] / alone[0], 2)


if __name__ == "__main__":
    main()
