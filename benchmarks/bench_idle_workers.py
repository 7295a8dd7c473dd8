"""The first Spark job after a quiet spell, with and without the keeper of the Python workers.

Run:  .venv/bin/python -m benchmarks.bench_idle_workers [--idle SECONDS] [--master local[2]]

Spark ends an executor's idle Python workers once it has run no Python task for a
minute. A changefeed without new rows runs no Spark job, so the first batch of a
burst after a quiet minute forks new workers and imports the task modules in them
again. This benchmark measures that first job — one task per core, each importing
the modules a pipeline's tasks import (:func:`worker_modules`), what any batch's
tasks do first — in one Spark session, in this order:

* warm: right after the workers were started and warmed (the baseline);
* cold: after ``--idle`` seconds without any job (workers ended by Spark);
* kept: after ``--idle`` seconds with :class:`WorkerKeeper` running at the default
  ``server.spark.keep-workers`` interval.

Each is reported in seconds and as a ratio to warm, with the worker process ids:
new ids after the quiet spell mean Spark started new workers.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from cdcflow.core.config.settings import DEFAULT_KEEP_WORKERS, SparkSettings
from cdcflow.core.data.pipeline.session import (
    WorkerKeeper,
    spark_session,
    stop_spark_session,
    warm_python_workers,
    worker_modules,
)
from cdcflow.core.plugin.manager import PluginManager


def _task(modules: list[str], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import importlib

    for name in modules:
        importlib.import_module(name)
    time.sleep(0.2)  # the tasks overlap: each runs in a worker of its own
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()] * batch.num_rows})


def first_job(session: Any, modules: list[str]) -> tuple[float, list[int]]:
    cores = int(session.sparkContext.defaultParallelism)
    job = session.range(cores, numPartitions=cores).mapInArrow(lambda b: _task(modules, b), "pid long")
    started = time.perf_counter()
    pids = sorted(row.pid for row in job.collect())
    return time.perf_counter() - started, pids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=float, default=75.0, help="seconds of quiet before a measured job (> 60)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    session = spark_session(SparkSettings(master=args.master))
    modules = worker_modules(PluginManager.default())
    try:
        warm_python_workers(session, modules)
        first_job(session, modules)  # the job's own code path, once
        warm, warm_pids = first_job(session, modules)
        print(f"warm:  {warm:6.2f} s  workers {warm_pids}", flush=True)

        time.sleep(args.idle)
        cold, cold_pids = first_job(session, modules)
        print(f"cold:  {cold:6.2f} s  workers {cold_pids}  ({cold / warm:.1f}x warm) after {args.idle:.0f}s idle")

        keeper = WorkerKeeper(session, modules, DEFAULT_KEEP_WORKERS)
        _, before = first_job(session, modules)
        keeper.start()
        try:
            time.sleep(args.idle)
            kept, kept_pids = first_job(session, modules)
        finally:
            keeper.stop()
        print(
            f"kept:  {kept:6.2f} s  workers {kept_pids}  ({kept / warm:.1f}x warm) after {args.idle:.0f}s "
            f"with the keeper every {DEFAULT_KEEP_WORKERS:.0f}s ({keeper.runs} keeping jobs; "
            f"{'the same' if kept_pids == before else 'not the same'} workers as before the quiet spell)"
        )
    finally:
        stop_spark_session()


if __name__ == "__main__":
    main()
