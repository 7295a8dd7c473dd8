"""A snapshot range removed (or its executor closed) while Spark reads it: its Spark job is
cancelled in Spark, not only the asyncio task that awaited it, and a later read of the
range in this process never finds its part files deleted under it. A snapshot's batch
reaches a sink written from the driver whole, without a sort (every row at one ts, each
key once: any order is its order). And while a snapshot is read or delivered, the
capture's start leaves Spark's read planner alone (a SnapshotHold)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.snapshot import InitialSnapshot
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor, changefeed_dir
from cdcflow.core.data.snapshot_ranges import range_done_ts, range_name, snapshot_range
from cdcflow.core.data.span_executor import SpanState
from cdcflow.core.testing import ListSink, insert, until
from tests.integration.data.gated import GatedSnapshotSource

pytestmark = pytest.mark.integration

TS = 500
ROWS = 40
SPARK_WAIT = 120.0  # a hang guard for steps that take seconds with local Spark on a loaded machine


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session

    session = spark_session(SparkSettings(master="local[2]"))
    yield session
    stop_spark_session()


def _source(gate: Path) -> GatedSnapshotSource:
    events = [insert("shop", "orders", {"id": i}, commit_ts=100 + i) for i in range(ROWS)]
    source = GatedSnapshotSource(GatedSnapshotSource.Config(), [*events, GatedSnapshotSource.resolved(TS)])
    source.gate_dir = gate
    return source


def _executor(spark: Any, tmp_path: Path, sink: ListSink, **options: Any) -> PipelineSpanExecutor:
    return PipelineSpanExecutor(
        PipelineContext(
            "cf", _source(tmp_path / "gate"), [sink], data_dir=tmp_path / "data", start_ts=TS, spark=spark, **options
        )
    )


async def _range(executor: PipelineSpanExecutor) -> Any:
    (table,) = await executor.source.list_tables()
    (span,) = await executor.source.spans_for(table)
    return snapshot_range(span)


def _group(tmp_path: Path, placed: Any) -> str:
    return InitialSnapshot(changefeed_dir(tmp_path / "data", "cf"), "cf", TS, range_name=range_name(placed)).job_group


def _running_jobs(spark: Any, group: str) -> list[int]:
    tracker = spark.sparkContext.statusTracker()
    jobs = [(job, tracker.getJobInfo(job)) for job in tracker.getJobIdsForGroup(group)]
    return [job for job, info in jobs if info is not None and info.status == "RUNNING"]


async def _read_started(executor: PipelineSpanExecutor, spark: Any, tmp_path: Path) -> tuple[Any, str]:
    """Place the range, wait until its Spark job runs a part (held at the gate)."""
    (tmp_path / "gate").mkdir(exist_ok=True)
    placed = await _range(executor)
    assert await executor.add_span(placed, TS, prepare=False)
    group = _group(tmp_path, placed)
    await until(lambda: any((tmp_path / "gate").glob("started-*")), timeout=SPARK_WAIT)
    assert _running_jobs(spark, group), "the range's read must run in Spark for this test to mean anything"
    return placed, group


async def _deliver_again(spark: Any, tmp_path: Path, sink: Any = None, **options: Any) -> Any:
    """A new executor of the changefeed reads and delivers the range whole (to ``sink``,
    a new ListSink by default)."""
    (tmp_path / "gate").mkdir(exist_ok=True)
    (tmp_path / "gate" / "open").touch()
    sink = ListSink() if sink is None else sink
    executor = _executor(spark, tmp_path, sink, **options)
    try:
        placed = await _range(executor)
        assert await executor.add_span(placed, TS, prepare=False)
        await until(
            lambda: executor.status(placed).resolved_ts == range_done_ts(TS) or executor.error(),
            timeout=SPARK_WAIT,
        )
        assert executor.error() is None
    finally:
        await executor.close()
    return sink


def test_closing_the_executor_mid_read_cancels_the_ranges_spark_job(spark: Any, tmp_path: Path) -> None:
    async def main() -> ListSink:
        executor = _executor(spark, tmp_path, ListSink())
        _, group = await _read_started(executor, spark, tmp_path)
        await executor.close()
        # Closed means the range's Spark job is over, not merely no longer awaited.
        assert _running_jobs(spark, group) == []
        return await _deliver_again(spark, tmp_path)

    sink = asyncio.run(main())
    assert sorted(row.after["id"] for row in sink.rows) == list(range(ROWS))


def test_removing_a_range_mid_read_cancels_its_spark_job(spark: Any, tmp_path: Path) -> None:
    async def main() -> ListSink:
        executor = _executor(spark, tmp_path, ListSink())
        try:
            placed, group = await _read_started(executor, spark, tmp_path)
            final = await until(lambda: executor.remove_span(placed), timeout=SPARK_WAIT)
            assert final == TS  # stopped, not delivered: its new capture delivers it
            assert executor.status(placed).state is SpanState.STOPPED
            assert _running_jobs(spark, group) == []
        finally:
            await executor.close()
        return await _deliver_again(spark, tmp_path)

    sink = asyncio.run(main())
    assert sorted(row.after["id"] for row in sink.rows) == list(range(ROWS))


@pytest.mark.parametrize("collect_rows", [0, ROWS], ids=["staged", "collected"])
def test_a_snapshot_reaches_a_driver_sink_unsorted(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collect_rows: int
) -> None:
    """A snapshot's batch above ``collect_rows``, staged by Spark as Parquet, is staged as
    the tasks read it: no range sort, whose sampling job would mount every row once more.
    Below it, the batch is collected (and not sorted on the driver either). Both deliver
    every row at the snapshot's ts."""
    from cdcflow.core.data.pipeline.runtime import ChangefeedPipeline

    delivering: list[int] = []
    deliver = ChangefeedPipeline._deliver_on_driver

    def spy(self: Any, frame: Any, plan: Any, head: Any, *rest: Any) -> int:
        delivering.append(head.batch_id)
        try:
            return deliver(self, frame, plan, head, *rest)
        finally:
            delivering.pop()

    order_by = type(spark.range(1)).orderBy

    def refused_in_a_snapshot(frame: Any, *args: Any, **kw: Any) -> Any:
        assert not any(batch < 0 for batch in delivering), "a snapshot's batch was sorted"
        return order_by(frame, *args, **kw)

    monkeypatch.setattr(ChangefeedPipeline, "_deliver_on_driver", spy)
    monkeypatch.setattr(type(spark.range(1)), "orderBy", refused_in_a_snapshot)
    sink = asyncio.run(_deliver_again(spark, tmp_path, collect_rows=collect_rows))
    assert sorted(row.after["id"] for row in sink.rows) == list(range(ROWS))
    assert {row.commit_ts for row in sink.rows} == {TS}


