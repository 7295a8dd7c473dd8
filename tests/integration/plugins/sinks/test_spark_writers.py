"""The Spark sink with several writers of one changefeed under one root.

Batch ids only mean something within one writer (see
:mod:`cdcflow.core.data.pipeline.writer`): on a cluster every capture's
pipeline numbers its batches from 0, and a changefeed removed and created
again under the same id starts again at 0. Tables under a shared root (an
object store every capture writes to) must keep every writer's batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.data.events import MicroBatch, RowChange
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.testing import insert
from cdcflow.plugins.sinks.spark import SparkSink, SparkSinkConfig

pytestmark = pytest.mark.integration

#: A TSO on 2026-11-24 (physical ms << 18): every row below is of one commit date.
_TS = (1795520000000 << 18) + 1


def _sink(root: Path, writer: str, *, inherits: bool = False, mode: str = "changelog") -> SparkSink:
    sink = SparkSink(SparkSinkConfig(uri=f"spark://{root}?mode={mode}"))
    sink.open(SinkContext("cf", writer_id=writer, writer_inherits=inherits))
    return sink


def _rows(first_id: int, count: int, ts: int) -> list[RowChange]:
    return [insert("shop", "orders", {"id": i, "qty": i}, commit_ts=ts + i) for i in range(first_id, first_id + count)]


def _batch(batch_id: int, rows: list[RowChange]) -> MicroBatch:
    return MicroBatch("cf", batch_id, rows[0].commit_ts - 1, rows[-1].commit_ts, rows=rows)


def _changelog_ids(spark: Any, root: Path) -> list[int]:
    frame = spark.read.parquet(f"{root}/shop/orders/changelog")
    return sorted(r["after"]["id"] for r in frame.select("after").collect())


def test_two_writers_batches_of_the_same_id_are_both_kept(spark: Any, tmp_path: Path) -> None:
    a, b = _sink(tmp_path, "capture-a"), _sink(tmp_path, "capture-b")
    a.write_batch(_batch(0, _rows(0, 5, _TS)))
    b.write_batch(_batch(0, _rows(100, 5, _TS)))
    assert _changelog_ids(spark, tmp_path) == [*range(5), *range(100, 105)]
    # A replay of one writer's batch rewrites that writer's rows only.
    _sink(tmp_path, "capture-a").write_batch(_batch(0, _rows(0, 5, _TS)))
    assert _changelog_ids(spark, tmp_path) == [*range(5), *range(100, 105)]


def test_a_writer_behind_another_is_not_taken_for_a_replay(spark: Any, tmp_path: Path) -> None:
    _sink(tmp_path, "capture-a").write_batch(_batch(7, _rows(0, 3, _TS + 1000)))
    # The other capture (re)started after that: its batch ends below the first one's.
    _sink(tmp_path, "capture-b").write_batch(_batch(3, _rows(100, 3, _TS)))
    assert _changelog_ids(spark, tmp_path) == [0, 1, 2, 100, 101, 102]
    # Its own replay is still recognised, after a restart too.
    again = _sink(tmp_path, "capture-b")
    again.write_batch(_batch(3, _rows(100, 3, _TS)))
    records = json.loads((tmp_path / "_cdcflow" / "cf" / "writers" / "capture-b.json").read_text())
    assert records["batch-id"] == 3 and records["resolved-ts"] == _TS + 102


def test_a_changefeed_created_again_keeps_the_first_ones_changes(spark: Any, tmp_path: Path) -> None:
    first = _sink(tmp_path, "first-incarnation")
    first.write_batch(_batch(0, _rows(0, 4, _TS)))
    first.write_batch(_batch(1, _rows(4, 4, _TS)))
    # Removed and created again with the same id: a new pipeline directory, batch ids from 0.
    second = _sink(tmp_path, "second-incarnation")
    second.write_batch(_batch(0, _rows(200, 2, _TS)))
    assert _changelog_ids(spark, tmp_path) == [*range(8), 200, 201]


def test_an_upgraded_writer_takes_over_the_checkpoint_and_layout_of_an_earlier_version(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a version without writer ids left: checkpoint.json, a change log without the writer level.
    old = _sink(tmp_path, "")
    monkeypatch.setattr(old, "_changelog_by_writer", lambda path, table: False)
    old.write_batch(_batch(0, _rows(0, 3, _TS)))
    assert (tmp_path / "_cdcflow" / "cf" / "checkpoint.json").exists()
    changelog = tmp_path / "shop" / "orders" / "changelog"
    assert [p.name.split("=")[0] for p in changelog.glob("commit_date=*/*=*")] == ["batch_id"]

    upgraded = _sink(tmp_path, "upgraded", inherits=True)
    # Its replay of batch 0 (Spark replays the batch it had not committed) is skipped: other
    # rows in the same ts range would have replaced the batch's partition.
    replay = [insert("shop", "orders", {"id": 100 + i, "qty": i}, commit_ts=_TS + i) for i in range(3)]
    upgraded.write_batch(_batch(0, replay))
    # ... and its next batch is written in the table's layout, readable in one scan with the others.
    upgraded.write_batch(_batch(1, _rows(3, 3, _TS)))
    assert _changelog_ids(spark, tmp_path) == list(range(6))
    assert {p.name.split("=")[0] for p in changelog.glob("commit_date=*/*=*")} == {"batch_id"}
    # A writer that does not inherit starts from nothing of its own.
    assert _sink(tmp_path, "new")._done_ts == 0


def test_a_new_change_log_is_partitioned_by_writer_and_read_with_its_writer_column(spark: Any, tmp_path: Path) -> None:
    _sink(tmp_path, "").write_batch(_batch(0, _rows(0, 2, _TS)))
    _sink(tmp_path, "capture-a").write_batch(_batch(0, _rows(10, 2, _TS)))
    frame = spark.read.parquet(str(tmp_path / "shop" / "orders" / "changelog"))
    got = sorted((r["writer"], r["batch_id"], r["after"]["id"]) for r in frame.collect())
    assert got == [("capture-a", 0, 10), ("capture-a", 0, 11), ("local", 0, 0), ("local", 0, 1)]


def test_bounded_batches_that_share_an_end_ts_are_all_written(spark: Any, tmp_path: Path) -> None:
    # The backlog of a span that joined behind the others, cut into bounded batches at the
    # ts already published: batches 8 and 9 end where 7 does, and run from it.
    sink = _sink(tmp_path, "capture-a")
    end = _TS + 1000
    first = _rows(0, 3, _TS)
    sink.write_batch(MicroBatch("cf", 7, _TS - 1, end, rows=first))
    sink.write_batch(MicroBatch("cf", 8, end, end, rows=_rows(10, 3, _TS)))
    sink.write_batch(MicroBatch("cf", 9, end, end, rows=_rows(20, 3, _TS)))
    assert _changelog_ids(spark, tmp_path) == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    # A replay of the last one (other rows would have replaced its partition) is still
    # skipped, by this sink and after a restart.
    sink.write_batch(MicroBatch("cf", 9, end, end, rows=_rows(30, 3, _TS)))
    _sink(tmp_path, "capture-a").write_batch(MicroBatch("cf", 9, end, end, rows=_rows(30, 3, _TS)))
    assert _changelog_ids(spark, tmp_path) == [0, 1, 2, 10, 11, 12, 20, 21, 22]


def test_every_snapshot_range_a_capture_delivers_is_written(spark: Any, tmp_path: Path) -> None:
    # Snapshot ranges: each its own negative id, every one ending at the snapshot's ts T.
    sink = _sink(tmp_path, "capture-a")
    ts = _TS + 50
    sink.write_batch(MicroBatch("cf", -1_234_567, ts, ts, rows=_rows(0, 2, ts)))
    sink.write_batch(MicroBatch("cf", -7_654_321, ts, ts, rows=_rows(10, 2, ts)))
    assert _changelog_ids(spark, tmp_path) == [0, 1, 10, 11]
    # A replay of the last one is skipped (other rows would have replaced its partition);
    # an earlier range read again has the same rows, and rewrites its partition with them.
    sink.write_batch(MicroBatch("cf", -7_654_321, ts, ts, rows=_rows(40, 2, ts)))
    sink.write_batch(MicroBatch("cf", -1_234_567, ts, ts, rows=_rows(0, 2, ts)))
    assert _changelog_ids(spark, tmp_path) == [0, 1, 10, 11]
