"""A connector's transforms run in the Spark tasks that write each partition: a filter
turns updates into inserts and deletes as rows enter and leave it, and a route merges
sharded tables into one, in Spark's Python workers, for every task-writing sink."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.events import MicroBatch, RowChange, TableName
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.sink import PartitionWriter, Sink, TaskWriter
from cdcflow.core.data.transform import TransformChain, TransformStep
from cdcflow.core.plugin import PluginConfig
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import ListSource, delete, insert, until, update
from cdcflow.plugins.sinks.file.sink import FileSink, FileSinkConfig
from cdcflow.plugins.transforms.filter import FilterConfig, FilterTransform
from cdcflow.plugins.transforms.route import RouteConfig, RouteRule, RouteTransform

pytestmark = pytest.mark.integration

SHARDS = 3
USERS = 40
END_TS = 100_000


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session

    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master != "local[2]":
        active.stop()
    session = spark_session(SparkSettings(master="local[2]"))
    yield session
    stop_spark_session()


def source_events() -> list[Any]:
    """Users of three shards (ids repeat across shards), then updates that move some of
    them across ``v >= 10`` both ways, and deletes; plus a table no transform touches."""
    out: list[Any] = []
    ts = 1_000
    for shard in range(SHARDS):
        for i in range(USERS):
            ts += 10
            out.append(insert(f"shard_{shard}", "users", {"id": i, "v": i % 20, "name": f"u{shard}-{i}"}, commit_ts=ts))
    for shard in range(SHARDS):
        for i in range(USERS):
            before = {"id": i, "v": i % 20, "name": f"u{shard}-{i}"}
            if i % 4 == 0:  # 0, 4, 8 enter; 12, 16 stay; 20, 24, 28 enter; 32, 36 stay
                after = {**before, "v": before["v"] + 10}
            elif i % 4 == 1:  # 1, 5, 9 stay out; 13, 17, 33, 37 leave; 21, 25, 29 stay out
                after = {**before, "v": before["v"] - 10 if before["v"] >= 10 else before["v"]}
            elif i % 4 == 2:
                out.append(delete(f"shard_{shard}", "users", before, commit_ts=(ts := ts + 10)))
                continue
            else:  # stay where they are, with a new name
                after = {**before, "name": before["name"] + "!"}
            out.append(update(f"shard_{shard}", "users", before, after, commit_ts=(ts := ts + 10)))
    for i in range(10):
        out.append(insert("shop", "orders", {"id": i, "v": i}, commit_ts=(ts := ts + 10)))
    out.append(ListSource.resolved(END_TS))
    return out


def chain() -> TransformChain:
    shards = TableFilter(["shard_*.users"])
    return TransformChain(
        [
            TransformStep("transforms[0] (filter)", FilterTransform(FilterConfig(where="v >= 10")), shards),
            TransformStep(
                "transforms[1] (route)",
                RouteTransform(
                    RouteConfig(
                        routes=[RouteRule(source=r"shard_(\d+)\.users", target="all.users")],
                        source_column="_shard",
                        source_column_in_key=True,
                    )
                ),
                shards,
            ),
        ]
    )


def expected_changes() -> list[tuple[str, str, str, int]]:
    """What the chain makes of the source's changes, worked out here row by row:
    ``(op, table, source shard, id)`` with the op the filter's rule gives."""
    want = []
    for event in source_events():
        if not isinstance(event, RowChange):
            continue
        table = f"{event.table.schema}.{event.table.table}"
        image = event.after or event.before
        assert image is not None
        if event.table.schema == "shop":
            want.append((event.op.value, table, "", image["id"]))
            continue
        new = event.after is not None and event.after["v"] >= 10
        old = event.before is not None and event.before["v"] >= 10
        op = {
            (True, True): "update",
            (False, True): "insert",
            (True, False): "delete",
        }.get((old, new))
        if event.op.value == "insert":
            op = "insert" if new else None
        if event.op.value == "delete":
            op = "delete" if old else None
        if op is not None:
            want.append((op, "all.users", table, image["id"]))
    return want


