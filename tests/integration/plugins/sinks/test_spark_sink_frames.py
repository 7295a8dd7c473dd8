"""The Spark sink written from the batch's Spark frame (``Sink.write_frame``): the same change
logs and snapshots as rows written from the driver, no row converted on the driver, replays
idempotent."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdcflow.core.data.events import MicroBatch, TableName, TableSchema
from cdcflow.core.data.logservice.records import record_from_event, records_to_batch
from cdcflow.core.data.pipeline.tasks import RecordDecoder
from cdcflow.core.data.sink import BatchFrame
from cdcflow.core.testing import ListSource, drive, insert
from cdcflow.plugins.sinks.spark import SparkSink, SparkSinkConfig, Storage, read_snapshot
from cdcflow.plugins.sinks.spark import sink as sink_module
from tests.fixtures.workload import make_workload
from tests.integration.plugins.sinks import test_spark_sink_ddl as ddl_tests

pytestmark = pytest.mark.integration


class _Ids:
    """Schema ids for the records of a test frame (what the event store's registry does)."""

    def __init__(self) -> None:
        self.schemas: dict[int, TableSchema] = {}
        self._ids: dict[TableSchema, int] = {}

    def id_of(self, schema: TableSchema | None) -> int:
        if schema is None:
            return -1
        if schema not in self._ids:
            self._ids[schema] = len(self._ids)
            self.schemas[self._ids[schema]] = schema
        return self._ids[schema]


def batch_frame(spark: Any, batch: MicroBatch, partitions: int = 3, *, one_ts: bool = False) -> BatchFrame:
    """The rows of ``batch`` as the pipeline hands them to ``write_frame``: records, shuffled."""
    ids = _Ids()
    records = [record_from_event(row, 0, ids) for row in batch.rows]
    frame = spark.createDataFrame(pa.Table.from_batches([records_to_batch(records)]))
    return BatchFrame(frame.repartition(partitions), RecordDecoder(ids.schemas), len(records), one_ts)


class FrameSparkSink(SparkSink):
    """Takes each batch with rows through ``write_frame``, as the pipeline does."""

    frames = 0

    def write_batch(self, batch: MicroBatch) -> None:
        if batch.rows:
            head = MicroBatch(batch.changefeed_id, batch.batch_id, batch.start_ts, batch.end_ts, ddl=batch.ddl)
            if self.write_frame(head, batch_frame(self.spark, batch)) is not None:
                FrameSparkSink.frames += 1
                return
        super().write_batch(batch)


def no_driver_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the sink converts rows on the driver."""

    def refusing(convert: Any, rows_at: int = 0) -> Any:
        def refuse(*args: Any, **kw: Any) -> Any:
            if args[rows_at]:
                raise AssertionError(f"rows converted on the driver ({convert.__name__})")
            return convert(*args, **kw)

        return refuse

    for name in ("changelog_records", "change_records", "delta_records", "image_columns", "decimal_ints"):
        monkeypatch.setattr(sink_module, name, refusing(getattr(sink_module, name)))
    monkeypatch.setattr(SparkSink, "_state_function", refusing(SparkSink._state_function, 2))


def changes(spark: Any, root: Path, table: TableName) -> list[Any]:
    """The change log of ``table``, as comparable sorted rows."""
    log = spark.read.option("mergeSchema", "true").parquet(f"{root}/{table.schema}/{table.table}/changelog")
    return sorted(
        (r["batch_id"], r["seq"], r["op"], r["commit_ts"], r["start_ts"], str(r["commit_date"]), repr(r["before"]),
         repr(r["after"]))
        for r in log.collect()
    )  # fmt: skip


def tables(spark: Any, root: Path, table: TableName) -> tuple[list[Any], list[Any]]:
    """The change log and the snapshot of ``table``, as comparable sorted rows."""
    snapshot = read_snapshot(spark, Storage(spark, str(root)), f"{root}/{table.schema}/{table.table}/snapshot")
    assert snapshot is not None
    state = sorted(repr(r) for r in snapshot.collect())
    return changes(spark, root, table), [snapshot.schema.simpleString(), *state]


def test_workload_through_frames_equals_the_driver_path(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = make_workload("shop", txns=120, resolve_every=30)
    keys = {f"{w.schema}.orders": ["id"]}
    asyncio.run(
        drive(
            ListSource.of(w.events),
            [SparkSink(SparkSinkConfig(frame_writes=True, uri=f"spark://{tmp_path / 'd'}", key_columns=keys))],
        )
    )
    no_driver_conversion(monkeypatch)
    FrameSparkSink.frames = 0
    frames = FrameSparkSink(SparkSinkConfig(frame_writes=True, uri=f"spark://{tmp_path / 'f'}", key_columns=keys))
    asyncio.run(drive(ListSource.of(w.events), [frames]))
    assert FrameSparkSink.frames >= 4
    for name in ("orders", "notes"):
        assert tables(spark, tmp_path / "f", w.table(name)) == tables(spark, tmp_path / "d", w.table(name))


def test_typed_columns_and_ddl_through_frames_equal_the_driver_path(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every column type, an ADD COLUMN with origin defaults and a DROP in the batches' rows."""
    up = ddl_tests.Upstream("items", ddl_tests.col("name", 15))
    for i in range(1, 5):
        up.insert({"id": i, "name": f"n{i}"})
    up.resolve()
    added = [c for c, _ in ddl_tests.TYPED_DEFAULTS]
    up.ddl(
        "ALTER TABLE `shop`.`items` ADD COLUMN ... /* several */", ddl_tests.MULTI, [ddl_tests.col("name", 15), *added]
    )
    up.update(1, name="m1")
    up.insert({"id": 5, "name": "n5", **{c.name: c.origin_default for c in added}})
    up.ddl(
        "ALTER TABLE `shop`.`items` DROP COLUMN `note`",
        ddl_tests.DROP_COLUMN,
        [ddl_tests.col("name", 15), *added[:4], *added[5:]],
    )
    up.update(2, name="m2")
    up.delete(3)
    up.resolve()
    events = sorted(up.events, key=ddl_tests._ts)
    asyncio.run(
        drive(ListSource.of(events), [SparkSink(SparkSinkConfig(frame_writes=True, uri=f"spark://{tmp_path / 'd'}"))])
    )
    no_driver_conversion(monkeypatch)
    asyncio.run(
        drive(
            ListSource.of(events), [FrameSparkSink(SparkSinkConfig(frame_writes=True, uri=f"spark://{tmp_path / 'f'}"))]
        )
    )
    assert tables(spark, tmp_path / "f", up.table) == tables(spark, tmp_path / "d", up.table)


def test_a_replayed_batch_leaves_the_tables_as_one_write(spark: Any, tmp_path: Path) -> None:
    w = make_workload("shop", txns=40, resolve_every=40, alter=False)
    rows = [r for r in w.row_changes()]
    batch = MicroBatch("test", 7, 0, rows[-1].commit_ts, rows)
    config = SparkSinkConfig(frame_writes=True, uri=f"spark://{tmp_path}", key_columns={"shop.orders": ["id"]})

    def write() -> int | None:
        sink = SparkSink(config)
        sink.open(ddl_tests_context())
        head = MicroBatch("test", 7, 0, batch.end_ts)
        return sink.write_frame(head, batch_frame(spark, batch))

    assert write() == len(rows)
    once = {name: tables(spark, tmp_path, w.table(name)) for name in ("orders", "notes")}
    assert write() == 0  # the sink's checkpoint says it was written
    shutil.rmtree(tmp_path / "_cdcflow")  # as if only the pipeline remembered the batch
    assert write() == len(rows)
    assert {name: tables(spark, tmp_path, w.table(name)) for name in ("orders", "notes")} == once


def test_a_tables_change_log_is_written_by_a_task_per_write_task_rows(spark: Any, tmp_path: Path) -> None:
    w = make_workload("shop", txns=40, resolve_every=40, alter=False)
    rows = [r for r in w.row_changes()]
    orders = sum(1 for r in rows if r.table.table == "orders")
    assert orders > 6

    def write(root: Path, task_rows: int) -> dict[str, int]:
        """Parquet files of each table's change log after writing the batch."""
        sink = SparkSink(
            SparkSinkConfig(frame_writes=True, mode="changelog", uri=f"spark://{root}", write_task_rows=task_rows)
        )
        sink.open(ddl_tests_context())
        batch = MicroBatch("test", 3, 0, rows[-1].commit_ts, rows)
        assert sink.write_frame(MicroBatch("test", 3, 0, batch.end_ts), batch_frame(spark, batch)) == len(rows)
        return {
            name: len(list((root / w.schema / name / "changelog").rglob("part-*.parquet")))
            for name in ("orders", "notes")
        }

    assert write(tmp_path / "one", 10_000) == {"orders": 1, "notes": 1}
    assert write(tmp_path / "split", -(-orders // 2))["orders"] == 2  # two tasks' worth, not one per partition
    assert write(tmp_path / "all", 1)["orders"] > 2  # a task per partition of the sorted frame: no fewer
    for name in ("orders", "notes"):
        log = [changes(spark, tmp_path / d, w.table(name)) for d in ("one", "split", "all")]
        assert log[0] == log[1] == log[2] and len(log[0]) == sum(1 for r in rows if r.table.table == name)


def ddl_tests_context() -> Any:
    from cdcflow.core.data.sink import SinkContext

    return SinkContext("test")


def _snapshot_batch(ts: int) -> MicroBatch:
    """An initial snapshot's batch: every row an insert at ``ts``, each key once."""
    rows = [
        *(insert("shop", "orders", {"id": i, "qty": i % 7, "note": f"n{i}"}, commit_ts=ts) for i in range(60)),
        *(insert("shop", "items", {"id": i, "name": f"item-{i}"}, commit_ts=ts) for i in range(25)),
    ]
    return MicroBatch("test", -1, ts, ts, rows)


def test_an_initial_snapshots_batch_is_written_from_its_frame_unsorted(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``frame-writes`` at its default (auto), a one-ts batch goes through ``write_frame``
    without a sort (any order is its order) and leaves the tables the driver path leaves;
    ``seq`` numbers each table's rows once, in whatever order the tasks had them."""
    keys = {"shop.orders": ["id"], "shop.items": ["id"]}
    batch = _snapshot_batch(ts=424242 << 18)
    head = MicroBatch("test", batch.batch_id, batch.start_ts, batch.end_ts)
    driver = SparkSink(SparkSinkConfig(frame_writes=False, uri=f"spark://{tmp_path / 'd'}", key_columns=keys))
    driver.open(ddl_tests_context())
    assert driver.write_frame(head, batch_frame(spark, batch, one_ts=True)) is None
    driver.write_batch(batch)

    rows = batch_frame(spark, batch, one_ts=True)

    def no_sort(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a one-ts batch was sorted")

    monkeypatch.setattr(type(rows.frame), "orderBy", no_sort)
    no_driver_conversion(monkeypatch)
    frames = SparkSink(SparkSinkConfig(uri=f"spark://{tmp_path / 'f'}", key_columns=keys))
    assert frames.config.frame_writes == "auto"
    frames.open(ddl_tests_context())
    assert frames.write_frame(head, rows) == len(batch.rows)
    for name, count in (("orders", 60), ("items", 25)):
        table = TableName("shop", name)
        (f_log, f_state), (d_log, d_state) = tables(spark, tmp_path / "f", table), tables(spark, tmp_path / "d", table)
        assert f_state == d_state
        assert sorted(c[:1] + c[2:] for c in f_log) == sorted(c[:1] + c[2:] for c in d_log)
        assert sorted(c[1] for c in f_log) == list(range(count))


def test_auto_frame_writes_leave_micro_batches_to_the_driver(spark: Any, tmp_path: Path) -> None:
    w = make_workload("shop", txns=10, resolve_every=10, alter=False)
    rows = list(w.row_changes())
    batch = MicroBatch("test", 3, 0, rows[-1].commit_ts, rows)
    sink = SparkSink(SparkSinkConfig(uri=f"spark://{tmp_path}", key_columns={"shop.orders": ["id"]}))
    sink.open(ddl_tests_context())
    assert sink.write_frame(MicroBatch("test", 3, 0, batch.end_ts), batch_frame(spark, batch)) is None


def test_auto_frame_writes_take_a_batch_above_the_collect_size(spark: Any, tmp_path: Path) -> None:
    """A catch-up's batch (more than AUTO_FRAME_ROWS rows) is written from its frame, and
    leaves the tables the driver leaves."""
    w = make_workload("shop", txns=10, resolve_every=10, alter=False)
    rows = sorted(w.row_changes(), key=lambda r: (r.commit_ts, r.start_ts, r.key))  # the batch's order
    batch = MicroBatch("test", 3, 0, rows[-1].commit_ts, rows)
    head = MicroBatch("test", 3, 0, batch.end_ts)
    keys = {"shop.orders": ["id"]}
    driver = SparkSink(SparkSinkConfig(uri=f"spark://{tmp_path / 'd'}", key_columns=keys))
    driver.open(ddl_tests_context())
    driver.write_batch(batch)
    sink = SparkSink(SparkSinkConfig(uri=f"spark://{tmp_path / 'f'}", key_columns=keys))
    sink.open(ddl_tests_context())
    at_the_bound = dataclasses.replace(batch_frame(spark, batch), expected_rows=sink_module.AUTO_FRAME_ROWS)
    assert sink.write_frame(head, at_the_bound) is None
    above = dataclasses.replace(at_the_bound, expected_rows=sink_module.AUTO_FRAME_ROWS + 1)
    assert sink.write_frame(head, above) == len(rows)
    for name in {r.table.table for r in rows}:
        table = TableName("shop", name)
        assert tables(spark, tmp_path / "f", table) == tables(spark, tmp_path / "d", table)


def test_a_batch_with_a_rename_is_declined(spark: Any, tmp_path: Path) -> None:
    up = ddl_tests.Upstream("items", ddl_tests.col("name", 15))
    up.insert({"id": 1, "name": "a"})
    up.rename("things")
    sink = SparkSink(SparkSinkConfig(frame_writes=True, uri=f"spark://{tmp_path}"))
    sink.open(ddl_tests_context())
    rows = [e for e in up.events if not hasattr(e, "query")]
    ddl = tuple(e for e in up.events if hasattr(e, "query"))
    batch = MicroBatch("test", 0, 0, up.ts, rows, ddl)
    assert sink.write_frame(MicroBatch("test", 0, 0, up.ts, ddl=ddl), batch_frame(spark, batch)) is None


def test_the_pipeline_writes_the_spark_sink_from_frames(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the pipeline, no row of the Spark sink's batches is collected to the driver."""
    from cdcflow.core.data.pipeline.runtime import ChangefeedPipeline
    from tests.integration.data.test_pipeline_tasks import END_TS, run_pipeline, source_events

    on_driver: list[Any] = []
    deliver_on_driver = ChangefeedPipeline._deliver_on_driver

    def spy(self: Any, frame: Any, plan: Any, head: Any, ddl: Any, sinks: Any, expected: int, *rest: Any) -> int:
        on_driver.append((expected, list(sinks)))
        return deliver_on_driver(self, frame, plan, head, ddl, sinks, expected, *rest)

    monkeypatch.setattr(ChangefeedPipeline, "_deliver_on_driver", spy)
    no_driver_conversion(monkeypatch)
    lake = tmp_path / "lake"
    sink = SparkSink(
        SparkSinkConfig(
            frame_writes=True, uri=f"spark://{lake}", key_columns={"shop.orders": ["id"], "shop.items": ["id"]}
        )
    )
    run_pipeline(tmp_path, spark, [sink], "frames")
    # Only batches without rows (a resolved ts moved) go through write_batch.
    assert all(expected == 0 for expected, _ in on_driver), on_driver

    want: dict[tuple[str, int], int] = {}
    for event in source_events():
        if hasattr(event, "after") and event.after is not None:
            want[(event.table.table, event.after["id"])] = event.after["v"]
    storage = Storage(spark, str(lake))
    for name in ("orders", "items"):
        frame = read_snapshot(spark, storage, f"{lake}/shop/{name}/snapshot")
        assert frame is not None
        assert sorted((r["id"], r["v"]) for r in frame.collect()) == sorted(
            (k, v) for (t, k), v in want.items() if t == name
        )
    # The pipeline's one writer recorded its last batch.
    (recorded,) = (lake / "_cdcflow" / "frames" / "writers").glob("*.json")
    assert json.loads(recorded.read_text())["resolved-ts"] == END_TS
