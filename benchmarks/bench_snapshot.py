"""Initial snapshot: rows/s of ``initial-snapshot: true`` into Spark change-log tables and Kafka,
next to a raw KvScan read of the same ranges in the same run.

    .venv/bin/python -m benchmarks.bench_snapshot [--rows 200000] [--regions 16]
        [--masters local[1] local[2]] [--sinks spark kafka] [--readers 1 2]
        [--range-keys 0] [--page-size 2048] [--read-ahead on off]

The issue's figure is ``--rows 1000000`` (a few minutes per run on two cores; the default
of 200,000 keeps ``make bench`` short).

Before anything is measured, ``--rows`` rows are written into ``shop.orders`` of a
playground with ``Playground.bulk_load`` (a physical import: no transactions, no change
feed), and its regions split so that there are about ``--regions`` of them (the table's
parts to read in parallel). Nothing writes to the playground afterwards. Then, in the same
run, on the same rows:

* **raw read** — the baseline: the plan's ranges (``snapshot_ranges``, as the tikv source
  plans them: one per region, or ``--range-keys`` keys each) read with the snapshot's own
  ``TiKVSnapshotTask.read()`` (``SnapshotReader``'s KvScan pages at T → the event store's
  record batches), by ``--readers`` worker processes taking ranges from a queue: no Spark,
  no Parquet, no sink. The workers are started and import everything first; the time runs
  from the first range handed out to the last one read.
* **snapshot** — per sink (``spark``: ``spark://?mode=changelog``, the change-log tables
  under the lake; ``kafka``: Open Protocol to librdkafka's mock cluster, lz4) and per
  Spark master (``local[1]``, ``local[2]``, ``spark://…``), a fresh ``cdcflow run``
  capture process with a changefeed at T = now and ``initial-snapshot: true``. From the
  changefeed's ``snapshot/`` directory and its log, the bench takes:

  - **start-up** — process start until the snapshot's read starts (the capture's first
    "initial snapshot at T: … to read" log line): the capture's start, the maintainer
    placing the spans and the plan (made on the capture's event loop; ``plan_s`` is when
    ``plan.pkl`` was written). While Spark's session and Python workers start, the
    capture reads parts itself (``ReadAhead``; ``rows_read_on_capture``), so what is left
    of Spark's start is inside the snapshot's time;
  - **snapshot** — from that line until ``snapshot/done`` (its ``finished_at``: every
    sink committed the snapshot's batch), split into **read** (until the last part's
    file is there) and **deliver** (mount + sink writes + commit);
  - the **rate** — rows / snapshot seconds; ``with_startup`` is rows / (plan written →
    done), which also counts Spark's session start; ``done_s`` is when the snapshot was
    done, from the process's start (what a user waits).

  - **cores** — what each kind of process spent, in cores (CPU-seconds / wall seconds),
    during the start-up, the read and the delivery (:mod:`benchmarks.cputime`: the
    capture's driver, Spark's Python workers, the JVM's threads, and ``playground``:
    this process, serving the KvScans). On a 2-core machine a total near 2 says the
    run is bound by the cores, and the kinds say by whose work.

  After ``done`` the capture is stopped and the sink is counted: the change log's
  ``batch_id=-1`` partitions read back with pyarrow (``op`` insert), or every Open
  Protocol row event of the topic read back with a consumer. A run whose sink does not
  hold exactly the rows at T is reported as failed, without a rate.

Printed: rows/s of each, the ratio to the raw read with as many readers as the master has
cores (``local[N]`` ↔ N readers; target ≥ 0.5) and ``local[2]``/``local[1]`` per sink
(target ≥ 1.6). ``--read-ahead on off`` runs each sink and master twice, with the capture
reading parts while Spark starts and without (``server.spark.snapshot-read-ahead``); the
scaling is taken over the runs of the first value given.

And what bounds those figures, from the same cores (the Kafka runs' topic counter, this
benchmark's consumer, is shown as ``topic_counter`` and left out of the sums):

* ``raw_read_N_cpu_us_per_row`` — the raw read's CPU per row, its readers' and the
  playground's (``raw_read_N_cores``);
* per run, ``cpu_us_per_row`` — the snapshot's, from its read's start to done, every
  process of the capture and the playground (``cores_snapshot``: the cores that took on
  average), and ``deliver_task_cpu_us_per_row``, the delivery's Spark tasks alone;
* ``over_raw_read_all_cores_busy`` — the ratio to the raw read the run would have at its
  CPU per row with every core of the machine busy: when it is below the target, so is
  any run on this machine short of less work per row;
* ``<sink>_scaling_bound`` — the machine's cores over those the first master's run
  used: the most any master gains over it here at the same CPU per row.

Which side is which: the playground (PD, the TiKV stores' KvScan, the TiDB status API) runs
**in this process**, on its own event-loop thread, behind real gRPC/HTTP on 127.0.0.1 — it
is the upstream, not measured, but it has one GIL: every KvScan page of every reader is
served by it. The measured side is the capture process, its Spark JVM and Spark's Python
workers (raw read: the reader processes). Both sides share the machine's cores; the raw
read with 1 and 2 readers shows how far the playground's serving scales (if 2 readers
barely beat 1, the upstream is the bound and no master can scale past it).

What bounds the rate (``py-spy record --subprocesses`` over a ``--rows 100000`` run, and the
snapshot's read timed twice in one Spark session; figures on two shared, heavily loaded
cores, so indicative only):

* the read is the capture's first Spark job with Python tasks: its first parts wait for
  Spark's Python workers to start (the daemon, PySpark imported from its zip, then cdcflow,
  gRPC and pyarrow in each worker). The same 100,000-row read took 17.2 s in a fresh session
  and 3.7 s in the next one, against 2.2 s for the raw read with 2 readers — warm, the read
  runs at ~0.6 of the raw read; ``first_part_read_s`` shows the wait in each run;
* the delivery (mount with the schema at T, encode, write in tasks, commit) costs more per
  row than the read itself: decoding rowcodec values and building each row's images in
  Python is per-row work the raw read does not do (it stops at the raw record), so the
  snapshot's rate stays well below the raw read's whatever the parallelism;
* the upstream: the playground's KvScan serving took a small share of the samples (the
  bulk load dominates its process), and 2 raw readers gave 1.25× one — on this machine the
  cores, shared with everything else, bound both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks import cputime
from cdcflow.core.data.events import Span
from cdcflow.core.data.pipeline.session import local_task_slots
from cdcflow.core.data.pipeline.snapshot import InitialSnapshot
from cdcflow.core.data.source import SnapshotTask
from cdcflow.plugins.sinks.kafka.mock import MockCluster, mock_cluster
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.snapshot import DEFAULT_PAGE_SIZE
from cdcflow.plugins.sources.tikv.snapshot_task import RangeScanTask, TiKVSnapshotTask, snapshot_ranges
from cdcflow.plugins.sources.tikv.tidb.keys import table_record_span
from tests.e2e.e2e_kafka import CDCFLOW, CHANGEFEED, TABLES, CaptureProcess

#: The cores this benchmark's processes share (the playground's, the capture's, Spark's).
MACHINE_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
#: The table the rows are loaded into.
LOADED = "orders"
PARTITIONS = 8
#: A run whose snapshot is not done by then is reported as failed.
_TIMEOUT_S = 1800.0
_POLL_S = 0.05
_READ_LINE = re.compile(r"^(\S+ \S+) INFO \S+: changefeed \S+: initial snapshot at (\d+): (\d+) \w+s, ")
#: How the line ends when the capture reads parts itself while Spark starts (the read's start).
_READ_AHEAD_END = "read here until Spark's workers are up"
#: The read-ahead's last line: parts and rows it read.
_AHEAD_DONE = re.compile(
    r"snapshot at \d+: (\d+) \w+s, (\d+) rows read here(?: by \d+ readers)? in ([\d.]+)s while Spark started"
)


# -- the upstream ------------------------------------------------------------------------------


def fill(rows: int, regions: int) -> tuple[Playground, int, float]:
    """A playground with ``rows`` rows bulk-loaded into shop.orders, cut into about
    ``regions`` regions: (playground, rows of every shop table, seconds the load took)."""
    # Regions split at their middle key past split_keys: between rows/split and 2·rows/split of them.
    split = max(1, (2 * rows) // (2 * regions - 1)) if regions > 1 else 0
    pg = Playground(stores=3, seed=5, ddl_every=0, split_keys=split, split_bytes=0)
    pg.start()
    began = time.perf_counter()
    pg.bulk_load(LOADED, rows)
    load_s = time.perf_counter() - began
    at = pg.now()
    # The loaded table is counted by the load; the others (tiny) by the playground's own read.
    total = rows + sum(len(pg.snapshot(t, at)) for t in TABLES if t != LOADED)
    return pg, total, load_s


def spans_of(pg: Playground) -> dict[int, Span]:
    """The record spans of the shop tables, as the tikv source cuts them (event-store ids 1..)."""
    out = {}
    for n, table in enumerate(TABLES, start=1):
        tid = pg.table_id(table)
        out[n] = Span(tid, *table_record_span(tid))
    return out


# -- the raw read ------------------------------------------------------------------------------


def _read_one(task: SnapshotTask) -> int:
    return sum(batch.num_rows for batch in task.read())


def _warm(task: SnapshotTask) -> None:
    """A reader process's start: one read of an empty range (imports, gRPC, PD, KvScan)."""
    _read_one(task)


