"""Rows are written by Spark tasks, in parallel, partitioned by key (or encoded in parallel
and written per ordered lane); a partition that fails is written again and the
downstream ends as after a single write."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.codec import EncodedMessage
from cdcflow.core.data.events import MicroBatch, RowChange, TableName
from cdcflow.core.data.pipeline.datasource import split_record_batches
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.sink import LaneTaskWriter, LaneWriter, PartitionWriter, Sink, TaskWriter
from cdcflow.core.errors import DownstreamUnavailableError
from cdcflow.core.plugin import PluginConfig
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import ListSink, ListSource, insert, until, update
from cdcflow.plugins.sinks.file.sink import FileSink, FileSinkConfig

pytestmark = pytest.mark.integration

ROWS_PER_TABLE = 120
END_TS = 100_000


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session

    # Two cores: the partitions of a batch must be able to run at the same time.
    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master != "local[2]":
        active.stop()
    session = spark_session(SparkSettings(master="local[2]"))
    assert session.sparkContext.defaultParallelism == 2
    yield session
    stop_spark_session()


def source_events() -> list[Any]:
    out: list[Any] = []
    for i in range(ROWS_PER_TABLE):
        for table in ("orders", "items"):
            out.append(insert("shop", table, {"id": i, "v": 0}, commit_ts=1_000 + i * 10, start_ts=995 + i * 10))
    # Every key changes again later: the order of a key's changes must hold downstream.
    for i in range(0, ROWS_PER_TABLE, 3):
        out.append(update("shop", "orders", {"id": i, "v": 0}, {"id": i, "v": 1}, commit_ts=5_000 + i))
    out.append(ListSource.resolved(END_TS))
    return out


def keyed_events() -> list[Any]:
    """:func:`source_events` with each row's upstream key, as a TiKV source's rows carry it."""
    return [
        replace(e, key=b"t_%s_r%08d" % (e.table.table.encode(), e.image()["id"])) if isinstance(e, RowChange) else e
        for e in source_events()
    ]


# -- a sink whose partition writers record where and when they ran ------------------


class RecordingConfig(PluginConfig):
    pass


class _Recorder(TaskWriter):
    def __init__(self, directory: str, encoders: int = 2) -> None:
        self.directory = directory
        self.encoders = encoders

    def open(self, batch: MicroBatch, partition: int) -> PartitionWriter:
        return _RecordingWriter(Path(self.directory), batch.batch_id, partition)


class _RecordingWriter(PartitionWriter):
    """Records its rows, its process and whether another partition of its batch was
    being written at the same time (it waits a while for one to start)."""

    def __init__(self, directory: Path, batch_id: int, partition: int) -> None:
        self.directory = directory
        self.prefix = f"{batch_id}-"
        self.path = directory / f"{batch_id}-{partition}.json"
        self.partition = partition
        self.rows: list[tuple[str, int, int, int]] = []
        self.overlapped = False
        (directory / f"{batch_id}-{partition}.running").touch()

    def _others_running(self) -> bool:
        return any(p != self.path.with_suffix(".running") for p in self.directory.glob(f"{self.prefix}*.running"))

    def write(self, rows: list[RowChange]) -> None:
        self.rows += [(r.table.table, r.after["id"], r.after["v"], r.commit_ts) for r in rows if r.after]
        deadline = time.monotonic() + 30
        while not self.overlapped and time.monotonic() < deadline:
            self.overlapped = self._others_running()
            time.sleep(0.05)

    def flush(self) -> None:
        doc = {"pid": os.getpid(), "partition": self.partition, "overlapped": self.overlapped, "rows": self.rows}
        self.path.write_text(json.dumps(doc))


class RecordingSink(Sink[RecordingConfig]):
    type_name = "recording"
    Config = RecordingConfig

    def __init__(self, directory: Path) -> None:
        super().__init__(RecordingConfig())
        self.directory = directory
        self.committed: list[MicroBatch] = []

    def task_writer(self, tables: Sequence[TableName]) -> TaskWriter:
        return _Recorder(str(self.directory))

    def write_batch(self, batch: MicroBatch) -> None:
        raise AssertionError("a sink with a task writer gets its rows from tasks")

    def commit_batch(self, batch: MicroBatch) -> None:
        assert not batch.rows
        self.committed.append(batch)


def run_pipeline(
    tmp_path: Path, spark: Any, sinks: list[Sink[Any]], name: str, events: list[Any] | None = None, **context: Any
) -> PipelineSpanExecutor:
    source = ListSource.of(source_events() if events is None else events)

    async def run() -> PipelineSpanExecutor:
        executor = PipelineSpanExecutor(
            PipelineContext(
                name,
                source,
                sinks,
                data_dir=tmp_path / "data",
                start_ts=0,
                spark=spark,
                plugins=PluginManager.default(autoload=False),
                trigger_interval=0.2,
                task_rows=20,  # several partitions even for this small batch
                **context,
            )
        )
        for table in await source.list_tables():
            for span in await source.spans_for(table):
                assert await executor.add_span(span, 0, prepare=False)
        deadline = time.monotonic() + 180
        while executor.checkpoint_ts < END_TS:
            assert executor.error() is None or isinstance(executor.error(), DownstreamUnavailableError)
            assert time.monotonic() < deadline, "the checkpoint did not reach the source's resolved ts"
            await asyncio.sleep(0.2)
        await executor.close()
        return executor

    return asyncio.run(run())


def expected_rows(events: list[Any] | None = None) -> set[tuple[str, int, int, int]]:
    want = set()
    for event in source_events() if events is None else events:
        if isinstance(event, RowChange) and event.after is not None:
            want.add((event.table.table, event.after["id"], event.after["v"], event.commit_ts))
    return want


def test_rows_are_written_by_spark_tasks_in_parallel_partitioned_by_key(tmp_path, spark, monkeypatch):
    """A batch of a sink partitioned by key is written by several tasks at once, each
    reading the batch's files itself and keeping the keys hashed to it: every change of
    a key in one task, in commit order."""
    from cdcflow.core.data.pipeline import runtime

    hashed: list[tuple[str, ...]] = []
    map_read_hashed = runtime.ChangefeedPipeline._map_read_hashed

    def read_hashed(self: Any, frame: Any, task: Any, partitions: int, files: Any, columns: Any) -> Any:
        hashed.append(columns)
        return map_read_hashed(self, frame, task, partitions, files, columns)

    monkeypatch.setattr(runtime.ChangefeedPipeline, "_map_read_hashed", read_hashed)
    out = tmp_path / "out"
    out.mkdir()
    sink = RecordingSink(out)
    run_pipeline(tmp_path, spark, [sink], "tasks")
    assert hashed == [("table_id", "key")]  # the batch's records did not go through a shuffle

    docs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    # One batch (its rows were resolved at once), written by several tasks.
    assert len({p.name.split("-")[0] for p in out.glob("*.json")}) == 1
    rows = [tuple(r) for d in docs for r in d["rows"]]
    assert sorted(rows) == sorted(expected_rows())  # every row once
    # Written in Spark's Python workers, not in this (the driver's) process.
    assert {d["pid"] for d in docs} and os.getpid() not in {d["pid"] for d in docs}
    # Several partitions, and two of them were written at the same time.
    assert len({d["partition"] for d in docs}) >= 2
    assert all(d["overlapped"] for d in docs), [(d["partition"], len(d["rows"])) for d in docs]
    # All changes of a key are in one partition, in commit-ts order.
    where: dict[tuple[str, int], set[int]] = defaultdict(set)
    for d in docs:
        for table, key, _, _ in d["rows"]:
            where[(table, key)].add(d["partition"])
    assert all(len(parts) == 1 for parts in where.values())
    for d in docs:
        by_key: dict[tuple[str, int], list[int]] = defaultdict(list)
        for table, key, _, commit_ts in d["rows"]:
            by_key[(table, key)].append(commit_ts)
        assert all(ts == sorted(ts) for ts in by_key.values())
    # The driver committed each batch after its partitions.
    assert sink.committed and sink.committed[-1].end_ts == END_TS


# -- the file sink: a partition that fails once is written again ----------------------


class _FailOnce(TaskWriter):
    """Delegates to the file sink's writer; partition 1's first flush fails (a marker file
    remembers it across processes), after its rows were handed over."""

    def __init__(self, inner: TaskWriter, marker: str) -> None:
        self.inner = inner
        self.marker = marker

    def open(self, batch: MicroBatch, partition: int) -> PartitionWriter:
        writer = self.inner.open(batch, partition)
        if partition == 1 and not os.path.exists(self.marker):
            return _FailingFlush(writer, self.marker)
        return writer


class _FailingFlush(PartitionWriter):
    def __init__(self, inner: PartitionWriter, marker: str) -> None:
        self.inner = inner
        self.marker = marker

    def write(self, rows: list[RowChange]) -> None:
        self.inner.write(rows)

    def flush(self) -> None:
        Path(self.marker).touch()
        raise DownstreamUnavailableError("the downstream went away during the flush")

    def close(self) -> None:
        self.inner.close()


class FlakyFileSink(FileSink):
    def __init__(self, config: FileSinkConfig, marker: Path) -> None:
        super().__init__(config)
        self.marker = marker

    def task_writer(self, tables: Sequence[TableName]) -> TaskWriter:
        return _FailOnce(super().task_writer(tables), str(self.marker))


def read_file_sink(directory: Path) -> list[tuple[str, int, int, int]]:
    rows = []
    for path in sorted(directory.rglob("0*.jsonl")):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            rows.append((path.parent.name, doc["after"]["id"], doc["after"]["v"], doc["commit_ts"]))
    return rows


def test_file_sink_partition_failed_then_retried_equals_a_single_write(tmp_path, spark):
    marker = tmp_path / "failed-once"
    flaky = FlakyFileSink(FileSinkConfig(path=str(tmp_path / "flaky"), fsync=False), marker)
    run_pipeline(tmp_path / "a", spark, [flaky], "flaky")
    assert marker.exists(), "partition 1 never failed: the test did not exercise a retry"

    clean = FileSink(FileSinkConfig(path=str(tmp_path / "clean"), fsync=False))
    run_pipeline(tmp_path / "b", spark, [clean], "clean")

    flaky_rows, clean_rows = read_file_sink(tmp_path / "flaky"), read_file_sink(tmp_path / "clean")
    assert sorted(flaky_rows) == sorted(clean_rows) == sorted(expected_rows())
    assert not list((tmp_path / "flaky").rglob("*.tmp"))
    assert json.loads((tmp_path / "flaky" / "metadata").read_text())["checkpoint-ts"] == END_TS


def kafka_rows(bootstrap: str, topic: str) -> list[tuple[int, str, int, int, int]]:
    """Every row message of ``topic`` as (partition, table, commit ts, id, value), each
    partition's in offset order."""
    from cdcflow.core.testing.open_protocol import decode, read_topic

    rows: list[tuple[int, str, int, int, int]] = []
    for partition, found in read_topic(bootstrap, topic).items():
        for key, value in found:
            for k, v in decode(key, value):
                if k["t"] == 1 and v is not None:
                    rows.append((partition, k["tbl"], k["ts"], v["u"]["id"]["v"], v["u"]["v"]["v"]))
    return rows


