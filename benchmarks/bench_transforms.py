"""Benchmark: rows/s through the pipeline with a 3-transform chain, next to none, same run.

    .venv/bin/python -m benchmarks.bench_transforms [--rows 100000] [--rounds 2]
    .venv/bin/python -m benchmarks.bench_transforms --source generated [--rows 200000] [--txn-rows 1000]

The default (``--source tikv``) measures the transforms where they run: raw
TiKV events mounted, transformed and written in the Spark tasks. An in-process
playground (one store) holds a backlog of the shop workload committed before
anything reads it; each run is a span executor on the tikv source (EventFeed
over gRPC, every shop table's span at once) whose pipeline (local[2]) mounts
the raw events in Spark tasks, runs the chain there and hands the rows to a
task writer that counts them (no downstream: the rate is the pipeline's) and
checks that every row of a chain run, and none of the others, went through the
chain. Runs alternate none / chain for ``--rounds`` rounds over the same
backlog, each timed from add_span to the checkpoint passing the backlog's last
commit, after one untimed warm-up run; the best of each is reported. The chain
applies to every row of every table: ``filter`` ``id > 0 AND _op != 'noop'``
(keeps them all, so both deliver the same rows), ``project`` adding ``tag =
concat('r-', CAST(id AS string))``, and ``mask`` hashing ``tag``.

``--source generated`` uses the generating source and counting sink of
``bench_pipeline`` instead: its rows come mounted, so the transforms run on the
driver (the path of sources that mount on their own). Both runs are warmed up,
then timed the same way; the chain is ``filter`` (``amount >= 0 AND note LIKE
'order-%'``), ``project`` (rename ``customer`` → ``customer_id``, a computed
``amount_cents``) and ``mask`` (``note``).

Either prints both rates and their ratio (the target: ≥ 0.80).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_pipeline import run_pipeline
from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.events import MicroBatch, RowChange, TableName
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.pipeline.session import spark_session
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.sink import PartitionWriter, Sink, TaskWriter
from cdcflow.core.data.transform import TransformChain, TransformStep
from cdcflow.core.plugin import PluginConfig

#: The pipeline's default memory quota (PipelineContext's).
DEFAULT_QUOTA = 1024**3


def chain() -> TransformChain:
    from cdcflow.plugins.transforms.filter import FilterConfig, FilterTransform
    from cdcflow.plugins.transforms.mask import MaskConfig, MaskTransform
    from cdcflow.plugins.transforms.project import ProjectConfig, ProjectTransform

    os.environ.setdefault("CDCFLOW_MASK_SALT", "bench-salt")
    every = TableFilter(["bench.*"])
    return TransformChain(
        [
            TransformStep("filter", FilterTransform(FilterConfig(where="amount >= 0 AND note LIKE 'order-%'")), every),
            TransformStep(
                "project",
                ProjectTransform(
                    ProjectConfig(
                        rename={"customer": "customer_id"},
                        computed=[{"name": "amount_cents", "expr": "amount * 100", "type": "bigint"}],
                    )
                ),
                every,
            ),
            TransformStep("mask", MaskTransform(MaskConfig(columns=["note"])), every),
        ]
    )


async def run(
    spark: Any, data_dir: Path, rows: int, txn_rows: int, settings: SparkSettings, transforms: TransformChain | None
) -> tuple[float, int]:
    """The generated rows through the pipeline (driver path), with ``transforms`` or none."""
    seconds, sink = await run_pipeline(spark, data_dir, rows, txn_rows, DEFAULT_QUOTA, settings, transforms)
    return seconds, sink.rows


def tikv_chain() -> TransformChain:
    """Three transforms over every row of every shop table."""
    from cdcflow.plugins.transforms.filter import FilterConfig, FilterTransform
    from cdcflow.plugins.transforms.mask import MaskConfig, MaskTransform
    from cdcflow.plugins.transforms.project import ProjectConfig, ProjectTransform

    os.environ.setdefault("CDCFLOW_MASK_SALT", "bench-salt")
    every = TableFilter(["shop.*"])
    tag = {"name": "tag", "expr": "concat('r-', CAST(id AS string))", "type": "varchar(32)"}
    return TransformChain(
        [
            TransformStep("filter", FilterTransform(FilterConfig(where="id > 0 AND _op != 'noop'")), every),
            TransformStep("project", ProjectTransform(ProjectConfig(computed=[tag])), every),
            TransformStep("mask", MaskTransform(MaskConfig(columns=["tag"])), every),
        ]
    )


class _CountingTaskWriter(TaskWriter):
    """Counts each partition's rows into a file of its own (a retried partition overwrites it)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def open(self, batch: MicroBatch, partition: int) -> PartitionWriter:
        return _CountingPartition(Path(self.directory) / f"{batch.batch_id}-{partition}")


