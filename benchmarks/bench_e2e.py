"""End to end: rows/s from the playground to the Kafka mock cluster, next to two ceilings.

    .venv/bin/python -m benchmarks.bench_e2e [--txns 3000] [--rate TXNS_PER_S] [--stages] [--spark-conf KEY=VALUE ...]
    .venv/bin/python -m benchmarks.bench_e2e --memory [--rows 1000000] [--quota 64MiB] [--trace FILE]
    .venv/bin/python -m benchmarks.bench_e2e --metrics-overhead [--txns 3000] [--rounds 2]

The playground upstream and the Kafka mock cluster run in this process; the capture is
a separate ``cdcflow run`` process (tikv source over gRPC, Spark pipeline local[2],
Kafka sink producing Open Protocol to the mock cluster's bootstrap address).

Throughput mode, all in one run on the same machine:

* **e2e** — after a warm-up (Spark up, the changefeed checkpointing live commits),
  ``--txns`` workload transactions are committed as fast as the playground commits them;
  timed from the first commit until the persisted checkpoint passes the last one.
  With ``--rate`` the transactions are committed at that pace instead (the workload's
  own thread; ``--txns / --rate`` seconds): the live path at a load below its ceiling,
  where the checkpoint lag is the pipeline's latency, not a queue.
  The checkpoint lag (wall clock − checkpoint's physical time) is sampled from the
  capture's metastore every 0.2 s meanwhile: p50 / p99 are reported.
* **stages** (with ``--stages``) — where the lag comes from: the capture's
  ``GET /api/v2/changefeeds/{id}/statistics`` is read every 0.1 s meanwhile, whose
  ``stages`` give the ts each stage of the way reached (the source's resolved ts, the
  event store's published ts, the end of the newest micro-batch begun, the ts the
  sinks flushed, the maintainer's checkpoint, the coordinator's, and the persisted
  one). Reported per stage: its lag (wall clock − ts) p50 / p99; and per hop (a stage
  to the next) the time the next stage took to reach a ts the stage was seen at
  (mean / p99, to the 0.1 s of the sampling). The reads cost the capture a little.
  ``--spark-conf`` adds Spark properties to the capture (``server.spark.conf``): an
  event log (``spark.eventLog.enabled=true``, ``spark.eventLog.dir=file:///tmp/ev``)
  holds each micro-batch's progress, its durations by phase.
* **mount** — the same committed row events, decoded by ``TiDBMounter`` in this
  process (schema loaded from the status API first, not timed): the raw decode rate.
* **produce** — the mounted rows encoded as Open Protocol messages (not timed), then
  produced pre-encoded by a plain librdkafka producer (idempotent, acks=all) to
  another topic of the same mock cluster: the raw produce rate.

Metrics-overhead mode measures the e2e rate (as above, without the ceilings) with
``server.metrics`` on — /metrics scraped every second meanwhile, fifteen times
Prometheus's usual rate — and off, alternating on/off for ``--rounds`` rounds in the
same run (which side goes first alternates), each run on a fresh capture and topic; it
reports every run's rows/s, the mean of each side and the overhead of metrics in percent
of the rate without. That rate is bounded by the playground's commits on the same cores,
so it shows whether metrics slow the live path, not what they cost at full speed:
``bench_catchup --metrics-overhead`` measures that on a catch-up.

Memory mode commits ONE transaction of ``--rows`` rows into ``shop.orders`` and
replicates it with the changefeed's memory quota set to ``--quota``; it reports the
capture process's peak RSS (VmHWM) against its RSS just before the transaction (the
fixed overhead: interpreter, gRPC, PySpark, pyarrow), next to the quota, plus the
JVM's and Python workers' peaks separately, and the messages the topic received.
With ``--trace FILE`` the capture runs with tracemalloc and appends its RSS,
traced Python bytes and top allocation sites to FILE every second (see
``benchmarks/memtrace``; tracing slows the capture down several times).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import decimal
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.bench_pipeline import descendants, proc_kib, process_kind
from cdcflow.core.config.units import parse_bytes
from cdcflow.core.data.events import RawKVEvent, RowChange, Span, tso_physical_ms
from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
from cdcflow.plugins.sinks.kafka.mock import mock_cluster
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.mvcc import ChangeKind, Op
from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBMounter
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore
from cdcflow.plugins.sources.tikv.tidb.status_api import StatusAPIClient
from tests.e2e.e2e_kafka import CHANGEFEED, CaptureProcess

PARTITIONS = 3


class Recorder:
    """Committed row events of the playground while ``on`` (as the EventFeed would carry them)."""

    def __init__(self, pg: Playground) -> None:
        self.on = False
        self.events: list[RawKVEvent] = []
        self._span = Span(0, b"", b"")
        pg.cluster.mvcc.subscribe(self._observe)

    def _observe(self, changes: Any) -> None:
        if not self.on:
            return
        for c in changes:
            if c.kind is ChangeKind.COMMIT:
                delete = c.op is Op.DELETE
                value = b"" if delete else c.value
                self.events.append(RawKVEvent(self._span, c.key, value, c.old_value, c.start_ts, c.commit_ts, delete))


class LagSampler(threading.Thread):
    """Checkpoint lag of the capture's changefeed, every ``interval`` s, from its metastore."""

    def __init__(self, capture: CaptureProcess, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.capture, self.interval = capture, interval
        self.samples: list[float] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            _, checkpoint = self.capture.checkpoint()
            if checkpoint:
                self.samples.append(max(0.0, time.time() - tso_physical_ms(checkpoint) / 1000))

    def stop(self) -> list[float]:
        self._done.set()
        self.join()
        return self.samples


#: The stages a change goes through, in order (the ``stages`` of the statistics answer,
#: then the persisted checkpoint).
STAGES = (
    "source_resolved_ts",
    "published_ts",
    "batch_end_ts",
    "flushed_ts",
    "maintainer_checkpoint_ts",
    "coordinator_checkpoint_ts",
    "persisted_checkpoint_ts",
)


class StageSampler(threading.Thread):
    """Each stage's ts, every ``interval`` s, from the capture's statistics endpoint."""

    def __init__(self, capture: CaptureProcess, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{capture.api_address()}/api/v2/changefeeds/{CHANGEFEED}/statistics"
        self.interval = interval
        self.samples: list[tuple[float, list[int]]] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            with urllib.request.urlopen(self.url, timeout=30) as resp:
                body = json.loads(resp.read())
            stages = body["captures"][0].get("stages", {}) if body["captures"] else {}
            stages = {**stages, "persisted_checkpoint_ts": body["checkpoint_tso"]}
            if all(stages.get(name) for name in STAGES):
                self.samples.append((body["time"], [stages[name] for name in STAGES]))

    def stop(self) -> dict[str, Any]:
        self._done.set()
        self.join()
        return stage_report(self.samples)


def stage_report(samples: list[tuple[float, list[int]]]) -> dict[str, Any]:
    """Per stage its lag p50 / p99; per hop the time the next stage took to reach a ts
    the stage was first seen at (see the module docs)."""
    lags = {name: [max(0.0, t - tso_physical_ms(ts[k]) / 1000) for t, ts in samples] for k, name in enumerate(STAGES)}
    report: dict[str, Any] = {"samples": len(samples), "lag_s": {}, "hop_s": {}}
    for name, values in lags.items():
        report["lag_s"][name] = {"p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3)}
    for k in range(len(STAGES) - 1):
        delays = []
        for i in range(1, len(samples)):
            seen = samples[i][1][k]
            if seen <= samples[i - 1][1][k]:
                continue  # not a new ts of this stage
            for j in range(i, len(samples)):
                if samples[j][1][k + 1] >= seen:
                    delays.append(samples[j][0] - samples[i][0])
                    break
        name = f"{STAGES[k].removesuffix('_ts')} -> {STAGES[k + 1].removesuffix('_ts')}"
        report["hop_s"][name] = {
            "mean": round(statistics.mean(delays), 3) if delays else None,
            "p99": round(percentile(delays, 99), 3),
            "n": len(delays),
        }
    return report


async def mount_all(status_address: str, start_ts: int, events: list[RawKVEvent]) -> tuple[float, list[RowChange]]:
    store = SchemaStore()
    async with StatusAPIClient(f"http://{status_address}") as client:
        await store.load(client, start_ts)
    mounter = TiDBMounter(store)
    rows: list[RowChange] = []
    started = time.perf_counter()
    for event in events:
        mounted = await mounter.mount_event(event)
        if isinstance(mounted, RowChange):
            rows.append(mounted)
    return time.perf_counter() - started, rows


def produce_raw(bootstrap: str, topic: str, rows: list[RowChange]) -> tuple[float, int]:
    codec = OpenProtocolCodec(OpenProtocolConfig())
    messages = [m for i in range(0, len(rows), 4096) for m in codec.encode_rows(rows[i : i + 4096])]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    started = time.perf_counter()
    for n, message in enumerate(messages):
        while True:
            try:
                producer.produce(topic, message.value, message.key, n % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0, "the raw producer did not deliver every message"
    return time.perf_counter() - started, len(messages)


def end_offsets(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions)
    finally:
        consumer.close()


def percentile(samples: list[float], q: int) -> float:
    if len(samples) < 2:
        return samples[0] if samples else float("nan")
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    cluster = mock_cluster(3)
    topic = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    cluster.create_topic(topic + "-raw", PARTITIONS, 3)
    with tempfile.TemporaryDirectory() as tmp, Playground(stores=3, seed=5, ddl_every=0, split_keys=0) as pg:
        recorder = Recorder(pg)
        start_ts = pg.now()
        capture = CaptureProcess(Path(tmp), pg, cluster.bootstrap_servers, topic, start_ts, spark_conf=args.conf)
        capture.start()
        try:
            pg.run_workload(50)  # warm-up: Spark, the data source, the producer
            capture.wait_checkpoint(pg.now(), timeout=600)
            sampler = LagSampler(capture)
            sampler.start()
            stages = StageSampler(capture) if args.stages else None
            if stages is not None:
                stages.start()
            measured_from = pg.now()
            recorder.on = True
            started = time.perf_counter()
            if args.rate:
                # Paced: the workload's own thread at --rate transactions/s for --txns of them.
                pg.start_workload(args.rate)
                time.sleep(args.txns / args.rate)
                pg.stop_workload()
            else:
                pg.run_workload(args.txns)
            load_s = time.perf_counter() - started
            recorder.on = False
            capture.wait_checkpoint(pg.now(), timeout=1800)
            e2e_s = time.perf_counter() - started
            lags = sampler.stop()
            breakdown = stages.stop() if stages is not None else None
        finally:
            capture.stop()
        rows = len(recorder.events)
        mount_s, mounted = asyncio.run(mount_all(pg.status_address, measured_from, recorder.events))
    produce_s, messages = produce_raw(cluster.bootstrap_servers, topic + "-raw", mounted)
    e2e, mount, produce = rows / e2e_s, rows / mount_s, len(mounted) / produce_s
    return {
        "rows": rows,
        "transactions": args.txns,
        "paced_txns_per_s": args.rate or None,
        "playground_commit_rows_per_s": round(rows / load_s),
        "e2e_rows_per_s": round(e2e),
        "mount_rows_per_s": round(mount),
        "raw_produce_rows_per_s": round(produce),
        "raw_produce_messages": messages,
        "e2e_over_mount": round(e2e / mount, 3),
        "e2e_over_raw_produce": round(e2e / produce, 3),
        "checkpoint_lag_samples": len(lags),
        "checkpoint_lag_p50_s": round(percentile(lags, 50), 2),
        "checkpoint_lag_p99_s": round(percentile(lags, 99), 2),
        "checkpoint_lag_max_s": round(max(lags), 2) if lags else None,
        **({"stages": breakdown} if breakdown is not None else {}),
    }


class Scraper(threading.Thread):
    """GET /metrics of the capture every ``interval`` s (what Prometheus does, more often)."""

    def __init__(self, capture: CaptureProcess, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.address, self.interval = capture.api_address(), interval
        self.scrapes = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=30) as resp:
                resp.read()
            self.scrapes += 1

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.scrapes


def e2e_rate(pg: Playground, tmp: Path, cluster: Any, txns: int, *, metrics: bool) -> tuple[float, int]:
    """(rows/s end to end, scrapes) of ``txns`` workload transactions through a new capture."""
    topic = f"bench-metrics-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    capture = CaptureProcess(tmp, pg, cluster.bootstrap_servers, topic, pg.now(), metrics=metrics)
    recorder = Recorder(pg)
    capture.start()
    scraper = None
    try:
        pg.run_workload(50)  # warm-up
        capture.wait_checkpoint(pg.now(), timeout=600)
        if metrics:
            scraper = Scraper(capture)
            scraper.start()
        recorder.on = True
        started = time.perf_counter()
        pg.run_workload(txns)
        recorder.on = False
        capture.wait_checkpoint(pg.now(), timeout=1800)
        elapsed = time.perf_counter() - started
    finally:
        scrapes = scraper.stop() if scraper is not None else 0
        capture.stop()
    return len(recorder.events) / elapsed, scrapes


def metrics_overhead(args: argparse.Namespace) -> dict[str, Any]:
    cluster = mock_cluster(3)
    runs: list[dict[str, Any]] = []
    with Playground(stores=3, seed=5, ddl_every=0, split_keys=0) as pg:
        for round_ in range(args.rounds):
            # Alternate which side goes first: a run after another on the same playground
            # meets more MVCC versions and the previous capture's exit.
            for metrics in (True, False) if round_ % 2 == 0 else (False, True):
                with tempfile.TemporaryDirectory() as tmp:
                    rate, scrapes = e2e_rate(pg, Path(tmp), cluster, args.txns, metrics=metrics)
                runs.append({"round": round_, "metrics": metrics, "e2e_rows_per_s": round(rate), "scrapes": scrapes})
    on = statistics.mean(r["e2e_rows_per_s"] for r in runs if r["metrics"])
    off = statistics.mean(r["e2e_rows_per_s"] for r in runs if not r["metrics"])
    return {
        "transactions": args.txns,
        "runs": runs,
        "e2e_rows_per_s_metrics_on": round(on),
        "e2e_rows_per_s_metrics_off": round(off),
        "metrics_overhead_percent": round((off - on) / off * 100, 2),
    }


def order_row(n: int) -> dict[str, Any]:
    return {
        "customer_id": n % 977,
        "product_id": n % 311,
        "quantity": 1 + n % 9,
        "amount": decimal.Decimal(n % 100_000) / 100,
        "status": "new",
        "note": f"bulk order {n:09d}",
        "ship_window": dt.timedelta(hours=n % 24),
    }


def memory(args: argparse.Namespace) -> dict[str, Any]:
    cluster = mock_cluster(3)
    topic = f"bench-e2e-mem-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    quota = f"{args.quota}B"
    if args.trace:
        # Inherited by the capture process (benchmarks/memtrace/sitecustomize.py).
        os.environ["CDCFLOW_MEMTRACE"] = str(Path(args.trace).resolve())
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(__file__).parent / "memtrace"), os.environ.get("PYTHONPATH")])
        )
    with tempfile.TemporaryDirectory() as tmp, Playground(stores=3, seed=5, ddl_every=0, split_keys=0) as pg:
        start_ts = pg.now()
        capture = CaptureProcess(Path(tmp), pg, cluster.bootstrap_servers, topic, start_ts, memory_quota=quota)
        capture.start()
        try:
            pg.run_workload(50)  # warm-up: everything loaded once is in the baseline
            capture.wait_checkpoint(pg.now(), timeout=600)
            assert capture.proc is not None
            pid = capture.proc.pid
            before = proc_kib(pid, "VmRSS")
            table = pg.catalog.find("shop", "orders")
            txn = pg.begin()
            for n in range(args.rows):
                txn.put(row_key(table, 10_000_000 + n), encode_row_value(table, order_row(n)))
            started = time.perf_counter()
            commit_ts = txn.commit()
            del txn
            capture.wait_checkpoint(commit_ts, timeout=3600)
            elapsed = time.perf_counter() - started
            peak = proc_kib(pid, "VmHWM")
            children: dict[str, int] = {}
            for child in descendants(pid):
                kind = process_kind(child)
                try:
                    children[kind] = max(children.get(kind, 0), proc_kib(child, "VmHWM"))
                except OSError:
                    continue
        finally:
            capture.stop()
    # The mock cluster keeps only the last few MiB of a partition, so the topic cannot be
    # read back in full: count the messages produced (end offsets) instead.
    messages = end_offsets(cluster.bootstrap_servers, topic)
    assert messages >= args.rows / 16, f"only {messages} messages for {args.rows} rows (max-batch-size 16)"
    return {
        "rows": args.rows,
        "memory_quota_mib": round(args.quota / 2**20),
        "seconds_commit_to_checkpoint": round(elapsed, 1),
        "capture_rss_before_mib": round(before / 1024),
        "capture_peak_rss_mib": round(peak / 1024),
        "peak_minus_before_mib": round((peak - before) / 1024),
        "children_peak_rss_mib": {k: round(v / 1024) for k, v in sorted(children.items())},
        "messages_in_topic": messages,
    }