def last_images(rows: list[tuple[int, str, int, int, int]]) -> dict[tuple[str, int], int]:
    """Each row's last value in offset order: what a consumer keeps when each key is in
    one partition (no resolved event is written without a coordinator, so the consumer's
    recipe would hold every row back)."""
    return {(table, key): value for _, table, _, key, value in rows}


def source_images(events: list[Any]) -> dict[tuple[str, int], int]:
    """The last value of each row of ``events``."""
    return {(e.table.table, e.image()["id"]): e.image()["v"] for e in events if isinstance(e, RowChange)}


def test_kafka_partition_failed_then_retried_leaves_what_a_single_write_leaves(tmp_path, spark):
    """A Kafka task (rows split by key: the index-value rule) fails its flush after its
    rows were produced; the batch is written again. The topic then holds, duplicates
    aside, the messages a clean run produces, each key in one partition, and a consumer
    taking each row's last image in offset order finds the source's rows."""
    from cdcflow.plugins.sinks.kafka import KafkaSink, KafkaSinkConfig
    from cdcflow.plugins.sinks.kafka.dispatch import DispatchRule

    class FlakyKafkaSink(KafkaSink):
        marker = ""

        def task_writer(self, tables: Sequence[TableName]) -> TaskWriter:
            return _FailOnce(super().task_writer(tables), self.marker)

    def config(topic: str) -> KafkaSinkConfig:
        rule = DispatchRule(matcher=["*.*"], partition="index-value")
        return KafkaSinkConfig(uri=f"kafka://mock/{topic}", topic=topic, partition_num=3, dispatchers=[rule])

    events = keyed_events()
    flaky_topic, clean_topic = f"flaky-{uuid.uuid4().hex[:8]}", f"clean-{uuid.uuid4().hex[:8]}"
    flaky = FlakyKafkaSink(config(flaky_topic))
    flaky.marker = str(tmp_path / "failed-once")
    run_pipeline(tmp_path / "a", spark, [flaky], "flaky-kafka", events)
    assert Path(flaky.marker).exists(), "partition 1 never failed: the test did not exercise a retry"
    clean = KafkaSink(config(clean_topic))
    run_pipeline(tmp_path / "b", spark, [clean], "clean-kafka", events)

    flaky_rows, clean_rows = (
        kafka_rows(flaky.bootstrap_servers, flaky_topic),
        kafka_rows(clean.bootstrap_servers, clean_topic),
    )
    assert set(flaky_rows) == set(clean_rows)  # duplicates folded
    partitions_of: dict[tuple[str, int], set[int]] = defaultdict(set)
    for partition, table, _, key, _ in flaky_rows:
        partitions_of[(table, key)].add(partition)
    assert all(len(found) == 1 for found in partitions_of.values())
    assert last_images(flaky_rows) == last_images(clean_rows) == source_images(events)


