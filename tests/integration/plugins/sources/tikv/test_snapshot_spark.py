"""An initial snapshot read by Spark tasks, one per range, against the playground: the
frame of raw records at T, mounted by the pipeline's MountTask with the schema at T,
equals the playground's snapshot of every table at T."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.data.events import OpType, RowChange, Span, TableName
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice.records import SPARK_SCHEMA_DDL, batch_to_records, event_from_record
from cdcflow.core.data.pipeline.tasks import MountTask, RowPlan, check_mounted
from cdcflow.core.data.snapshot_ranges import (
    is_snapshot_range,
    range_batch_id,
    range_keys,
    range_name,
    snapshot_range,
)
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig
from cdcflow.plugins.sources.tikv.snapshot_task import RangeScanTask, snapshot_frame, snapshot_ranges
from tests.fixtures.spark import spark

pytestmark = pytest.mark.integration

__all__ = ["spark"]

TABLES = ("customers", "orders", "products")


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=2, split_keys=400, ddl_every=0, seed=5) as playground:
        playground.bulk_load("customers", 2500)
        playground.bulk_load("orders", 1200)
        playground.run_workload(100)
        yield playground


@contextlib.asynccontextmanager
async def _shop_source(pg: Playground) -> AsyncIterator[tuple[TiKVSource, int, dict[int, Span]]]:
    """An open tikv source on ``pg``, a fresh ts, and the spans of the shop tables by id."""
    source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
    await source.open()
    try:
        ts = await source.current_ts()
        tables = [t for t in await source.list_tables() if t.schema == "shop" and t.table in TABLES]
        spans = {i: span for i, span in enumerate([s for t in tables for s in await source.spans_for(t)])}
        yield source, ts, spans
    finally:
        await source.close()


def _read(
    pg: Playground, spark: Any, tmp_path: Path, *, range_keys: int = 0, during: Any = None
) -> tuple[int, list[RowChange], int]:
    """(T, the mounted rows of the snapshot at T, the number of ranges)."""

    async def plan() -> tuple[int, RowPlan, RangeScanTask, list[Any]]:
        async with _shop_source(pg) as (source, ts, spans):
            ranges = await snapshot_ranges(source.pd, spans, ts, range_keys=range_keys)
            mounter = source.mounter()
            assert mounter is not None
            batch = await mounter.for_batch(ts - 1, ts)
            assert batch is not None
            ids = {schema: i for i, schema in enumerate(batch.schemas())}
            row_plan = RowPlan("snap", str(tmp_path), spans, batch, TableFilter(["shop.*"]), ids)
            return ts, row_plan, RangeScanTask((pg.pd_address,), ts, spans, page_size=128), ranges

    ts, row_plan, task, ranges = asyncio.run(plan())
    if during is not None:
        during(ts)
    frame = snapshot_frame(spark, task, ranges)
    assert frame.rdd.getNumPartitions() == len(ranges)
    mounted = frame.mapInArrow(MountTask(row_plan), SPARK_SCHEMA_DDL).toArrow()
    schemas = {i: schema for schema, i in row_plan.schema_ids.items()}
    rows: list[RowChange] = []
    for batch in mounted.to_batches():
        check_mounted(batch)
        for record in batch_to_records(batch):
            row = event_from_record(record, row_plan.spans.__getitem__, schemas)
            assert isinstance(row, RowChange)
            rows.append(row)
    return ts, rows, len(ranges)


def _by_table(rows: list[RowChange]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
    for row in sorted(rows, key=lambda r: (r.table.table, r.key)):
        assert row.after is not None
        out[row.table.table].append(dict(row.after))
    for table_rows in out.values():
        table_rows.sort(key=lambda r: r["id"])
    return out


def test_one_task_per_region_equals_the_snapshot(pg: Playground, spark: Any, tmp_path: Path) -> None:
    ts, rows, ranges = _read(pg, spark, tmp_path)
    assert ranges >= 2500 // 400
    assert {(r.op, r.commit_ts, r.start_ts) for r in rows} == {(OpType.INSERT, ts, ts)}
    assert all(isinstance(r.table, TableName) for r in rows)
    got = _by_table(rows)
    for table in TABLES:
        assert got[table] == pg.snapshot(table, ts), table


def test_ranges_of_a_configured_size_with_a_workload_locks_and_splits(
    pg: Playground, spark: Any, tmp_path: Path
) -> None:
    """Rows change, locks come and go and regions split while the tasks read: still exact at T."""
    stop = threading.Event()

    def churn(ts: int) -> None:
        table = pg.catalog.find("shop", "customers")
        from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key

        # A transaction (above T: invisible at T) that holds a lock while the tasks read.
        row = pg.snapshot("customers", ts)[10]
        txn = pg.begin(ttl_ms=60_000)
        txn.put(row_key(table, row["id"]), encode_row_value(table, {**row, "name": "late"}))
        pg.start_workload(100)

        def finish() -> None:
            txn.prewrite()
            stop.wait(0.5)
            txn.commit_prewritten()
            for handle in (300, 900, 1500):
                pg.split_region(row_key(table, handle))

        threading.Thread(target=finish, daemon=True).start()

    try:
        ts, rows, ranges = _read(pg, spark, tmp_path, range_keys=300, during=churn)
    finally:
        stop.set()
        pg.stop_workload()
    assert ranges >= (2500 + 1200) // 300
    got = _by_table(rows)
    for table in TABLES:
        assert got[table] == pg.snapshot(table, ts), table


def test_each_part_of_a_plan_names_its_key_range(pg: Playground) -> None:
    """The parts' key ranges (what a cluster places on its captures) cover each span
    exactly, in key order, each within its span's table; as snapshot ranges they are
    told apart from the tables' spans and give the same keys back."""

    async def plan() -> tuple[dict[int, Span], list[Span | None]]:
        async with _shop_source(pg) as (source, ts, spans):
            snapshot = await source.snapshot_plan(spans, ts)
            return spans, [task.key_range() for task in snapshot.tasks]

    spans, keys = asyncio.run(plan())
    assert all(k is not None for k in keys)
    named = [k for k in keys if k is not None]
    assert len(named) > len(spans), "the tables span several regions"
    for span in spans.values():
        parts = [k for k in named if k.table_id == span.table_id and span.start <= k.start < (span.end or b"\xff")]
        assert parts[0].start == span.start and parts[-1].end == span.end
        assert all(a.end == b.start for a, b in itertools.pairwise(parts)), "gaps or overlaps"
    placed = [snapshot_range(k) for k in named]
    assert all(is_snapshot_range(r) and not is_snapshot_range(k) for r, k in zip(placed, named, strict=True))
    assert [range_keys(r) for r in placed] == named
    assert len({range_batch_id(r) for r in placed}) == len(placed)
    assert len({range_name(r) for r in placed}) == len(placed)