def parse_spark_conf(parser: argparse.ArgumentParser, pairs: list[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            parser.error(f"--spark-conf {pair!r}: expected KEY=VALUE, e.g. spark.shuffle.compress=false")
        conf[key.strip()] = value.strip()
    return conf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--txns", type=int, default=3000, help="workload transactions in the measured burst")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="throughput mode: commit at this many transactions/s (about 6.4 rows each) instead of a burst",
    )
    parser.add_argument(
        "--stages", action="store_true", help="throughput mode: also break the checkpoint lag down by stage"
    )
    parser.add_argument("--memory", action="store_true", help="one huge transaction; report peak RSS")
    parser.add_argument("--rows", type=int, default=1_000_000, help="memory mode: rows of the transaction")
    parser.add_argument("--quota", type=parse_bytes, default=parse_bytes("64MiB"), help="memory mode: memory quota")
    parser.add_argument("--trace", help="memory mode: trace the capture's allocations into this file")
    parser.add_argument(
        "--metrics-overhead", action="store_true", help="e2e rate with server.metrics on (scraped) and off"
    )
    parser.add_argument("--rounds", type=int, default=2, help="metrics-overhead mode: on/off pairs of runs")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="throughput mode: a Spark property for the capture (server.spark.conf); repeatable",
    )
    args = parser.parse_args()
    args.conf = parse_spark_conf(parser, args.spark_conf)
    mode = metrics_overhead if args.metrics_overhead else memory if args.memory else throughput
    report = mode(args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