def test_a_catch_up_is_delivered_in_bounded_batches_and_the_checkpoint_moves_after_each(tmp_path, spark):
    """600 rows resolved at once (a backlog): batches of at most 100 rows, checkpoint batch by batch."""
    rows = [insert("shop", "orders", {"id": i, "v": 0}, commit_ts=1_000 + i) for i in range(600)]
    source = ListSource.of([*rows, ListSource.resolved(END_TS)])
    sink = ListSink()
    checkpoints: list[int] = []

    async def run() -> None:
        executor = PipelineSpanExecutor(
            PipelineContext(
                "bounded",
                source,
                [sink],
                data_dir=tmp_path / "data",
                start_ts=0,
                spark=spark,
                spark_settings=SparkSettings(master="local[2]", max_batch_rows=100),
                plugins=PluginManager.default(autoload=False),
                trigger_interval=0.2,
                on_checkpoint=checkpoints.append,
            )
        )
        for table in await source.list_tables():
            for span in await source.spans_for(table):
                assert await executor.add_span(span, 0, prepare=False)
        await until(lambda: executor.checkpoint_ts >= END_TS, timeout=180, observe=executor.error)
        await executor.close()

    asyncio.run(run())
    sizes = [len(b.rows) for b in sink.batches.values()]
    assert sum(sizes) == 600 and max(sizes) <= 100 and len([s for s in sizes if s]) >= 6, sizes
    # The checkpoint moved after each bounded batch, never back.
    assert checkpoints == sorted(checkpoints) and len(set(checkpoints)) >= 6 and checkpoints[-1] == END_TS


