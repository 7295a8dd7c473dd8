"""Spark sink, a batch written from its frame: the parts one pass of tasks makes, unpacked per
table, are the records the driver would make of the whole batch (no Spark needed)."""

from __future__ import annotations

import decimal
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdcflow.core.data.events import RowChange
from cdcflow.core.errors import CdcflowError
from cdcflow.core.testing import delete, insert, update
from cdcflow.plugins.sinks.spark import batchframe
from cdcflow.plugins.sinks.spark.batchframe import (
    CHANGELOG,
    PartsTask,
    UnpackTask,
    arrow_batch,
    changelog_columns,
    changes_columns,
    read_parts,
)
from cdcflow.plugins.sinks.spark.frames import (
    change_records,
    changelog_records,
    decimal_ints,
    delta_records,
    image_columns,
)

BATCH_ID = 7


def parts_of(
    monkeypatch: pytest.MonkeyPatch, task: PartsTask, partitions: Sequence[Iterator[list[RowChange]]]
) -> pa.Table:
    """Every partition's parts, as the parts frame holds them (partition after partition)."""
    out = []
    for partition, row_lists in enumerate(partitions):
        monkeypatch.setattr(batchframe, "_partition", lambda p=partition: p)
        out.extend(task(row_lists))
    return pa.Table.from_batches(out)


def meta(parts: pa.Table) -> list[dict[str, Any]]:
    return parts.drop_columns(["payload"]).to_pylist()


def unpack(parts: pa.Table, table: str, task: UnpackTask, kind_match: Any) -> pa.Table:
    of_table = parts.filter(pc.and_(pc.equal(parts["table_name"], table), kind_match(parts)))
    return pa.Table.from_batches(list(task(iter(of_table.to_batches(max_chunksize=2)))))


def same(got: pa.Table, expected: pa.RecordBatch) -> None:
    assert got.schema == expected.schema
    assert got.combine_chunks().to_pylist() == pa.Table.from_batches([expected]).to_pylist()


def lists(rows: Sequence[RowChange], size: int) -> Iterator[list[RowChange]]:
    for i in range(0, len(rows), size):
        yield list(rows[i : i + size])


def test_the_change_log_from_parts_equals_the_records_of_the_whole_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Partition 0 sees "b" NULL throughout, "c" as ints and a column its parts cannot convert
    # as they are ("m": an int, then a string); partition 1 sees "b" as strings, "c" as
    # decimals, a new column "e", and its images' columns in another order.
    first = [
        insert("s", "t", {"a": 1, "b": None, "c": 3, "m": 5}, commit_ts=10),
        insert("s", "u", {"k": 1}, commit_ts=10),
        update("s", "t", {"a": 1, "b": None, "c": 3, "m": 5}, {"a": 1, "b": None, "c": 4, "m": "x"}, commit_ts=11),
        insert("s", "t", {"a": 2, "b": None, "c": 5, "m": 6}, commit_ts=12),
    ]
    second = [
        insert("s", "t", {"e": True, "c": decimal.Decimal("1.25"), "b": "y", "a": 3}, commit_ts=13),
        delete("s", "t", {"a": 2, "b": None, "c": 5}, commit_ts=14),
        insert("s", "u", {"k": 2}, commit_ts=14),
    ]
    task = PartsTask(BATCH_ID, {}, changelog=True, changes=False, part_rows=2)
    parts = parts_of(monkeypatch, task, [lists(first, 3), lists(second, 1)])
    found = read_parts(meta(parts))
    assert pc.any(parts["pickled"]).as_py()  # the part with "m": 5 and "m": "x"
    for name in ("t", "u"):
        rows = [r for r in (*first, *second) if r.table.table == name]
        types = image_columns(rows)
        assert found[("s", name)].whole.types == types
        assert found[("s", name)].whole.rows == len(rows)
        expected = arrow_batch(
            changelog_records(decimal_ints(rows, types), list(types), BATCH_ID), changelog_columns(types)
        )
        unpacker = UnpackTask(changelog_columns(types), found[("s", name)].whole.offsets, "seq")
        same(unpack(parts, name, unpacker, lambda p: pc.equal(p["kind"], CHANGELOG)), expected)