def plan(pg: Playground, ts: int, range_keys: int, page_size: int) -> tuple[list[TiKVSnapshotTask], float]:
    """The snapshot's parts at ``ts`` as the tikv source plans them, and the seconds it took."""

    async def run() -> tuple[list[TiKVSnapshotTask], float]:
        pd = PDClient([pg.pd_address])
        await pd.connect()
        try:
            spans = spans_of(pg)
            began = time.perf_counter()
            ranges = await snapshot_ranges(pd, spans, ts, range_keys=range_keys)
            took = time.perf_counter() - began
        finally:
            await pd.close()
        scan = RangeScanTask((pg.pd_address,), ts, spans, page_size=page_size)
        return [TiKVSnapshotTask(scan, r) for r in ranges], took

    return asyncio.run(run())


def raw_read(tasks: Sequence[TiKVSnapshotTask], readers: int) -> tuple[int, float, dict[str, float]]:
    """(rows, seconds, cores) of ``tasks`` read by ``readers`` worker processes taking them
    in order; ``cores``: what the readers and this process (the playground serving the
    KvScans) spent during the read, in cores, with ``total``."""
    first = tasks[0]
    empty = TiKVSnapshotTask(first.scan, dataclasses.replace(first.range, end=first.range.start))
    context = multiprocessing.get_context("spawn")  # no fork of the playground's threads
    with context.Pool(readers, initializer=_warm, initargs=(empty,)) as pool:
        pool.map(_read_one, [empty] * readers, chunksize=1)  # every reader started and warm
        pids = [proc.pid for proc in pool._pool]  # type: ignore[attr-defined]
        before = {"readers": cputime.process_cpu(pids), "playground": _own_cpu()}
        began = time.perf_counter()
        rows = sum(pool.imap_unordered(_read_one, tasks, chunksize=1))
        seconds = time.perf_counter() - began
        after = {"readers": cputime.process_cpu(pids), "playground": _own_cpu()}
        return rows, seconds, cputime.spent(before, after, seconds)


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