def join_behind(
    tmp_path: Path, spark: Any, sink: Sink[Any], backlog: list[RowChange], name: str, **context: Any
) -> list[int]:
    """``shop.orders`` runs first and moves the published ts to END_TS; then ``shop.items``
    joins behind it with ``backlog``, delivered in batches of at most 100 rows. Returns the
    items span's checkpoint after each of the changefeed's checkpoints, once it is END_TS."""
    source = ListSource.of(
        [insert("shop", "orders", {"id": 0, "v": 0}, commit_ts=900), *backlog, ListSource.resolved(END_TS)]
    )
    behind: list[int] = []

    async def run() -> None:
        spans = {table.table: span for table in await source.list_tables() for span in await source.spans_for(table)}
        executor = PipelineSpanExecutor(
            PipelineContext(
                name,
                source,
                [sink],
                data_dir=tmp_path / "data",
                start_ts=0,
                spark=spark,
                spark_settings=SparkSettings(master="local[2]", max_batch_rows=100),
                plugins=PluginManager.default(autoload=False),
                trigger_interval=0.2,
                on_checkpoint=lambda ts: behind.append(executor.status(spans["items"]).checkpoint_ts),
                **context,
            )
        )
        assert await executor.add_span(spans["orders"], 0, prepare=False)
        await until(lambda: executor.store.published_ts >= END_TS, timeout=120, observe=executor.error)
        assert await executor.add_span(spans["items"], 0, prepare=False)
        await until(lambda: executor.checkpoint_ts >= END_TS and behind and behind[-1] >= END_TS, timeout=180)
        await executor.close()

    asyncio.run(run())
    return behind


def test_a_span_that_joins_behind_with_a_backlog_moves_its_checkpoint_batch_by_batch(tmp_path, spark):
    """How a changefeed starts: its spans leave the prepare phase one by one, the first
    moves the published ts to its resolved ts, and the others join behind it with their
    whole backlog. Each such span's checkpoint (and so the changefeed's) moves as its
    backlog is delivered in bounded batches, not once at the end."""
    rows = [insert("shop", "items", {"id": i, "v": 0}, commit_ts=1_000 + i) for i in range(600)]
    sink = ListSink()
    behind = join_behind(tmp_path, spark, sink, rows, "joins-behind")
    assert sorted(r.image()["id"] for b in sink.batches.values() for r in b.rows if r.table.table == "items") == list(
        range(600)
    )
    moves = sorted(set(behind) - {0})
    assert behind == sorted(behind) and len(moves) >= 5 and moves[-1] == END_TS, behind


# -- a sink that keeps each table in one ordered lane ---------------------------------


class _LaneRecorder(LaneTaskWriter):
    """Encodes each row into one part bound for its table's lane (waiting a while, once per
    task, for another task to be encoding too); records each lane's parts as written."""

    def __init__(self, directory: str, encoders: int = 2) -> None:
        self.directory = directory
        self.encoders = encoders

    def encode(self, rows: Sequence[RowChange]) -> list[tuple[int, str, int, EncodedMessage]]:
        from pyspark import TaskContext

        context = TaskContext.get()
        stage, partition = context.stageId(), context.partitionId()
        directory = Path(self.directory)
        marker = directory / f"encode-{stage}-{partition}"
        if not marker.exists():
            marker.write_text(json.dumps({"pid": os.getpid(), "rows": 0, "overlapped": False}))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(list(directory.glob(f"encode-{stage}-*"))) < self.encoders:
                time.sleep(0.05)
        doc = json.loads(marker.read_text())
        doc["rows"] += len(rows)
        doc["overlapped"] = doc["overlapped"] or len(list(directory.glob(f"encode-{stage}-*"))) >= 2
        marker.write_text(json.dumps(doc))
        out = []
        for i, row in enumerate(rows):
            value = json.dumps([row.table.table, row.image()["id"], row.image().get("v"), row.commit_ts]).encode()
            out.append((i, row.table.table, 0, EncodedMessage(None, value, row.table, 1, row.commit_ts)))
        return out

    def open_lanes(self, batch: MicroBatch, partition: int) -> LaneWriter:
        return _LaneLog(Path(self.directory), batch.batch_id, partition)


class _LaneLog(LaneWriter):
    def __init__(self, directory: Path, batch_id: int, partition: int) -> None:
        self.path = directory / f"lanes-{batch_id}-{partition}.json"
        self.lanes: dict[str, list[Any]] = defaultdict(list)

    def write(self, route: str, lane: int, parts: Sequence[EncodedMessage]) -> None:
        self.lanes[f"{route}/{lane}"] += [json.loads(p.value) for p in parts]

    def flush(self) -> None:
        self.path.write_text(json.dumps({"pid": os.getpid(), "lanes": self.lanes}))


