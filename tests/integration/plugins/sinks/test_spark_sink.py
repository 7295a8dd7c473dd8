"""The Spark sink on local Spark: snapshot equals the upstream, changelog holds every change once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.data.events import DDLEvent, MicroBatch, RowChange, TableName
from cdcflow.core.errors import DownstreamUnavailableError
from cdcflow.core.testing import ListSource, SimulatedCrash, drive, insert
from cdcflow.plugins.sinks.spark import SparkSink, SparkSinkConfig, Storage, read_snapshot
from cdcflow.plugins.sinks.spark.sink import table_dir
from tests.fixtures.workload import Workload, make_workload

pytestmark = pytest.mark.integration


def spark_sink(root: Path, w: Workload, **options: Any) -> SparkSink:
    config = SparkSinkConfig(uri=f"spark://{root}", key_columns={f"{w.schema}.orders": ["id"]}, **options)
    return SparkSink(config)


def snapshot_rows(spark: Any, root: Path, table: TableName, columns: list[str]) -> list[tuple[Any, ...]]:
    frame = read_snapshot(spark, Storage(spark, str(root)), f"{root}/{table.schema}/{table.table}/snapshot")
    assert frame is not None
    return sorted(tuple(r[c] if c in frame.columns else None for c in columns) for r in frame.collect())


def assert_snapshot(spark: Any, root: Path, w: Workload) -> None:
    assert snapshot_rows(spark, root, w.table("orders"), ["id", "name", "qty", "note"]) == w.expected_orders()
    assert snapshot_rows(spark, root, w.table("notes"), ["msg", "n"]) == w.expected_notes()


def changelog(spark: Any, root: Path, table: TableName) -> list[Any]:
    return spark.read.option("mergeSchema", "true").parquet(f"{root}/{table.schema}/{table.table}/changelog").collect()


def assert_changelog(spark: Any, root: Path, w: Workload) -> None:
    for name in ("orders", "notes"):
        table = w.table(name)
        expected = [(r.op.value, r.commit_ts) for r in w.row_changes() if r.table == table]
        got = changelog(spark, root, table)
        assert sorted((r["op"], r["commit_ts"]) for r in got) == sorted(expected)
        assert len({(r["batch_id"], r["seq"]) for r in got}) == len(got)


def test_workload_snapshot_and_changelog(spark: Any, tmp_path: Path) -> None:
    w = make_workload("shop", txns=120, resolve_every=30)
    result = asyncio.run(drive(ListSource.of(w.events), [spark_sink(tmp_path, w)]))
    assert result.checkpoint_ts == w.last_ts
    assert_snapshot(spark, tmp_path, w)
    assert_changelog(spark, tmp_path, w)
    # Order within a transaction survives: the changelog keeps each change's position.
    got = changelog(spark, tmp_path, w.table("orders"))
    first_update = next(r for r in got if r["op"] == "update")
    assert first_update["before"]["id"] is not None and first_update["after"]["qty"] is not None

    # A replay of every batch (checkpoint gone, as if only the runtime remembered) changes nothing.
    (tmp_path / "_cdcflow" / "test" / "checkpoint.json").unlink()
    asyncio.run(drive(ListSource.of(w.events), [spark_sink(tmp_path, w)]))
    assert_snapshot(spark, tmp_path, w)
    assert_changelog(spark, tmp_path, w)


class CrashingSparkSink(SparkSink):
    """Dies in one batch after its first table (or the table named ``crash_after``) is written,
    before the checkpoint: its tables are written one after the other, so that the others
    are not (a crash among tables written at once leaves any of them written)."""

    crash_on = -1
    crash_after: str | None = None

    def __init__(self, config: SparkSinkConfig) -> None:
        super().__init__(config.model_copy(update={"write_threads": 1}))

    def _write_table(
        self, storage: Storage, table: TableName, rows: Any, ddl: Any, batch: MicroBatch, **options: Any
    ) -> None:
        super()._write_table(storage, table, rows, ddl, batch, **options)
        if batch.batch_id == self.crash_on and self.crash_after in (None, table.table):
            raise SimulatedCrash(f"crash in batch {batch.batch_id}")


def test_crash_mid_batch_then_resume(spark: Any, tmp_path: Path) -> None:
    w = make_workload("shop", txns=100, resolve_every=20)
    crashing = CrashingSparkSink(SparkSinkConfig(uri=f"spark://{tmp_path}", key_columns={"shop.orders": ["id"]}))
    crashing.crash_on = 4
    with pytest.raises(SimulatedCrash):
        asyncio.run(drive(ListSource.of(w.events), [crashing]))
    done = json.loads((tmp_path / "_cdcflow" / "test" / "checkpoint.json").read_text())
    assert done["batch-id"] == 3
    resumed = asyncio.run(
        drive(
            ListSource.of(w.events),
            [spark_sink(tmp_path, w)],
            start_ts=done["resolved-ts"],
            first_batch_id=done["batch-id"] + 1,
        )
    )
    assert resumed.checkpoint_ts == w.last_ts
    assert_snapshot(spark, tmp_path, w)
    assert_changelog(spark, tmp_path, w)


def test_readers_never_see_an_uncommitted_version(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_workload("shop", txns=60, resolve_every=20, alter=False)
    first = [e for e in w.events if isinstance(e, RowChange | DDLEvent) and e.commit_ts <= 500]
    cut = max(e.commit_ts for e in first)
    asyncio.run(drive(ListSource.of([*first, ListSource.resolved(cut)]), [spark_sink(tmp_path, w, mode="snapshot")]))
    orders = w.table("orders")
    before = snapshot_rows(spark, tmp_path, orders, ["id", "name", "qty"])

    def fail(*_args: Any, **_kw: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Storage, "commit_version", fail)
    with pytest.raises(DownstreamUnavailableError):
        asyncio.run(drive(ListSource.of(w.events), [spark_sink(tmp_path, w, mode="snapshot")], start_ts=cut))
    versions = sorted(p.name for p in (Path(table_dir(Storage(spark, str(tmp_path)), orders)) / "snapshot").iterdir())
    assert len(versions) == 2  # the new version's files exist, without their commit marker
    assert snapshot_rows(spark, tmp_path, orders, ["id", "name", "qty"]) == before
    monkeypatch.undo()
    asyncio.run(drive(ListSource.of(w.events), [spark_sink(tmp_path, w, mode="snapshot")], start_ts=cut))
    assert snapshot_rows(spark, tmp_path, orders, ["id", "name", "qty"]) == w.expected_orders(with_note=False)


def test_tables_registered_in_a_catalog_database(spark: Any, tmp_path: Path) -> None:
    w = make_workload("shop", txns=40, resolve_every=20)
    sink = spark_sink(tmp_path, w, catalog_database="cdc_catalog_test")
    asyncio.run(drive(ListSource.of(w.events), [sink]))
    rows = spark.sql("SELECT id, name, qty, note FROM cdc_catalog_test.shop__orders").collect()
    assert sorted(tuple(r) for r in rows) == w.expected_orders()
    changes = spark.sql("SELECT count(*) FROM cdc_catalog_test.shop__orders__changelog").collect()[0][0]
    assert changes == sum(1 for r in w.row_changes() if r.table == w.table("orders"))
    spark.sql("DROP DATABASE cdc_catalog_test CASCADE")


def test_merge_into_a_parquet_catalog_table_is_refused_clearly(spark: Any, tmp_path: Path) -> None:
    """Plain Parquet cannot MERGE: 'auto' writes versions, 'merge' says what to do instead."""
    w = make_workload("shop", txns=20, resolve_every=20, alter=False)
    spark.sql("CREATE DATABASE IF NOT EXISTS cdc_merge_test")
    spark.sql("CREATE TABLE cdc_merge_test.shop__orders (id BIGINT, name STRING, qty BIGINT) USING parquet")
    sink = spark_sink(tmp_path, w, catalog_database="cdc_merge_test", table_format="merge", mode="snapshot")
    with pytest.raises(DownstreamUnavailableError, match="does not support MERGE INTO"):
        asyncio.run(drive(ListSource.of(w.events), [sink]))
    spark.sql("DROP DATABASE cdc_merge_test CASCADE")


def test_partitions_of_one_table_share_its_tables(spark: Any, tmp_path: Path) -> None:
    """Rows of several partitions of one table in one batch: all of them in its snapshot and change log."""
    events: list[Any] = []
    for n in range(6):
        row = insert("shop", "parts", {"id": n, "v": f"v{n}"}, commit_ts=10 + n)
        part = dataclasses.replace(row.table, partition_id=row.table.table_id + 1 + n % 2)
        events.append(dataclasses.replace(row, table=part, key=b"%d" % n))
    sink = SparkSink(SparkSinkConfig(uri=f"spark://{tmp_path}", key_columns={"shop.parts": ["id"]}))
    asyncio.run(drive(ListSource.of([*events, ListSource.resolved(30)]), [sink]))
    assert snapshot_rows(spark, tmp_path, events[0].table, ["id", "v"]) == [(n, f"v{n}") for n in range(6)]
    assert sorted(r["after"]["id"] for r in changelog(spark, tmp_path, events[0].table)) == list(range(6))
