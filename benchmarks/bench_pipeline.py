"""Benchmark: rows/s through the pipeline, next to a plain Spark write of the same rows.

    .venv/bin/python benchmarks/bench_pipeline.py [--rows 200000] [--txn-rows 1000]
    .venv/bin/python benchmarks/bench_pipeline.py --memory [--rows 1000000] [--quota 64MiB]

Throughput mode, in one process and one SparkSession (local[2]):

* **baseline** — the same rows as an Arrow table → ``spark.createDataFrame`` →
  Parquet (a plain Spark DataFrame write);
* **pipeline** — a generating source → span executor → event store (resolved
  chunks) → the ``cdcflow`` streaming query → foreachBatch → a counting sink
  that checks the order; timed from the first add_span to the checkpoint
  reaching the last resolved ts.

Both paths are warmed up first. It prints both rates and their ratio. Memory mode replicates ONE transaction
of ``--rows`` rows with a reduced memory quota and reports the capture
process's peak RSS (VmHWM) against its RSS before the transaction (the fixed
overhead: interpreter, PySpark, pyarrow), next to the quota; the JVM's and
the Python workers' peaks are reported separately.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.config.units import parse_bytes
from cdcflow.core.data.events import (
    MicroBatch,
    OpType,
    ResolvedEvent,
    RowChange,
    SourceEvent,
    Span,
    TableName,
    TableSchema,
)
from cdcflow.core.data.pipeline.session import spark_session
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.sink import Sink
from cdcflow.core.data.source import Source
from cdcflow.core.data.transform import TransformChain
from cdcflow.core.plugin import PluginConfig

TABLE = TableName("bench", "orders", table_id=42)
SPAN = Span(42, b"t42", b"t42~")
START_TS = 100


class GeneratedConfig(PluginConfig):
    rows: int = Field(200_000, description="Rows in total.")
    txn_rows: int = Field(1_000, description="Rows per transaction.")


class GeneratedSource(Source[GeneratedConfig]):
    """Rows generated on the fly (nothing held in memory), one resolved ts per transaction."""

    type_name = "bench-generated"
    Config = GeneratedConfig

    async def list_tables(self) -> Sequence[TableName]:
        return [TABLE]

    async def spans_for(self, table: TableName) -> Sequence[Span]:
        return [SPAN]

    async def table_schema(self, table: TableName, ts: int) -> TableSchema:
        return TableSchema(table, ())

    def final_ts(self) -> int:
        txns = -(-self.config.rows // self.config.txn_rows)
        return START_TS + txns * 10 + 1

    async def feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        for n in range(self.config.rows):
            commit = START_TS + (n // self.config.txn_rows + 1) * 10
            yield RowChange(TABLE, OpType.INSERT, commit, commit - 5, row(n), None, None, b"r%09d" % n)
            if n % 4096 == 0:
                await asyncio.sleep(0)
            if (n + 1) % self.config.txn_rows == 0 or n + 1 == self.config.rows:
                yield ResolvedEvent(span, commit + 1)


def row(n: int) -> dict[str, Any]:
    return {"id": n, "customer": n % 977, "amount": n * 3 % 10_000, "note": f"order-{n:09d}"}


class CountingSink(Sink[PluginConfig]):
    """Counts rows and checks their order; keeps nothing (accepts partial batches)."""

    type_name = "bench-counting"
    Config = PluginConfig
    accepts_partial_batches = True

    def __init__(self) -> None:
        super().__init__(PluginConfig())
        self.rows = 0
        self.last: tuple[int, int, bytes] = (0, 0, b"")

    def write_batch(self, batch: MicroBatch) -> None:
        for r in batch.rows:
            key = r.sort_key()
            if key < self.last:
                raise AssertionError(f"rows out of order: {key} after {self.last}")
            self.last = key
        self.rows += len(batch.rows)


async def run_pipeline(
    spark: Any,
    data_dir: Path,
    rows: int,
    txn_rows: int,
    quota: int,
    settings: SparkSettings,
    transforms: TransformChain | None = None,
) -> tuple[float, CountingSink]:
    source = GeneratedSource(GeneratedConfig(rows=rows, txn_rows=txn_rows))
    sink = CountingSink()
    executor = PipelineSpanExecutor(
        PipelineContext(
            "bench",
            source,
            [sink],
            data_dir=data_dir,
            start_ts=START_TS,
            memory_quota=quota,
            spark=spark,
            spark_settings=settings,
            transforms=transforms,
        )
    )
    started = time.perf_counter()
    await executor.add_span(SPAN, START_TS, prepare=False)
    while executor.checkpoint_ts < source.final_ts():
        if executor.error() is not None:
            raise RuntimeError(f"pipeline failed: {executor.error()}")
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    await executor.close()
    if sink.rows < rows:
        raise AssertionError(f"{sink.rows} rows delivered, {rows} expected")
    return elapsed, sink


def baseline_write(spark: Any, rows: int, out: Path) -> float:
    import pyarrow as pa

    ids = list(range(rows))
    table = pa.table(
        {
            "commit_ts": [START_TS + (n // 1000 + 1) * 10 for n in ids],
            "key": [b"r%09d" % n for n in ids],
            "id": ids,
            "customer": [n % 977 for n in ids],
            "amount": [n * 3 % 10_000 for n in ids],
            "note": [f"order-{n:09d}" for n in ids],
        }
    )
    started = time.perf_counter()
    spark.createDataFrame(table).write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - started


def proc_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def process_kind(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return "?"
    return "jvm" if b"java" in cmd else "python-worker" if b"pyspark" in cmd or b"python" in cmd else "other"


def throughput(args: argparse.Namespace) -> None:
    settings = SparkSettings(master="local[2]", trigger_interval=0.2)
    spark = spark_session(settings)
    with tempfile.TemporaryDirectory() as tmp:
        # Warm both paths (JVM, Python workers, the data source) so neither pays start-up.
        baseline_write(spark, 10_000, Path(tmp) / "warm-parquet")
        asyncio.run(run_pipeline(spark, Path(tmp) / "warm", 10_000, args.txn_rows, 1024**3, settings))
        base = baseline_write(spark, args.rows, Path(tmp) / "parquet")
        elapsed, sink = asyncio.run(run_pipeline(spark, Path(tmp) / "run", args.rows, args.txn_rows, 1024**3, settings))
    base_rate, pipe_rate = args.rows / base, args.rows / elapsed
    print(f"rows={args.rows} txn_rows={args.txn_rows} master=local[2]")
    print(f"baseline  spark createDataFrame+parquet write: {base:7.2f} s  {base_rate:12,.0f} rows/s")
    print(f"pipeline  source→store→spark→sink:             {elapsed:7.2f} s  {pipe_rate:12,.0f} rows/s")
    print(f"ratio pipeline/baseline: {pipe_rate / base_rate:.3f}  (delivered {sink.rows} rows)")


def memory(args: argparse.Namespace) -> None:
    settings = SparkSettings(master="local[2]", trigger_interval=0.2)
    spark = spark_session(settings)
    with tempfile.TemporaryDirectory() as tmp:
        # Warm up the whole path with a tiny changefeed so the baseline RSS includes
        # everything that is loaded once (workers, pyarrow, the data source).
        asyncio.run(run_pipeline(spark, Path(tmp) / "warm", 1000, 1000, args.quota, settings))
        baseline = proc_kib("self", "VmRSS")
        elapsed, sink = asyncio.run(run_pipeline(spark, Path(tmp) / "big", args.rows, args.rows, args.quota, settings))
        peak = proc_kib("self", "VmHWM")
        others: dict[str, int] = {}
        for pid in descendants(os.getpid()):
            kind = process_kind(pid)
            try:
                others[kind] = max(others.get(kind, 0), proc_kib(pid, "VmHWM"))
            except OSError:
                continue
    quota_kib = args.quota // 1024
    print(f"one transaction of {args.rows} rows, memory quota {quota_kib / 1024:.0f} MiB, {elapsed:.1f} s")
    print(f"capture process: RSS before {baseline / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB, ")
    print(f"  peak - before = {(peak - baseline) / 1024:.0f} MiB (quota {quota_kib / 1024:.0f} MiB)")
    for kind, kib in sorted(others.items()):
        print(f"  largest {kind} child peak: {kib / 1024:.0f} MiB")
    print(f"delivered {sink.rows} rows in order")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--txn-rows", type=int, default=1000)
    parser.add_argument("--memory", action="store_true", help="one huge transaction; report peak RSS")
    parser.add_argument("--quota", type=parse_bytes, default=parse_bytes("64MiB"))
    args = parser.parse_args()
    if args.memory:
        args.rows = args.rows or 1_000_000
        memory(args)
    else:
        args.rows = args.rows or 200_000
        throughput(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
