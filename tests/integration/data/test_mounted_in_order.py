"""A batch's raw records are range-sorted before they are mounted: the rows come out in the
batch's order (partitions in order, each sorted by commit ts, start ts, key), the same rows
in the same order as mounting first and sorting the rows; and tasks that each sort the
batch's chunk files and keep their run of it give the same order, run after run."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from cdcflow.core.data.events import RawKVEvent, RowChange
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice.records import (
    SPARK_SCHEMA_DDL,
    batch_to_records,
    event_from_record,
    record_from_event,
    records_to_batch,
)
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.pipeline.datasource import split_record_batches
from cdcflow.core.data.pipeline.query import ORDER_COLUMNS
from cdcflow.core.data.pipeline.runtime import ChangefeedPipeline
from cdcflow.core.data.pipeline.tasks import (
    ChunkRangesTask,
    MountTask,
    OrderedRunsTask,
    RowPlan,
    RowsTask,
    check_mounted,
    pass_records,
)
from cdcflow.plugins.sources.tikv.rawkv import KeySpace, RawKVBatchMounter
from tests.fixtures.spark import spark

pytestmark = pytest.mark.integration

__all__ = ["spark"]

KEYSPACE = KeySpace("rawkv", [(b"a", b"m"), (b"m", b"")])


def _events() -> list[RawKVEvent]:
    """Transactions of several keys each, many at one commit ts; puts, updates, deletes."""
    rng = random.Random(7)
    spans = [KEYSPACE.span(t) for t in KEYSPACE.tables]
    out = []
    for txn in range(400):
        commit_ts = 1_000 + txn // 3  # three transactions share each commit ts
        start_ts = commit_ts - 1 - txn % 3
        for key in rng.sample(range(500), 4):
            raw = (b"a" if key % 2 else b"q") + key.to_bytes(4, "big")
            span = spans[0] if raw < b"m" else spans[1]
            delete = rng.random() < 0.1
            old = b"" if rng.random() < 0.5 else b"old-%d" % key
            out.append(RawKVEvent(span, raw, b"" if delete else b"v-%d" % txn, old, start_ts, commit_ts, delete))
    rng.shuffle(out)
    return out


MOUNTER = RawKVBatchMounter(KEYSPACE)


class _NoIds:
    """Raw records name no schema."""

    def id_of(self, schema: Any) -> int:
        raise AssertionError("a raw record has no schema")


def _plan(tmp_path: Any) -> RowPlan:
    mounter = MOUNTER
    spans = {i: KEYSPACE.span(t) for i, t in enumerate(KEYSPACE.tables)}
    ids = {schema: i for i, schema in enumerate(mounter.schemas())}
    return RowPlan("cf", str(tmp_path), spans, mounter, TableFilter(["*.*"]), ids)


def _rows(frame: Any, plan: RowPlan) -> list[RowChange]:
    schemas = {i: schema for schema, i in plan.schema_ids.items()}
    out = []
    for batch in frame.toArrow().to_batches():
        check_mounted(batch)
        for record in batch_to_records(batch):
            row = event_from_record(record, plan.spans.__getitem__, schemas)
            assert isinstance(row, RowChange)
            out.append(row)
    return out


@pytest.fixture
def four_partitions(spark: Any) -> Iterator[None]:
    """Sorts into four partitions, not coalesced into one for being small."""
    settings = {"spark.sql.shuffle.partitions": "4", "spark.sql.adaptive.coalescePartitions.enabled": "false"}
    before = {name: spark.conf.get(name) for name in settings}
    for name, value in settings.items():
        spark.conf.set(name, value)
    yield
    for name, value in before.items():
        spark.conf.set(name, value)


@pytest.mark.usefixtures("four_partitions")
def test_records_sorted_before_mounting_give_the_rows_in_the_batch_order(spark: Any, tmp_path: Any) -> None:
    plan = _plan(tmp_path)
    span_ids = {span: i for i, span in plan.spans.items()}
    events = _events()
    records = [record_from_event(e, span_ids[e.span], _NoIds()) for e in events]
    raw = spark.createDataFrame(pa.Table.from_batches([records_to_batch(records)])).repartition(5)

    ordered = ChangefeedPipeline._mounted_in_order(raw, plan)
    assert ordered.rdd.getNumPartitions() > 1  # a range sort over several partitions, read in order
    rows = _rows(ordered, plan)

    expected = sorted(events, key=RawKVEvent.sort_key)
    assert [(r.commit_ts, r.start_ts, r.key) for r in rows] == [e.sort_key() for e in expected]
    assert rows == [MOUNTER.mount(e) for e in expected]
    # What the pipeline did before: mount every record, then sort the rows.
    mounted_then_sorted = raw.mapInArrow(MountTask(plan), SPARK_SCHEMA_DDL).orderBy(*ORDER_COLUMNS)
    assert _rows(mounted_then_sorted, plan) == rows


@dataclass(frozen=True)
class _Positions:
    """A ``map_rows`` function: each row's partition and order columns, in the order given."""

    def __call__(self, row_lists: Iterator[list[RowChange]]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        for rows in row_lists:
            yield pa.RecordBatch.from_pylist(
                [
                    {"partition": context.partitionId(), "commit_ts": r.commit_ts, "start_ts": r.start_ts, "key": r.key}
                    for r in rows
                ],
                schema=_POSITIONS,
            )


_POSITIONS = pa.schema(
    [("partition", pa.int32()), ("commit_ts", pa.int64()), ("start_ts", pa.int64()), ("key", pa.binary())]
)


def test_ordered_runs_hand_each_task_its_run_of_the_batch_in_order(spark: Any, tmp_path: Any) -> None:
    # The batch's records in four chunk files, each in no particular order.
    plan = _plan(tmp_path)
    span_ids = {span: i for i, span in plan.spans.items()}
    events = _events()
    files = []
    for n in range(4):
        records = [record_from_event(e, span_ids[e.span], _NoIds()) for e in events[n::4]]
        path = tmp_path / f"chunk-{n}.arrow"
        batch = records_to_batch(records)
        with pa.ipc.new_file(str(path), batch.schema) as writer:
            for first in range(0, batch.num_rows, 100):  # several record batches per file
                writer.write_batch(batch.slice(first, 100))
        files.append(str(path))

    reader = ChunkRangesTask((tuple(split_record_batches(files, 1)[0]),), pass_records, TableFilter(["*.*"]))
    task = OrderedRunsTask(reader, 3, RowsTask(plan, ColumnSelection(), _Positions()))
    got = spark.range(0, 3, 1, 3).mapInArrow(task, "partition int, commit_ts bigint, start_ts bigint, key binary")
    rows = got.toArrow().to_pylist()

    expected = [e.sort_key() for e in sorted(events, key=RawKVEvent.sort_key)]
    assert [(r["commit_ts"], r["start_ts"], r["key"]) for r in rows] == expected
    sizes = [sum(1 for r in rows if r["partition"] == p) for p in range(3)]
    assert sizes == [len(events) // 3, 2 * len(events) // 3 - len(events) // 3, len(events) - 2 * len(events) // 3]
    assert [r["partition"] for r in rows] == sorted(r["partition"] for r in rows)  # runs in partition order
