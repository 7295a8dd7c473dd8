"""Spark sink throughput next to a plain DataFrame write of the same rows, same session, same run.

    python -m benchmarks.bench_spark_sink [--rows 200000] [--batches 10]

``rows`` inserts (then a round of updates and deletes touching 10 % of the
keys) in ``batches`` micro-batches, through the sink in ``changelog`` and in
``snapshot`` mode, next to the baseline: ``createDataFrame`` of the same
rows and ``write.mode("append").parquet`` per batch, the least any Spark
writer of these rows must do. Ratios (sink / baseline) are what to compare.

Each mode runs twice: ``sink_*`` through ``write_batch`` (rows converted on the
driver, as the test kit delivers them) and ``frame_*`` through ``write_frame``
(the pipeline's way: the batch's records as a Spark DataFrame, decoded and
written by Spark tasks; the frames are built from the records beforehand,
untimed, as the event store holds them).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdcflow.core.data.events import MicroBatch, RowChange
from cdcflow.core.data.logservice.records import record_from_event, records_to_batch
from cdcflow.core.data.pipeline.tasks import RecordDecoder
from cdcflow.core.data.sink import BatchFrame, SinkContext
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


class _NoSchemas:
    def id_of(self, schema: object) -> int:
        return -1


def _frames(spark: Any, batches: list[MicroBatch]) -> list[tuple[MicroBatch, BatchFrame]]:
    """Each batch's head and its rows as the pipeline hands them to ``write_frame``."""
    out = []
    for batch in batches:
        records = [record_from_event(r, 0, _NoSchemas()) for r in batch.rows]
        frame = spark.createDataFrame(pa.Table.from_batches([records_to_batch(records)]))
        head = MicroBatch(batch.changefeed_id, batch.batch_id, batch.start_ts, batch.end_ts)
        out.append((head, BatchFrame(frame, RecordDecoder({}), len(records))))
    return out


def through_frames(frames: list[tuple[MicroBatch, BatchFrame]], root: Path, mode: str) -> float:
    sink = SparkSink(
        SparkSinkConfig(frame_writes=True, uri=f"spark://{root}", mode=mode, key_columns={"bench.items": ["id"]})
    )
    sink.open(SinkContext(f"bench-frame-{mode}"))
    started = time.perf_counter()
    rows = 0
    for head, frame in frames:
        written = sink.write_frame(head, frame)
        assert written is not None
        rows += written
    elapsed = time.perf_counter() - started
    sink.close()
    return rows / elapsed


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
        frames = _frames(spark, batches)
        through_frames(frames[:1], root / "warm-frames", "both")  # Python workers warm-up, untimed
        for mode in ("changelog", "snapshot"):
            rate = through_sink(batches, root / mode, mode)
            results[f"sink_{mode}_rows_per_s"] = round(rate)
            results[f"sink_{mode}_ratio"] = round(rate / base, 3)
            rate = through_frames(frames, root / f"frame-{mode}", mode)
            results[f"frame_{mode}_rows_per_s"] = round(rate)
            results[f"frame_{mode}_ratio"] = round(rate / base, 3)
        spark.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