# -- a snapshot run ----------------------------------------------------------------------------


class SnapshotCapture(CaptureProcess):
    """``cdcflow --log-level info run FILE``: the snapshot's start is an INFO line."""

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [CDCFLOW, "--log-level", "info", "run", str(self.file)],
                cwd=self.tmp,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def snapshot_run(
    pg: Playground,
    cluster: MockCluster,
    sink: str,
    master: str,
    expected: int,
    range_keys: int,
    page_size: int,
    read_ahead: bool = True,
    class_cache: bool = True,
) -> dict[str, Any]:
    topic = f"bench-snapshot-{uuid.uuid4().hex[:8]}"
    counter = None
    if sink == "kafka":
        cluster.create_topic(topic, PARTITIONS, 3)
        counter = TopicCounter(cluster.bootstrap_servers, topic)
    with tempfile.TemporaryDirectory() as tmp:
        start_ts = pg.now()
        capture = SnapshotCapture(
            Path(tmp), pg, cluster.bootstrap_servers, topic, start_ts, partitions=PARTITIONS, master=master
        )
        _configure(capture, sink, range_keys, page_size, read_ahead, class_cache)
        snapshot = InitialSnapshot(Path(tmp) / "data" / "changefeeds" / CHANGEFEED, CHANGEFEED, start_ts)
        started_wall = time.time()
        capture.start()
        assert capture.proc is not None
        others = {"topic_counter": counter.pid} if counter is not None else {}
        cpu = cputime.CpuMeter(capture.proc.pid, others=others)
        cpu.mark("start")
        try:
            times = _watch(capture, snapshot, started_wall, cpu)
        finally:
            capture.stop()
        ahead = _AHEAD_DONE.search(capture.log.read_text(errors="replace"))
        times["ahead_rows"] = int(ahead.group(2)) if ahead else 0
        found = _count_spark(Path(tmp) / "lake") if counter is None else counter.result()
    run: dict[str, Any] = {"sink": sink, "master": master, "read_ahead": read_ahead, "class_cache": class_cache}
    run["parts"] = times.pop("parts")
    if found != expected:
        run["failed"] = f"the sink holds {found} rows of the snapshot, not {expected}"
        return run
    snapshot_s = times["done"] - times["read"]
    run.update(
        {
            "startup_s": round(times["read"], 1),
            "plan_written_s": round(times["plan"], 1),
            "read_s": round(times["parts_read"] - times["read"], 1),
            "first_part_read_s": round(times["first_part"] - times["read"], 1),
            "deliver_s": round(times["done"] - times["parts_read"], 1),
            "snapshot_s": round(snapshot_s, 1),
            "rows_per_s": round(expected / snapshot_s),
            "with_startup_rows_per_s": round(expected / (times["done"] - times["plan"])),
            "done_s": round(times["done"], 1),
            "rows_read_on_capture": times["ahead_rows"],
            "cores_startup": cpu.cores("start", "read"),
            "cores_read": cpu.cores("read", "parts_read"),
            "cores_deliver": cpu.cores("parts_read", "done"),
        }
    )
    # What the snapshot cost, without the topic counter (this benchmark's consumer, not
    # the product): CPU per row of the whole snapshot (the playground's serving
    # included, as in the raw read's), and of the delivery's tasks alone.
    whole = cpu.cores("read", "done")
    own = whole.get("total", 0.0) - whole.get("topic_counter", 0.0)
    run["cores_snapshot"] = round(own, 2)
    run["cpu_us_per_row"] = round(own * snapshot_s / expected * 1e6, 2)
    tasks = run["cores_deliver"].get("python_tasks", 0.0) * (times["done"] - times["parts_read"])
    run["deliver_task_cpu_us_per_row"] = round(tasks / expected * 1e6, 2)
    return run