class LaneSink(RecordingSink):
    """Its rows are ordered per table downstream (``task_partitioning() == "table"``)."""

    #: How many encoding tasks of a stage a task waits for (a while) before encoding.
    encoders = 2

    def task_partitioning(self) -> str:
        return "table"

    def task_writer(self, tables: Sequence[TableName]) -> TaskWriter:
        return _LaneRecorder(str(self.directory), self.encoders)


def test_rows_kept_in_order_per_table_are_encoded_in_parallel_and_written_per_lane(tmp_path, spark, monkeypatch):
    """A table's rows are not bound to one task: tasks split by key encode them at the
    same time, and the table's lane gets its parts in commit order, from one task. Here
    the batch's files are not known (a frame Spark reads), so Spark shuffles the parts."""
    from cdcflow.core.data.pipeline import runtime

    write_lanes = runtime.ChangefeedPipeline._write_lanes

    def without_files(self: Any, *args: Any) -> Any:
        *head, _chunk_files, one_ts = args
        return write_lanes(self, *head, (), one_ts)

    monkeypatch.setattr(runtime.ChangefeedPipeline, "_write_lanes", without_files)
    out = tmp_path / "out"
    out.mkdir()
    sink = LaneSink(out)
    # One table: partitioned by table, all of it would be one task's. Its rows carry their
    # upstream key, as a TiKV source's do, which the first step hashes.
    events = [
        replace(e, key=b"t_orders_r%08d" % e.image()["id"]) if isinstance(e, RowChange) else e
        for e in source_events()
        if not isinstance(e, RowChange) or e.table.table == "orders"
    ]
    run_pipeline(tmp_path, spark, [sink], "lanes", events)

    encoders = [json.loads(p.read_text()) for p in out.glob("encode-*")]
    # Several tasks encoded rows, at the same time, in Spark's workers.
    assert len([e for e in encoders if e["rows"]]) >= 2, encoders
    assert all(e["overlapped"] for e in encoders) and os.getpid() not in {e["pid"] for e in encoders}
    lanes: dict[str, list[Any]] = defaultdict(list)
    writers_of: dict[str, int] = defaultdict(int)
    for path in out.glob("lanes-*.json"):
        for lane, parts in json.loads(path.read_text())["lanes"].items():
            lanes[lane] += parts
            writers_of[lane] += 1
    assert set(lanes) == {"orders/0"} and set(writers_of.values()) == {1}
    rows = [tuple(p) for parts in lanes.values() for p in parts]
    assert sorted(rows) == sorted(expected_rows(events))  # every row once
    for parts in lanes.values():  # in commit order within the lane
        assert [p[3] for p in parts] == sorted(p[3] for p in parts)
    assert sink.committed and sink.committed[-1].end_ts == END_TS


def assert_lanes_hold_every_row_in_order(lanes: Mapping[str, list[Any]], events: list[Any], sink: LaneSink) -> None:
    """``lanes``: each lane's parts, a list per (batch, lane task) that wrote them. Every
    row is in them once, each list in commit order, and the batch reached the end."""
    rows = [tuple(p) for runs in lanes.values() for parts in runs for p in parts]
    assert sorted(rows) == sorted(expected_rows(events))  # every row once
    for runs in lanes.values():
        for parts in runs:  # a lane's rows of a batch, in commit order
            assert [p[3] for p in parts] == sorted(p[3] for p in parts)
    assert sink.committed and sink.committed[-1].end_ts == END_TS


def test_tasks_that_read_the_chunk_files_themselves_keep_each_lane_in_commit_order(tmp_path, spark, monkeypatch):
    """A batch big enough to be read apart (here: any batch) is not read by the data
    source: each encoding task reads its share of the batch's chunk files itself
    (ChunkRangesTask), and every lane still gets every row once, in commit order: the
    encoding tasks hand their parts to the lane tasks as sorted runs in the batch's work
    directory (no Spark shuffle), removed once the batch is written."""
    from cdcflow.core.data.pipeline import runtime

    shares: list[list[Any]] = []
    hand_offs: list[Path] = []
    hand_off_lanes = runtime.ChangefeedPipeline._hand_off_lanes

    def hand_off(self: Any, *args: Any, **kwargs: Any) -> Any:
        hand_offs.append(self.work_dir)
        return hand_off_lanes(self, *args, **kwargs)

    monkeypatch.setattr(runtime.ChangefeedPipeline, "_hand_off_lanes", hand_off)

    def split(files: Sequence[str], parts: int) -> list[list[tuple[str, int, int]]]:
        out = split_record_batches(files, parts)
        shares.append(out)
        return out

    monkeypatch.setattr(runtime, "MIN_SPLIT_ROWS", 1)
    monkeypatch.setattr(runtime, "split_record_batches", split)
    out = tmp_path / "out"
    out.mkdir()
    sink = LaneSink(out)
    events = keyed_events()
    run_pipeline(tmp_path, spark, [sink], "lanes-from-chunks", events, chunk_rows=10)  # batches of several files

    assert any(len(share) >= 2 for share in shares), shares  # batches split among tasks by the driver
    assert hand_offs and not [p for d in set(hand_offs) for p in d.glob("lanes-*")]
    encoders = [json.loads(p.read_text()) for p in out.glob("encode-*")]
    assert len([e for e in encoders if e["rows"]]) >= 2 and os.getpid() not in {e["pid"] for e in encoders}
    lanes: dict[str, list[Any]] = defaultdict(list)
    for path in out.glob("lanes-*.json"):
        for lane, parts in json.loads(path.read_text())["lanes"].items():
            lanes[lane].append(parts)
    assert_lanes_hold_every_row_in_order(lanes, events, sink)