def test_a_snapshots_tasks_read_its_part_files_themselves(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot's batch read apart (here: any batch) to a sink written per lane is not
    read back by Spark: each task reads its share of the part files (their Parquet row
    groups) itself and writes its rows, every row once, at the snapshot's ts."""
    import json

    from cdcflow.core.data.pipeline import runtime
    from cdcflow.core.data.pipeline.datasource import split_record_batches
    from tests.integration.data.test_pipeline_tasks import LaneSink

    read: list[list[str]] = []

    def split(files: Any, parts: int) -> Any:
        read.append(list(files))
        return split_record_batches(files, parts)

    monkeypatch.setattr(runtime, "MIN_SPLIT_ROWS", 1)
    monkeypatch.setattr(runtime, "split_record_batches", split)
    out = tmp_path / "out"
    out.mkdir()
    asyncio.run(_deliver_again(spark, tmp_path, LaneSink(out), task_rows=10))

    (files,) = read
    assert len(files) == 2 and all(Path(f).name.startswith("part-") and f.endswith(".parquet") for f in files)
    parts = [
        p for path in out.glob("lanes-*.json") for ps in json.loads(path.read_text())["lanes"].values() for p in ps
    ]
    assert sorted(p[1] for p in parts) == list(range(ROWS)) and {p[3] for p in parts} == {TS}


def test_a_snapshot_written_by_one_task_is_not_sorted(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot's batch for one task (every batch with one task slot) goes to its task
    as read: neither Spark's sort (a JVM sort of every row of a snapshot) nor the task's
    own (SortedTask). Every row is written once, at the snapshot's ts."""
    import json

    from cdcflow.core.data.pipeline import runtime
    from tests.integration.data.test_pipeline_tasks import LaneSink

    sort_within = type(spark.range(1)).sortWithinPartitions

    def refused(frame: Any, *args: Any, **kw: Any) -> Any:
        raise AssertionError("a snapshot's batch was sorted by Spark")

    class NoSortedTask:
        def __init__(self, *args: Any) -> None:
            raise AssertionError("a snapshot's batch was sorted in its task")

    monkeypatch.setattr(type(spark.range(1)), "sortWithinPartitions", refused)
    monkeypatch.setattr(runtime, "SortedTask", NoSortedTask)
    out = tmp_path / "out"
    out.mkdir()
    try:
        asyncio.run(_deliver_again(spark, tmp_path, LaneSink(out), task_rows=10 * ROWS))
    finally:
        monkeypatch.setattr(type(spark.range(1)), "sortWithinPartitions", sort_within)
    written = [json.loads(path.read_text()) for path in out.glob("lanes-*.json")]
    assert len(written) == 1, "one task wrote the batch"
    parts = [p for doc in written for ps in doc["lanes"].values() for p in ps]
    assert sorted(p[1] for p in parts) == list(range(ROWS)) and {p[3] for p in parts} == {TS}


def test_a_snapshot_holds_the_planners_warm_up_back_until_it_is_delivered(spark: Any, tmp_path: Path) -> None:
    """While a changefeed's initial snapshot — its own, or a snapshot range placed here —
    is read or delivered, this process holds a SnapshotHold (the capture's start warms
    Spark's read planner only once none is held); once delivered, the hold is gone."""
    from cdcflow.core.data.pipeline.session import snapshots_held

    async def own_snapshot() -> tuple[int, int, list[int]]:
        (tmp_path / "gate").mkdir(exist_ok=True)
        executor = _executor(spark, tmp_path, sink := ListSink(), snapshot_ts=TS)
        try:
            (table,) = await executor.source.list_tables()
            (span,) = await executor.source.spans_for(table)
            assert await executor.add_span(span, TS, prepare=False)
            await until(lambda: any((tmp_path / "gate").glob("started-*")), timeout=SPARK_WAIT)
            reading = snapshots_held()
            (tmp_path / "gate" / "open").touch()
            await until(lambda: executor.pipeline is not None or executor.error(), timeout=SPARK_WAIT)
            assert executor.error() is None
            return reading, snapshots_held(), sorted(row.after["id"] for row in sink.rows)
        finally:
            await executor.close()

    before = snapshots_held()
    reading, delivered, rows = asyncio.run(own_snapshot())
    assert (reading, delivered) == (before + 1, before)
    assert rows == list(range(ROWS))

    async def snapshot_range(under: Path) -> tuple[int, int]:
        under.mkdir()
        executor = _executor(spark, under, ListSink())
        try:
            placed, _ = await _read_started(executor, spark, under)
            reading = snapshots_held()
            (under / "gate" / "open").touch()
            await until(lambda: executor.status(placed).resolved_ts == range_done_ts(TS), timeout=SPARK_WAIT)
            return reading, snapshots_held()
        finally:
            await executor.close()

    assert asyncio.run(snapshot_range(tmp_path / "ranges")) == (before + 1, before)


def test_a_snapshots_frame_is_read_by_a_task_per_slot_repartitioned_only_when_its_files_are_small(
    spark: Any, tmp_path: Path
) -> None:
    """Spark splits the part files into reads of at least openCostInBytes: files smaller
    than that per task slot are repartitioned, larger ones are split by Spark itself —
    both give every slot a partition, and the larger ones need no shuffle."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cdcflow.core.data.logservice.records import ARROW_SCHEMA
    from cdcflow.core.data.pipeline.snapshot import part_file_name

    snapshot = InitialSnapshot(tmp_path, "cf", TS)
    snapshot.parts_dir.mkdir(parents=True)
    rows = 20_000
    columns = {field.name: pa.nulls(rows, field.type) for field in ARROW_SCHEMA}
    columns["key"] = pa.array([i.to_bytes(8, "big") * 8 for i in range(rows)], pa.binary())
    pq.write_table(
        pa.table(columns, schema=ARROW_SCHEMA),
        snapshot.parts_dir / part_file_name(0, rows),
        row_group_size=1_000,
        use_dictionary=False,
        compression="none",
    )
    slots = int(spark.sparkContext.defaultParallelism)
    assert slots == 2

    def repartitioned(frame: Any) -> bool:
        return "Repartition" in frame._jdf.queryExecution().logical().toString()

    small = snapshot.frame(spark)  # ~1.3 MB, below 2 × 4 MiB
    assert repartitioned(small) and small.rdd.getNumPartitions() == slots
    cost = spark.conf.get("spark.sql.files.openCostInBytes")
    spark.conf.set("spark.sql.files.openCostInBytes", str(snapshot.parts_bytes() // (2 * slots)))
    try:
        large = snapshot.frame(spark)
        assert not repartitioned(large) and large.rdd.getNumPartitions() >= slots
        assert large.count() == rows
    finally:
        spark.conf.set("spark.sql.files.openCostInBytes", cost)


@pytest.mark.parametrize("task_rows", [10, 10 * ROWS], ids=["tasks", "one-task"])
def test_a_snapshot_whose_tasks_read_its_part_files_never_makes_its_frame(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task_rows: int
) -> None:
    """Tasks that read the part files themselves need only the frame's session: the
    DataFrame over the parts (a Parquet source resolved, files listed, schema parsed) is
    not made. A sink written from the driver reads the frame: made once."""
    from cdcflow.core.data.pipeline import runtime
    from tests.integration.data.test_pipeline_tasks import LaneSink

    made: list[int] = []
    make = InitialSnapshot.make_frame

    def counted(self: InitialSnapshot, session: Any) -> Any:
        made.append(1)
        return make(self, session)

    monkeypatch.setattr(InitialSnapshot, "make_frame", counted)
    monkeypatch.setattr(runtime, "MIN_SPLIT_ROWS", 1)
    out = tmp_path / "out"
    out.mkdir()
    asyncio.run(_deliver_again(spark, tmp_path, LaneSink(out), task_rows=task_rows))
    assert made == [] and list(out.glob("lanes-*.json"))
    (tmp_path / "driver").mkdir()
    sink = asyncio.run(_deliver_again(spark, tmp_path / "driver"))
    assert made == [1] and sorted(row.after["id"] for row in sink.rows) == list(range(ROWS))