def expected_final() -> dict[tuple[str, int], dict[str, Any]]:
    """The rows of ``all.users`` at the end: the source's final rows with v >= 10."""
    state: dict[tuple[str, int], dict[str, Any]] = {}
    for event in source_events():
        if isinstance(event, RowChange) and event.table.schema.startswith("shard_"):
            key = (event.table.schema + ".users", (event.after or event.before or {})["id"])
            if event.after is None:
                state.pop(key, None)
            else:
                state[key] = dict(event.after)
    return {k: {**v, "_shard": k[0]} for k, v in state.items() if v["v"] >= 10}


# -- a sink whose partition writers record their rows and process --------------------


class RecordingConfig(PluginConfig):
    pass


class _Recorder(TaskWriter):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def open(self, batch: MicroBatch, partition: int) -> PartitionWriter:
        return _RecordingWriter(Path(self.directory) / f"{batch.batch_id}-{partition}.json")


class _RecordingWriter(PartitionWriter):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []

    def write(self, rows: list[RowChange]) -> None:
        for r in rows:
            image = r.after or r.before
            assert image is not None
            schema = [c.name for c in r.schema.columns] if r.schema is not None else None
            self.rows.append(
                {"op": r.op.value, "table": str(r.table), "image": image, "ts": r.commit_ts, "schema": schema}
            )

    def flush(self) -> None:
        self.path.write_text(json.dumps({"pid": os.getpid(), "rows": self.rows}))


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
        self.committed.append(batch)


def run_pipeline(tmp_path: Path, spark: Any, sinks: list[Sink[Any]]) -> None:
    source = ListSource.of(source_events())

    async def run() -> None:
        executor = PipelineSpanExecutor(
            PipelineContext(
                "transforms",
                source,
                sinks,
                data_dir=tmp_path / "data",
                start_ts=0,
                spark=spark,
                plugins=PluginManager.default(autoload=False),
                transforms=chain(),
                trigger_interval=0.2,
                task_rows=40,  # several partitions for this small batch
            )
        )
        for table in await source.list_tables():
            for span in await source.spans_for(table):
                assert await executor.add_span(span, 0, prepare=False)
        await until(lambda: executor.checkpoint_ts >= END_TS, timeout=180, observe=executor.error)
        await executor.close()

    asyncio.run(run())


def test_filter_and_route_run_in_the_spark_tasks_of_every_task_writing_sink(tmp_path, spark):
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    recorder = RecordingSink(recorded)
    files = FileSink(FileSinkConfig(path=str(tmp_path / "files"), fsync=False))
    run_pipeline(tmp_path, spark, [recorder, files])

    docs = [json.loads(p.read_text()) for p in sorted(recorded.glob("*.json"))]
    # Written (and so transformed) in Spark's Python workers, by several partitions.
    pids = {d["pid"] for d in docs}
    assert pids and os.getpid() not in pids
    assert len(docs) >= 2

    rows = [r for d in docs for r in d["rows"]]
    got = sorted((r["op"], r["table"], r["image"].get("_shard", ""), r["image"]["id"]) for r in rows)
    assert got == sorted(expected_changes())
    # Each routed row carries its shard and the routed schema (the key includes _shard).
    for r in rows:
        if r["table"] == "all.users":
            assert r["schema"] is None or r["schema"][-1] == "_shard"
            assert r["image"]["_shard"].startswith("shard_")

    # The file sink wrote the same changes under all/users; replayed in commit order
    # per key, they leave exactly the filtered rows of every shard.
    final: dict[tuple[str, int], dict[str, Any]] = {}
    changes = []
    for path in (tmp_path / "files" / "all" / "users").glob("0*.jsonl"):
        for line in path.read_text().splitlines():
            changes.append(json.loads(line))
    assert not list((tmp_path / "files").glob("shard_*")), "rows of a shard reached its own table"
    for doc in sorted(changes, key=lambda d: d["commit_ts"]):
        image = doc["after"] or doc["before"]
        key = (image["_shard"], image["id"])
        if doc["op"] == "delete":
            assert key in final, f"a delete of a row the filter never let in: {key}"
            del final[key]
        else:
            assert (doc["op"] == "insert") == (key not in final), (doc["op"], key)
            final[key] = doc["after"]
    assert final == expected_final()
    assert recorder.committed and recorder.committed[-1].end_ts == END_TS