def test_a_batch_of_less_than_two_tasks_rows_is_encoded_by_one_task_and_handed_off(tmp_path, spark, monkeypatch):
    """A batch with more rows than one task takes, but fewer than two tasks' worth of
    MIN_SPLIT_ROWS, is not shuffled: one task reads all its files and encodes them, and
    the lane tasks (every task slot) take its runs, each lane in commit order."""
    from cdcflow.core.data.pipeline import runtime

    readers: list[int] = []
    hand_off_lanes = runtime.ChangefeedPipeline._hand_off_lanes

    def hand_off(self: Any, *args: Any) -> Any:
        readers.append(args[-1])
        return hand_off_lanes(self, *args)

    monkeypatch.setattr(runtime.ChangefeedPipeline, "_hand_off_lanes", hand_off)
    monkeypatch.setattr(runtime, "MIN_SPLIT_ROWS", 10_000)  # every batch here is below one share
    out = tmp_path / "out"
    out.mkdir()
    sink = LaneSink(out)
    sink.encoders = 1
    events = keyed_events()
    run_pipeline(tmp_path, spark, [sink], "lanes-one-reader", events, chunk_rows=10)

    assert readers and set(readers) == {1}
    encoders = list(out.glob("encode-*"))
    assert encoders and {p.name.rsplit("-", 1)[1] for p in encoders} == {"0"}  # one encoding task per batch
    lanes: dict[str, list[Any]] = defaultdict(list)
    lane_tasks: dict[str, set[str]] = defaultdict(set)  # batch → its lane tasks
    for path in out.glob("lanes-*.json"):
        written = json.loads(path.read_text())
        assert written["pid"] != os.getpid()
        _, batch_id, partition = path.stem.split("-")
        lane_tasks[batch_id].add(partition)
        for lane, parts in written["lanes"].items():
            lanes[lane].append(parts)
    assert max(len(t) for t in lane_tasks.values()) >= 2  # a batch's lanes shared among lane tasks
    assert_lanes_hold_every_row_in_order(lanes, events, sink)