def _configure(
    capture: CaptureProcess, sink: str, range_keys: int, page_size: int, read_ahead: bool, class_cache: bool
) -> None:
    doc = yaml.safe_load(capture.file.read_text())
    connector = doc["connectors"][0]
    connector["initial-snapshot"] = True
    connector["source"]["snapshot-range-keys"] = range_keys
    connector["source"]["snapshot-page-size"] = page_size
    connector["scheduler"]["max-adds-per-tick"] = 0  # every span at once
    if sink == "spark":
        connector["sinks"] = [{"uri": "spark://?mode=changelog"}]
    doc["server"]["metrics"] = False
    doc["server"].setdefault("spark", {})["snapshot-read-ahead"] = read_ahead
    doc["server"]["spark"]["class-cache"] = class_cache
    capture.file.write_text(yaml.safe_dump(doc))


def _watch(
    capture: CaptureProcess, snapshot: InitialSnapshot, started_wall: float, cpu: cputime.CpuMeter
) -> dict[str, Any]:
    """Seconds from the process start to: plan written, read started, every part read, done;
    ``cpu`` marked at each of the last three as it is seen."""
    times: dict[str, Any] = {}
    parts = 0
    while True:
        now = time.time()
        if "plan" not in times:
            with contextlib.suppress(FileNotFoundError):
                times["plan"] = (snapshot.directory / "plan.pkl").stat().st_mtime - started_wall
        if "read" not in times:
            found = _read_line(capture.log)
            if found is not None:
                times["read"], parts = found[0] - started_wall, found[1]
                cpu.mark("read")
        if "read" in times:
            done_parts = len(snapshot.parts_done())
            if "first_part" not in times and done_parts:
                times["first_part"] = now - started_wall
            if "parts_read" not in times and parts and done_parts >= parts:
                times["parts_read"] = now - started_wall
                cpu.mark("parts_read")
        if snapshot.done:
            cpu.mark("done")  # parts deleted between two polls: no parts_read mark, no read or delivery cores
            done = json.loads((snapshot.directory / "done").read_text())
            times["done"] = float(done["finished_at"]) - started_wall
            times.setdefault("parts_read", times["done"])  # parts deleted between two polls
            times.setdefault("first_part", times["parts_read"])
            times["parts"] = parts
            if "read" not in times or "plan" not in times:
                raise RuntimeError(f"the snapshot is done but its start was not seen: see {capture.log}")
            return times
        if not capture.alive() or now - started_wall > _TIMEOUT_S:
            raise RuntimeError(f"the snapshot did not finish: see {capture.log}\n{capture.log_tail()}")
        time.sleep(_POLL_S)