class _CountingPartition(PartitionWriter):
    """Counts rows, and those the chain reached (a 64-hex-digit ``tag``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0
        self.tagged = 0

    def write(self, rows: list[RowChange]) -> None:
        self.rows += len(rows)
        self.tagged += sum(1 for r in rows if len(r.image().get("tag") or "") == 64)

    def flush(self) -> None:
        self.path.write_text(f"{self.rows} {self.tagged}")


class TaskCountingSink(Sink[PluginConfig]):
    """Rows counted in the Spark tasks; nothing written anywhere."""

    type_name = "bench-task-counting"
    Config = PluginConfig

    def __init__(self, directory: Path) -> None:
        super().__init__(PluginConfig())
        self.directory = directory
        directory.mkdir(parents=True)

    def task_writer(self, tables: Sequence[TableName]) -> TaskWriter:
        return _CountingTaskWriter(str(self.directory))

    def write_batch(self, batch: MicroBatch) -> None:
        raise AssertionError("rows are written in the tasks")

    def commit_batch(self, batch: MicroBatch) -> None:
        assert not batch.rows

    def counts(self) -> tuple[int, int]:
        """(rows, rows the chain reached), over every partition of every batch."""
        pairs = [p.read_text().split() for p in self.directory.iterdir()]
        return sum(int(r) for r, _ in pairs), sum(int(t) for _, t in pairs)


async def tikv_run(
    spark: Any, pg: Any, data_dir: Path, start_ts: int, last_ts: int, transforms: TransformChain | None
) -> tuple[float, int]:
    from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig

    def source() -> TiKVSource:
        return TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))

    lister = source()
    await lister.open()
    try:
        spans = [span for table in await lister.list_tables() for span in await lister.spans_for(table)]
    finally:
        await lister.close()
    sink = TaskCountingSink(data_dir / "counts")
    executor = PipelineSpanExecutor(
        PipelineContext(
            "bench-tikv",
            source(),
            [sink],
            data_dir=data_dir / "data",
            start_ts=start_ts,
            spark=spark,
            spark_settings=SparkSettings(master="local[2]", trigger_interval=0.2),
            table_filter=TableFilter(["shop.*"]),
            transforms=transforms,
        )
    )
    started = time.perf_counter()
    for span in spans:
        await executor.add_span(span, start_ts, prepare=False)
    while executor.checkpoint_ts < last_ts:
        if executor.error() is not None:
            raise RuntimeError(f"pipeline failed: {executor.error()}")
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    await executor.close()
    rows, tagged = sink.counts()
    if tagged != (rows if transforms else 0):
        raise AssertionError(f"{tagged} of {rows} rows went through the chain")
    return elapsed, rows


def tikv_main(rows: int, rounds: int) -> None:
    from cdcflow.plugins.sources.playground import Playground

    # Spark's JVM before the playground's gRPC threads: the launch forks.
    spark = spark_session(SparkSettings(master="local[2]", trigger_interval=0.2))
    with Playground(stores=1, seed=5, ddl_every=0, split_keys=0) as pg, tempfile.TemporaryDirectory() as tmp:
        start_ts = pg.now()
        pg.run_workload(max(1, round(rows / 6.4)))  # about 6.4 row changes per transaction
        last_ts = pg.now()
        times: dict[str, list[float]] = {"none": [], "chain": []}
        counts: dict[str, set[int]] = {"none": set(), "chain": set()}
        asyncio.run(tikv_run(spark, pg, Path(tmp) / "warm", start_ts, last_ts, tikv_chain()))
        for n in range(rounds):
            for name, transforms in (("none", None), ("chain", tikv_chain())):
                out = Path(tmp) / f"{name}-{n}"
                seconds, count = asyncio.run(tikv_run(spark, pg, out, start_ts, last_ts, transforms))
                times[name].append(seconds)
                counts[name].add(count)
    if len(counts["none"] | counts["chain"]) != 1:
        raise AssertionError(f"the runs delivered different row counts: {counts}")
    (delivered,) = counts["none"]
    plain, chained = min(times["none"]), min(times["chain"])
    print(f"source=tikv rows={delivered} rounds={rounds} master=local[2] (mounted and transformed in Spark tasks)")
    for label, best, name in (("no transforms:", plain, "none"), ("filter + project + mask:", chained, "chain")):
        print(f"{label:28s}{best:7.2f} s  {delivered / best:12,.0f} rows/s   runs: {_runs(times[name])} s")
    print(f"ratio chain/none: {plain / chained:.3f} (target >= 0.80)")


def _runs(seconds: list[float]) -> str:
    return ", ".join(f"{s:.2f}" for s in seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=["tikv", "generated"], default="tikv")
    parser.add_argument("--rows", type=int, default=None, help="rows (generated: 200000; tikv: about 100000)")
    parser.add_argument("--txn-rows", type=int, default=1000, help="generated: rows per transaction")
    parser.add_argument("--rounds", type=int, default=2, help="tikv: timed none/chain rounds")
    args = parser.parse_args()
    if args.source == "tikv":
        tikv_main(args.rows or 100_000, args.rounds)
        return
    rows = args.rows or 200_000
    settings = SparkSettings(master="local[2]", trigger_interval=0.2)
    spark = spark_session(settings)
    with tempfile.TemporaryDirectory() as tmp:
        for name, transforms in (("warm-none", None), ("warm-chain", chain())):
            asyncio.run(run(spark, Path(tmp) / name, 10_000, args.txn_rows, settings, transforms))
        plain, _ = asyncio.run(run(spark, Path(tmp) / "none", rows, args.txn_rows, settings, None))
        chained, _ = asyncio.run(run(spark, Path(tmp) / "chain", rows, args.txn_rows, settings, chain()))
    plain_rate, chain_rate = rows / plain, rows / chained
    print(f"source=generated rows={rows} txn_rows={args.txn_rows} master=local[2] (transformed on the driver)")
    print(f"no transforms:              {plain:7.2f} s  {plain_rate:12,.0f} rows/s")
    print(f"filter + project + mask:    {chained:7.2f} s  {chain_rate:12,.0f} rows/s")
    print(f"ratio chain/none: {chain_rate / plain_rate:.3f} (target >= 0.80)")


if __name__ == "__main__":
    main()