def record_whole_lanes(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """The ids of the batches written in whole lanes by several tasks, and of those whose
    parts were handed over, as they are written; every batch of two tasks' rows is split."""
    from cdcflow.core.data.pipeline import runtime

    whole: list[int] = []
    handed: list[int] = []
    map_read_apart = runtime.ChangefeedPipeline._map_read_apart
    hand_off_lanes = runtime.ChangefeedPipeline._hand_off_lanes

    def read_apart(self: Any, frame: Any, task: Any, *args: Any) -> Any:
        if isinstance(task, runtime.SortedTask) and isinstance(task.task, runtime.WriteTask) and args[1] > 1:
            whole.append(task.task.head.batch_id)
        return map_read_apart(self, frame, task, *args)

    def hand_off(self: Any, frame: Any, plan: Any, head: MicroBatch, *args: Any) -> Any:
        handed.append(head.batch_id)
        return hand_off_lanes(self, frame, plan, head, *args)

    monkeypatch.setattr(runtime.ChangefeedPipeline, "_map_read_apart", read_apart)
    monkeypatch.setattr(runtime.ChangefeedPipeline, "_hand_off_lanes", hand_off)
    monkeypatch.setattr(runtime, "MIN_SPLIT_ROWS", 1)
    return whole, handed


class _TableLaneRecorder(_LaneRecorder):
    """Says which lane each table's rows go to (the one its encode gives them)."""

    def table_lanes(self, table: TableName) -> list[tuple[str, int]]:
        return [(table.table, 0)]


class TableLaneSink(LaneSink):
    def task_writer(self, tables: Sequence[TableName]) -> TaskWriter:
        return _TableLaneRecorder(str(self.directory), self.encoders)


def test_tables_with_known_lanes_are_written_whole_each_by_one_task(tmp_path, spark, monkeypatch):
    """With each table's lane known before its rows are mounted (LaneTaskWriter.table_lanes)
    and two tables of about as many rows, a batch's two tasks take a table each: each reads
    that table's chunk files, sorts them and writes the whole lane in one step, with no
    parts handed over. A batch of one table's rows cannot be shared so: it is encoded by
    both tasks and handed over as before. Every lane holds every row once, in commit order."""
    whole, handed = record_whole_lanes(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    sink = TableLaneSink(out)
    sink.encoders = 1
    events = keyed_events()
    run_pipeline(tmp_path, spark, [sink], "whole-lanes", events, chunk_rows=10)

    assert whole, "no batch was written in whole lanes"
    assert not set(whole) & set(handed)
    lanes: dict[str, list[Any]] = defaultdict(list)
    writers_of: dict[tuple[str, str], set[str]] = defaultdict(set)  # (batch, lane) → its tasks
    tasks_of: dict[str, set[str]] = defaultdict(set)  # batch → tasks that wrote lanes
    for path in out.glob("lanes-*.json"):
        written = json.loads(path.read_text())
        assert written["pid"] != os.getpid()
        _, batch_id, partition = path.stem.split("-")
        for lane, parts in written["lanes"].items():
            lanes[lane].append(parts)
            writers_of[(batch_id, lane)].add(partition)
            tasks_of[batch_id].add(partition)
    assert all(len(tasks) == 1 for tasks in writers_of.values())  # a lane of a batch: one task
    for batch_id in map(str, whole):
        assert {lane for b, lane in writers_of if b == batch_id} == {"orders/0", "items/0"}
        assert len(tasks_of[batch_id]) == 2  # the two tables by two tasks
    assert_lanes_hold_every_row_in_order(lanes, events, sink)


def test_kafka_tables_on_partitions_of_their_own_are_produced_whole_each_by_one_task(tmp_path, spark, monkeypatch):
    """The Kafka sink under its default table dispatcher, with the two tables on different
    partitions: batches are produced by two tasks, a table each, and a consumer finds each
    table's rows in one partition, in commit order, and rebuilds the source's tables."""
    from cdcflow.core.data.events import ColumnInfo, TableSchema
    from cdcflow.plugins.sinks.kafka import KafkaSink, KafkaSinkConfig
    from cdcflow.plugins.sinks.kafka.dispatch import TableDispatcher

    whole, _ = record_whole_lanes(monkeypatch)
    tables = [TableName("shop", "orders"), TableName("shop", "items")]
    count = next(n for n in range(2, 64) if len({TableDispatcher().table_partition(t, n) for t in tables}) == 2)
    columns = (ColumnInfo("id", 8, ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY), ColumnInfo("v", 8, 0))
    events = [
        replace(e, schema=TableSchema(e.table, columns)) if isinstance(e, RowChange) else e for e in keyed_events()
    ]
    topic = f"whole-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(KafkaSinkConfig(uri=f"kafka://mock/{topic}", topic=topic, partition_num=count))
    run_pipeline(tmp_path, spark, [sink], "whole-lanes-kafka", events, chunk_rows=10)

    assert whole, "no batch was produced in whole lanes"
    found = kafka_rows(sink.bootstrap_servers, topic)
    rows: dict[str, list[tuple[int, int]]] = defaultdict(list)  # table → (commit ts, partition) in offset order
    for partition, table, ts, _, _ in found:
        rows[table].append((ts, partition))
    assert set(rows) == {"orders", "items"}
    for table, seen in rows.items():
        assert len({p for _, p in seen}) == 1, f"{table}: rows in several partitions"
        assert [ts for ts, _ in seen] == sorted(ts for ts, _ in seen), f"{table}: not in commit order"
    assert last_images(found) == source_images(events)


def test_a_joined_spans_backlog_keeps_its_lane_in_commit_order(tmp_path, spark):
    """A span that joins behind the published ts brings its backlog in batches whose ts
    range is that one ts (the chunk number moves, the ts stays), yet its rows have many
    commit ts: each lane still gets them from one task, in commit order."""
    out = tmp_path / "out"
    out.mkdir()
    sink = LaneSink(out)
    sink.encoders = 1  # small batches: one task encodes each
    backlog = [
        replace(insert("shop", "items", {"id": i, "v": 0}, commit_ts=1_000 + i), key=b"t_items_r%08d" % i)
        for i in range(400)
    ]
    join_behind(tmp_path, spark, sink, backlog, "joins-behind-lanes", task_rows=20)
    by_batch: dict[str, list[Any]] = defaultdict(list)
    for path in out.glob("lanes-*.json"):
        batch_id = path.name.split("-")[1]
        for lane, parts in json.loads(path.read_text())["lanes"].items():
            if lane == "items/0":
                by_batch[batch_id].append(parts)
    assert sorted(p[1] for runs in by_batch.values() for parts in runs for p in parts) == list(range(400))
    assert len(by_batch) >= 2  # the backlog came in several batches
    for runs in by_batch.values():
        assert len(runs) == 1  # one task wrote the lane's rows of the batch
        assert [p[3] for p in runs[0]] == sorted(p[3] for p in runs[0])


def test_spark_int_hash_is_the_hash_spark_partitions_by(spark):
    from pyspark.sql import functions as F

    from cdcflow.core.data.pipeline.query import spark_int_hash

    values = [*range(-50, 200), 2**31 - 1, -(2**31), 123_456_789]
    frame = spark.createDataFrame([(v,) for v in values], "v INT")
    got = {row.v: row.h for row in frame.select("v", F.hash("v").alias("h")).collect()}
    assert got == {v: spark_int_hash(v) for v in values}


@pytest.mark.parametrize("partitions", [2, 3, 5])
def test_lanes_are_placed_round_robin_on_the_tasks(spark, partitions):
    """Every lane goes to one task, and a route's lanes are spread as evenly as can be
    (hashing them would put 3 lanes on one of 2 tasks in a quarter of the batches)."""
    from pyspark.sql import functions as F

    from cdcflow.core.data.pipeline.query import lane_placement

    routes = ["orders", "bench-catchup-2f9c1a0e", "items"]
    parts = [(w, route, lane, i) for w in (0, 1) for route in routes for lane in range(3) for i in range(4)]
    frame = spark.createDataFrame(parts, "writer INT, route STRING, lane INT, i INT")
    placed = frame.repartition(partitions, lane_placement(partitions)).select(
        "writer", "route", "lane", F.spark_partition_id().alias("task")
    )
    tasks_of: dict[tuple[int, str, int], set[int]] = defaultdict(set)
    for row in placed.collect():
        tasks_of[(row.writer, row.route, row.lane)].add(row.task)
    assert len(tasks_of) == 2 * len(routes) * 3 and all(len(t) == 1 for t in tasks_of.values())
    for w in (0, 1):
        for route in routes:
            tasks = [next(iter(tasks_of[(w, route, lane)])) for lane in range(3)]
            assert len(set(tasks)) == min(3, partitions), (w, route, tasks)


def _frozen_in_task(batches: Any) -> Any:
    import gc

    import pyarrow as pa

    from cdcflow.core.data.pipeline.tasks import freeze_worker_heap

    gc.unfreeze()  # a reused worker: whatever an earlier task froze
    freeze_worker_heap()
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"frozen": gc.get_freeze_count()}])


