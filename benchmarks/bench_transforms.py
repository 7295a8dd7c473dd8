"""Benchmark: rows/s through the pipeline with a 3-transform chain, next to none, same run.

    .venv/bin/python -m benchmarks.bench_transforms [--rows 200000] [--txn-rows 1000]

One process, one SparkSession (local[2]), the generating source and counting
sink of ``bench_pipeline``; both runs are warmed up first, then timed from the
first add_span to the checkpoint reaching the last resolved ts:

* **none** — no transforms;
* **chain** — ``filter`` (``amount >= 0 AND note LIKE 'order-%'``, keeps
  every row so both runs deliver the same rows), ``project`` (rename
  ``customer`` → ``customer_id``, a computed ``amount_cents`` column) and
  ``mask`` (salted SHA-256 of ``note``).

It prints both rates and their ratio (the target: ≥ 0.80).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_pipeline import SPAN, START_TS, CountingSink, GeneratedConfig, GeneratedSource
from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.pipeline.session import spark_session
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.transform import TransformChain, TransformStep


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
    source = GeneratedSource(GeneratedConfig(rows=rows, txn_rows=txn_rows))
    sink = CountingSink()
    executor = PipelineSpanExecutor(
        PipelineContext(
            "bench",
            source,
            [sink],
            data_dir=data_dir,
            start_ts=START_TS,
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
    return elapsed, sink.rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--txn-rows", type=int, default=1000)
    args = parser.parse_args()
    settings = SparkSettings(master="local[2]", trigger_interval=0.2)
    spark = spark_session(settings)
    with tempfile.TemporaryDirectory() as tmp:
        for name, transforms in (("warm-none", None), ("warm-chain", chain())):
            asyncio.run(run(spark, Path(tmp) / name, 10_000, args.txn_rows, settings, transforms))
        plain, _ = asyncio.run(run(spark, Path(tmp) / "none", args.rows, args.txn_rows, settings, None))
        chained, _ = asyncio.run(run(spark, Path(tmp) / "chain", args.rows, args.txn_rows, settings, chain()))
    plain_rate, chain_rate = args.rows / plain, args.rows / chained
    print(f"rows={args.rows} txn_rows={args.txn_rows} master=local[2]")
    print(f"no transforms:              {plain:7.2f} s  {plain_rate:12,.0f} rows/s")
    print(f"filter + project + mask:    {chained:7.2f} s  {chain_rate:12,.0f} rows/s")
    print(f"ratio chain/none: {chain_rate / plain_rate:.3f} (target >= 0.80)")


if __name__ == "__main__":
    main()
