"""Spark sink throughput next to a plain DataFrame write of the same rows, same session, same run.

    python -m benchmarks.bench_spark_sink [--rows 200000] [--batches 10]

``rows`` inserts (then a round of updates and deletes touching 10 % of the
keys) in ``batches`` micro-batches, through the sink in ``changelog`` and in
``snapshot`` mode, next to the baseline: ``createDataFrame`` of the same
rows and ``write.mode("append").parquet`` per batch, the least any Spark
writer of these rows must do. Ratios (sink / baseline) are what to compare.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from cdcflow.core.data.events import MicroBatch, RowChange
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.testing import delete, insert, update
from cdcflow.plugins.sinks.spark import SparkSink, SparkSinkConfig
from cdcflow.plugins.sinks.spark.session import spark_session


def _changes(rows: int) -> list[RowChange]:
    out = [
        insert("bench", "items", {"id": i, "name": f"item-{i}", "qty": i % 97}, commit_ts=1000 + i) for i in range(rows)
    ]
    ts = 1000 + rows
    for i in range(0, rows, 10):
        before = {"id": i, "name": f"item-{i}", "qty": i % 97}
        if i % 20:
            out.append(update("bench", "items", before, dict(before, qty=-1), commit_ts=ts + i))
        else:
            out.append(delete("bench", "items", before, commit_ts=ts + i))
    return out


def _batches(changes: list[RowChange], count: int) -> list[MicroBatch]:
    size = -(-len(changes) // count)
    return [
        MicroBatch("bench", n, 0, changes[min(i + size, len(changes)) - 1].commit_ts, changes[i : i + size])
        for n, i in enumerate(range(0, len(changes), size))
    ]


def baseline(spark: Any, batches: list[MicroBatch], out: Path) -> float:
    started = time.perf_counter()
    for batch in batches:
        records = [(r.op.value, r.commit_ts, *(r.image()[c] for c in ("id", "name", "qty"))) for r in batch.rows]
        frame = spark.createDataFrame(records, "op string, commit_ts bigint, id bigint, name string, qty bigint")
        frame.write.mode("append").parquet(str(out))
    return sum(len(b) for b in batches) / (time.perf_counter() - started)


def through_sink(batches: list[MicroBatch], root: Path, mode: str) -> float:
    sink = SparkSink(SparkSinkConfig(uri=f"spark://{root}", mode=mode, key_columns={"bench.items": ["id"]}))
    sink.open(SinkContext(f"bench-{mode}"))
    started = time.perf_counter()
    for batch in batches:
        sink.write_batch(batch)
    elapsed = time.perf_counter() - started
    sink.close()
    return sum(len(b) for b in batches) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    batches = _batches(_changes(args.rows), args.batches)
    with tempfile.TemporaryDirectory(prefix="cdcflow-bench-") as tmp:
        root = Path(tmp)
        spark = spark_session("local[*]", str(root / "warehouse"))
        spark.sparkContext.setLogLevel("ERROR")
        baseline(spark, batches[:1], root / "warm")  # JIT and session warm-up, untimed
        results: dict[str, Any] = {"changes": sum(len(b) for b in batches), "batches": len(batches)}
        base = baseline(spark, batches, root / "baseline")
        results["dataframe_append_rows_per_s"] = round(base)
        for mode in ("changelog", "snapshot"):
            rate = through_sink(batches, root / mode, mode)
            results[f"sink_{mode}_rows_per_s"] = round(rate)
            results[f"sink_{mode}_ratio"] = round(rate / base, 3)
        spark.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