def _read_line(log: Path) -> tuple[float, int] | None:
    """(wall time, parts) of the capture's "initial snapshot at T: N parts … to read" line."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        match = _READ_LINE.match(line)
        if match and (line.endswith("to read") or line.endswith(_READ_AHEAD_END)):
            stamp, _, millis = match.group(1).partition(",")
            at = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis or 0) / 1000
            return at, int(match.group(3))
    return None


def _count_spark(lake: Path) -> int:
    """Inserts in the change logs' snapshot batch (``batch_id=-1``) of every shop table."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    rows = 0
    for table in TABLES:
        root = lake / "shop" / table / "changelog"
        if not root.exists():
            continue
        data = ds.dataset(str(root), format="parquet", partitioning="hive").to_table(columns=["op", "batch_id"])
        snapshot = data.filter(pc.equal(data["batch_id"], -1))
        ops = set(snapshot["op"].to_pylist())
        if ops - {"insert"}:
            raise RuntimeError(f"shop.{table}: the snapshot batch holds ops {ops}")
        rows += snapshot.num_rows
    return rows


class TopicCounter:
    """Counts the row events (Open Protocol ``t`` = 1, keys decoded only) of every partition
    of a topic, in a process of its own that consumes while the capture produces: the mock
    cluster keeps only the last few MiB of a partition, so the topic cannot be read whole
    afterwards. A message missed (an offset skipped: trimmed before it was read) fails it."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._out: Any = context.Queue()
        self._proc = context.Process(target=_count_topic, args=(bootstrap, topic, self._stop, self._out), daemon=True)
        self._proc.start()

    @property
    def pid(self) -> int:
        """The counting process's pid."""
        assert self._proc.pid is not None
        return self._proc.pid

    def result(self, timeout: float = 120.0) -> int:
        self._stop.set()
        rows, missed = self._out.get(timeout=timeout)
        self._proc.join(timeout)
        if missed:
            raise RuntimeError(f"the topic counter missed {missed} messages (trimmed by the mock cluster first)")
        return int(rows)