def test_snapshot_changes_from_parts_equal_the_records_of_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # A DDL at ts 20 cuts table t's rows into two steps; t's key is configured, u has none.
    first = [
        insert("s", "t", {"id": 1, "v": None}, commit_ts=10),
        update("s", "t", {"id": 1, "v": None}, {"id": 2, "v": 1}, commit_ts=11),  # moves its key
        insert("s", "u", {"x": 1}, commit_ts=12),
        insert("s", "t", {"id": 3, "v": 2, "w": "a"}, commit_ts=21),
    ]
    second = [
        delete("s", "t", {"id": 2, "v": 1}, commit_ts=15),
        update("s", "u", {"x": 1}, {"x": 2}, commit_ts=16),
        update("s", "t", {"id": 3, "v": 2, "w": "a"}, {"id": 3, "v": 3, "w": None}, commit_ts=22),
    ]
    task = PartsTask(BATCH_ID, {("s", "t"): (20,)}, changelog=True, changes=True, key_columns={"s.t": ("id",)})
    parts = parts_of(monkeypatch, task, [lists(first, 2), lists(second, 2)])
    found = read_parts(meta(parts))
    table_t = found[("s", "t")]
    assert sorted(table_t.steps) == [0, 1] and table_t.whole.rows == 5
    for step, low, high in ((0, 0, 20), (1, 20, 99)):
        rows = [r for r in (*first, *second) if r.table.table == "t" and low <= r.commit_ts < high]
        rows.sort(key=lambda r: r.commit_ts)  # the batch's order: partition 0's rows of the step first
        rows = [r for r in (*first, *second) if r in rows]
        types = image_columns(rows)
        part = table_t.steps[step]
        assert (part.types, part.keys, part.rows) == (types, ("id",), len(rows))
        expected = arrow_batch(
            change_records(decimal_ints(rows, types), list(types), ("id",)), changes_columns(types, True)
        )
        unpacker = UnpackTask(changes_columns(types, True), part.offsets, "_seq", 2)
        in_step = lambda p, s=step: pc.and_(pc.not_equal(p["kind"], CHANGELOG), pc.equal(p["step"], s))  # noqa: E731
        same(unpack(parts, "t", unpacker, in_step), expected)
    rows_u = [r for r in (*first, *second) if r.table.table == "u"]
    types_u = image_columns(rows_u)
    assert found[("s", "u")].steps[0].keys == ()
    expected_u = arrow_batch(delta_records(rows_u, list(types_u)), changes_columns(types_u, False))
    deltas = UnpackTask(changes_columns(types_u, False), {})
    same(unpack(parts, "u", deltas, lambda p: pc.not_equal(p["kind"], CHANGELOG)), expected_u)


def test_a_row_that_did_not_mount_stops_the_batch_when_the_parts_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing() -> Iterator[list[RowChange]]:
        yield [insert("s", "t", {"a": 1}, commit_ts=10)]
        raise CdcflowError("row of s.t (key 0x01) at commit ts 11 does not decode")

    task = PartsTask(BATCH_ID, {}, changelog=True, changes=False)
    parts = parts_of(monkeypatch, task, [lists([insert("s", "t", {"a": 0}, commit_ts=9)], 1), failing()])
    with pytest.raises(CdcflowError, match="does not decode"):
        read_parts(meta(parts))


def test_partitions_that_disagree_on_a_tables_key_stop_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Both partitions' rows of s.t take the configured key. A part made without one (its
    # rows naming no key, as a partition whose rows came without a schema would) beside
    # parts made with it would mix deltas with change records: refused, not written.
    keyed = [insert("s", "t", {"id": 1}, commit_ts=10)]
    task = PartsTask(BATCH_ID, {}, changelog=False, changes=True, key_columns={"s.t": ("id",)})
    parts = parts_of(monkeypatch, task, [lists(keyed, 1), lists([insert("s", "t", {"id": 2}, commit_ts=11)], 1)])
    assert read_parts(meta(parts))[("s", "t")].steps[0].keys == ("id",)  # both partitions agree

    rows = meta(parts)
    rows[1]["info"] = pickle.dumps((keyed[0].table, {"id": "bigint"}, ()))  # as a partition without the key made it
    with pytest.raises(CdcflowError, match="different key columns"):
        read_parts(rows)