def test_a_task_freezes_its_workers_heap_and_the_driver_keeps_its_own(spark: Any) -> None:
    import gc

    from cdcflow.core.data.pipeline.tasks import freeze_worker_heap

    before = gc.get_freeze_count()
    freeze_worker_heap()
    assert gc.get_freeze_count() == before  # not in a Spark task: nothing frozen
    frozen = [row.frozen for row in spark.range(0, 2, 1, 2).mapInArrow(_frozen_in_task, "frozen bigint").collect()]
    assert len(frozen) == 2 and min(frozen) > 1_000  # the worker's modules and classes, at least


def _collector_in_task(batches: Any) -> Any:
    import gc

    import pyarrow as pa

    from cdcflow.core.data.pipeline.tasks import paused_collector

    seen = []
    with paused_collector():
        seen.append(gc.isenabled())
        with paused_collector():
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())  # the inner pause left it to the outer one
    seen.append(gc.isenabled())
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"seen": "".join("on" if on else "off" for on in seen)}])


def test_a_task_pauses_the_collector_while_it_makes_rows_and_the_driver_keeps_its_own(spark: Any) -> None:
    import gc

    from cdcflow.core.data.pipeline.tasks import paused_collector

    with paused_collector():
        assert gc.isenabled()  # not in a Spark task: nothing paused
    seen = [row.seen for row in spark.range(0, 2, 1, 2).mapInArrow(_collector_in_task, "seen string").collect()]
    assert seen == ["offoffoffon"] * 2


def test_calls_run_in_threads_keep_the_callers_job_group_and_their_order(spark: Any) -> None:
    import threading

    from cdcflow.core.data.pipeline.session import run_in_threads, spark_job_group

    def call(n: int) -> Any:
        def run() -> tuple[int, str | None, str]:
            time.sleep(0.05 * (3 - n))  # the last call ends first
            group = spark.sparkContext.getLocalProperty("spark.jobGroup.id")
            return n, group, threading.current_thread().name

        return run

    with spark_job_group(spark, "cdcflow-test-writes", "writes of one batch"):
        out = run_in_threads(spark, [call(n) for n in range(3)], 3)
    assert [n for n, _, _ in out] == [0, 1, 2]
    assert {group for _, group, _ in out} == {"cdcflow-test-writes"}  # cancelling the group cancels their jobs
    assert len({thread for _, _, thread in out}) == 3
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None  # the caller's own, restored


def test_run_in_threads_raises_the_first_failure_once_every_call_ended(spark: Any) -> None:
    from cdcflow.core.data.pipeline.session import run_in_threads

    ended: list[str] = []

    def call(name: str, seconds: float, fails: bool) -> Any:
        def run() -> str:
            time.sleep(seconds)
            ended.append(name)
            if fails:
                raise ValueError(name)
            return name

        return run

    calls = [call("slow ok", 0.3, False), call("second fails", 0.1, True), call("third fails", 0.0, True)]
    with pytest.raises(ValueError, match="second fails"):
        run_in_threads(spark, calls, 3)
    assert sorted(ended) == ["second fails", "slow ok", "third fails"]