#: How a row event's key ends (Go's field order: ``t`` last but for ``ohk``); a DDL's
#: ``t`` is 2 and a resolved event's 3. Cheaper than decoding each key.
_ROW_KEY_ENDS = (b',"t":1}', b',"t":1,"ohk":true}')


def _count_topic(bootstrap: str, topic: str, stop: Any, out: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from cdcflow.core.testing.open_protocol import frames

    # The counter must keep within the mock cluster's few MiB per partition of the
    # producers (a table's rows all go to one partition): run ahead of them when allowed.
    with contextlib.suppress(OSError):
        os.nice(-10)

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count-{topic}",
            "enable.auto.commit": False,
            # Fetch as soon as anything is there, as much as is there: a partition's
            # oldest messages are trimmed a few MiB behind the producers.
            "fetch.wait.max.ms": 10,
            "max.partition.fetch.bytes": 64 << 20,
            "fetch.max.bytes": 256 << 20,
            "queued.max.messages.kbytes": 1 << 20,
        }
    )
    partitions = sorted(consumer.list_topics(topic, timeout=60).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    following = dict.fromkeys(partitions, 0)
    rows = missed = 0
    while True:
        batch = consumer.consume(10_000, 0.05)
        for msg in batch:
            if msg.error() is not None:
                continue
            partition, offset, key = msg.partition(), msg.offset(), msg.key()
            missed += offset - following[partition]
            following[partition] = offset + 1
            if key is not None:
                rows += sum(1 for k in frames(key[8:]) if k.endswith(_ROW_KEY_ENDS))
        if not batch and stop.is_set():
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
            if all(following[p] >= end for p, end in ends.items()):
                break
    consumer.close()
    out.put((rows, missed))


# -- main --------------------------------------------------------------------------------------


#: A capture's Spark session, started and stopped (see :func:`prime_class_cache`).
_PRIME = """
import sys
from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session
spark = spark_session(SparkSettings(master=sys.argv[1]))
spark.range(1).count()
stop_spark_session()
"""


def prime_class_cache(masters: Sequence[str]) -> float:
    """Seconds to start and stop a capture's Spark session twice, so that Spark's class
    archive (``server.spark.class-cache``) exists before the runs with it: the first JVM
    writes it at exit, the next start checks it. The runs then measure a machine that
    has run a capture before, not the one start that writes the archive."""
    local = [m for m in masters if m.startswith("local")]
    began = time.perf_counter()
    for _ in range(2 if local else 0):
        # Returns once the JVM exited (it holds the pipes), so its archive is written.
        subprocess.run([sys.executable, "-c", _PRIME, local[0]], capture_output=True, check=True, timeout=600)
    return round(time.perf_counter() - began, 1)


def raw_reads(
    tasks: Sequence[TiKVSnapshotTask], counts: Sequence[int], expected: int, report: dict[str, Any]
) -> dict[int, float]:
    """Rows/s of the raw read with each count of readers, its figures added to ``report``."""
    raw: dict[int, float] = {}
    for readers in counts:
        rows, seconds, cores = raw_read(tasks, readers)
        if rows != expected:
            raise RuntimeError(f"the raw read of {len(tasks)} parts gave {rows} rows, not {expected}")
        raw[readers] = rows / seconds
        report[f"raw_read_{readers}_rows_per_s"] = round(raw[readers])
        report[f"raw_read_{readers}_cores"] = cores
        report[f"raw_read_{readers}_cpu_us_per_row"] = round(cores.get("total", 0.0) * seconds / rows * 1e6, 2)
    if len(raw) >= 2:
        report["raw_read_scaling"] = round(raw[max(raw)] / raw[min(raw)], 2)
    return raw


def scaling(sink: str, runs: Sequence[dict[str, Any]], read_ahead: bool, class_cache: bool) -> dict[str, float]:
    """``sink``'s last master's rate over its first's (runs with the first values given of
    the read-ahead and class-cache options), and the most it could be on this machine:
    the cores the first run left idle, at its CPU per row (``scaling_bound``)."""
    ran = [
        r
        for r in runs
        if r["sink"] == sink and r["read_ahead"] == read_ahead and r["class_cache"] == class_cache and "rows_per_s" in r
    ]
    out: dict[str, float] = {}
    if len(ran) >= 2:
        out[f"{sink}_scaling_last_over_first"] = round(ran[-1]["rows_per_s"] / ran[0]["rows_per_s"], 2)
    if ran and ran[0]["cores_snapshot"] > 0:
        out[f"{sink}_scaling_bound"] = round(MACHINE_CORES / ran[0]["cores_snapshot"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="rows bulk-loaded into shop.orders (issue: 1000000)")
    parser.add_argument("--regions", type=int, default=16, help="about this many regions hold them")
    parser.add_argument(
        "--masters", nargs="+", default=["local[1]", "local[2]"], help="Spark masters of the snapshot runs"
    )
    parser.add_argument(
        "--sinks", nargs="+", choices=("spark", "kafka"), default=["spark", "kafka"], help="sinks of the snapshot runs"
    )
    parser.add_argument("--readers", nargs="+", type=int, default=[1, 2], help="reader processes of the raw read")
    parser.add_argument(
        "--range-keys", type=int, default=0, help="the source's snapshot-range-keys (0: one part per region)"
    )
    parser.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE, help="the source's snapshot-page-size")
    parser.add_argument(
        "--read-ahead",
        nargs="+",
        choices=("on", "off"),
        default=["on"],
        help="server.spark.snapshot-read-ahead of the snapshot runs (on off: both, in this run)",
    )
    parser.add_argument(
        "--class-cache",
        nargs="+",
        choices=("on", "off"),
        default=["on"],
        help="server.spark.class-cache of the snapshot runs (on off: both, in this run)",
    )
    args = parser.parse_args()
    if args.rows < 1 or args.regions < 1 or min(args.readers) < 1:
        parser.error("--rows, --regions and --readers must be at least 1")

    cluster = mock_cluster(3)
    pg, expected, load_s = fill(args.rows, args.regions)
    report: dict[str, Any] = {"rows": expected, "load_s": round(load_s, 1), "regions": len(pg.regions())}
    try:
        tasks, plan_s = plan(pg, pg.now(), args.range_keys, args.page_size)
        report["parts"], report["plan_s"] = len(tasks), round(plan_s, 3)
        raw = raw_reads(tasks, args.readers, expected, report)
        if "on" in args.class_cache:
            report["class_cache_prime_s"] = prime_class_cache(args.masters)
        runs = []
        for sink, master, ahead, cache in itertools.product(
            args.sinks, args.masters, args.read_ahead, args.class_cache
        ):
            run = snapshot_run(
                pg, cluster, sink, master, expected, args.range_keys, args.page_size, ahead == "on", cache == "on"
            )
            if "rows_per_s" in run:
                cores = local_task_slots(master) if master.startswith("local[") else None
                baseline = raw.get(cores, raw[min(raw)]) if cores else raw[max(raw)]
                run["over_raw_read"] = round(run["rows_per_s"] / baseline, 3)
                # The most it could reach at its CPU per row, every core of the machine busy.
                if run["cpu_us_per_row"] > 0:
                    best = MACHINE_CORES / run["cpu_us_per_row"] * 1e6
                    run["over_raw_read_all_cores_busy"] = round(best / baseline, 3)
            runs.append(run)
            print(json.dumps(run), flush=True)
        report["runs"] = runs
        for sink in args.sinks:
            report.update(scaling(sink, runs, args.read_ahead[0] == "on", args.class_cache[0] == "on"))
    finally:
        pg.stop()
    print(json.dumps(report, indent=2))
    if any("failed" in run for run in report.get("runs", [])):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
