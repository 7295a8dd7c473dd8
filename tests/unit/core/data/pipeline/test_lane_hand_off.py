"""Encoded parts handed from encoding tasks to lane tasks through sorted runs per lane."""

from __future__ import annotations

import pickle
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from cdcflow.core.data.codec import EncodedMessage
from cdcflow.core.data.events import MicroBatch, RawKVEvent, RowChange, Span, TableSchema
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice.records import record_from_event, records_to_batch
from cdcflow.core.data.pipeline import tasks
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.pipeline.tasks import ENCODED_SCHEMA, EncodeTask, LaneHandOff, RowPlan
from cdcflow.core.data.sink import LaneTaskWriter, LaneWriter
from cdcflow.core.data.source import BatchMounter
from cdcflow.core.errors import DownstreamUnavailableError
from cdcflow.core.testing import insert

Part = tuple[int, str, int, int, int, bytes, int]


def _columns(parts: list[Part]) -> list[list[object]]:
    columns: list[list[object]] = [[] for _ in ENCODED_SCHEMA]
    for w, route, lane, commit_ts, start_ts, key, seq in parts:
        row = (w, route, lane, commit_ts, start_ts, key, seq, b"k" + key, b"v%d" % commit_ts, None)
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return columns


def _parts(n: int, seed: int = 5) -> list[Part]:
    rng = random.Random(seed)
    return [
        (
            rng.randrange(2),
            rng.choice(["orders", "items", "t"]),
            rng.randrange(3),
            rng.randrange(1, 500),
            0,
            b"%05d" % i,
            seq,
        )
        for i in range(n)
        for seq in range(rng.randrange(1, 3))
    ]


def test_each_lane_task_gets_its_lanes_parts_once_in_commit_order(tmp_path: Path) -> None:
    hand_off = LaneHandOff(str(tmp_path))
    parts = _parts(3_000)
    # Two encoding tasks, each writing two runs, in no order.
    for partition in range(2):
        mine = parts[partition::2]
        for run in range(2):
            hand_off.write_runs(_columns(mine[run::2]), partition, run)
    shares = hand_off.assign(2)
    assert len(shares) == 2 and sorted(n for share in shares for n in share) == sorted(
        p.name for p in tmp_path.iterdir()
    )

    got: dict[tuple[int, str, int], list[tuple[int, bytes, int]]] = defaultdict(list)
    tasks_of: dict[tuple[int, str, int], set[int]] = defaultdict(set)
    for task, share in enumerate(shares):
        for ts, start_ts, key, seq, w, route, lane, part_key, value in hand_off.parts(share):
            assert part_key == b"k" + key and value == b"v%d" % ts and start_ts == 0
            got[(w, route, lane)].append((ts, key, seq))
            tasks_of[(w, route, lane)].add(task)
    want: dict[tuple[int, str, int], list[tuple[int, bytes, int]]] = defaultdict(list)
    for w, route, lane, ts, _, key, seq in parts:
        want[(w, route, lane)].append((ts, key, seq))
    assert {lane: sorted(v) for lane, v in want.items()} == got  # every part once, each lane in order
    assert all(len(tasks) == 1 for tasks in tasks_of.values())  # a lane is written by one task


def test_lanes_are_shared_out_by_size(tmp_path: Path) -> None:
    """Two busy lanes go to two tasks, whatever their numbers (hashing them may not)."""
    hand_off = LaneHandOff(str(tmp_path))
    big = [(0, "t", lane, ts, 0, b"%d" % ts, 0) for lane in (0, 2) for ts in range(1, 2_000)]
    small = [(0, "t", 1, ts, 0, b"%d" % ts, 0) for ts in range(1, 20)]
    hand_off.write_runs(_columns(big + small), 0, 0)
    shares = hand_off.assign(2)
    busy = {hand_off.lane_dir(0, "t", lane).name for lane in (0, 2)}
    assert [len(busy & set(share)) for share in shares] == [1, 1]
    assert len(hand_off.assign(5)) == 3  # no more tasks than lanes
    (tmp_path / "empty").mkdir()
    assert LaneHandOff(str(tmp_path / "empty")).assign(2) == ()  # a batch without parts: no lane task


def test_a_rewritten_run_replaces_the_first_one(tmp_path: Path) -> None:
    """A retried encoding task writes its runs again under the same names."""
    hand_off = LaneHandOff(str(tmp_path))
    parts = [(0, "t", 0, ts, 0, b"%d" % ts, 0) for ts in (3, 1, 2)]
    hand_off.write_runs(_columns(parts), 0, 0)
    hand_off.write_runs(_columns(parts), 0, 0)
    (share,) = hand_off.assign(2)
    assert [p[0] for p in hand_off.parts(share)] == [1, 2, 3]
    assert not list(tmp_path.rglob("*.tmp"))


class _Mounter(BatchMounter):
    """Raw events of keys ``b"k<n>"`` as inserts of shop.t."""

    def mount(self, event: RawKVEvent) -> RowChange | None:
        row = insert("shop", "t", {"id": int(event.key[1:])}, commit_ts=event.commit_ts, start_ts=event.start_ts)
        return replace(row, key=event.key)

    def schemas(self) -> list[TableSchema]:
        return []


class _FailingLanes(LaneTaskWriter):
    """Encodes a row per part to lane ``id % 3``, and fails on the ``fail_on``-th call."""

    def __init__(self, fail_on: int) -> None:
        self.fail_on = fail_on
        self.calls = 0

    def encode(self, rows: Sequence[RowChange]) -> list[tuple[int, str, int, EncodedMessage]]:
        self.calls += 1
        if self.calls == self.fail_on:
            raise DownstreamUnavailableError("this row cannot be encoded")
        return [
            (i, "t", row.image()["id"] % 3, EncodedMessage(row.key, b"v", None, 1, row.commit_ts))
            for i, row in enumerate(rows)
        ]

    def open_lanes(self, batch: MicroBatch, partition: int) -> LaneWriter:
        raise AssertionError("an encoding task writes no lane")


def _raw_batches(n: int, per_batch: int) -> tuple[dict[int, Span], list[pa.RecordBatch]]:
    span = Span(1, b"k", b"l")
    events = [RawKVEvent(span, b"k%d" % i, b"x", b"", 10 + i, 11 + i) for i in range(n)]
    records = [record_from_event(e, 1, _NoSchemas()) for e in events]
    return {1: span}, [records_to_batch(records[i : i + per_batch]) for i in range(0, n, per_batch)]


class _NoSchemas:
    def id_of(self, schema: object) -> int:
        raise AssertionError("raw records carry no schema")


def _encode(tmp_path: Path, writer: LaneTaskWriter, batches: list[pa.RecordBatch], spans: dict[int, Span]) -> pa.Table:
    plan = RowPlan("cf", str(tmp_path), spans, _Mounter(), TableFilter())
    task = EncodeTask(plan, (writer,), ColumnSelection(), LaneHandOff(str(tmp_path / "lanes")))
    return pa.Table.from_batches(list(task(iter(batches))))


def test_an_encoding_task_that_hands_off_yields_its_summary_alone(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tasks, "_RUN_PARTS", 8)
    spans, batches = _raw_batches(40, 5)
    out = _encode(tmp_path, _FailingLanes(fail_on=0), batches, spans)
    assert out.num_rows == 1 and out["writer"].to_pylist() == [-1]
    summary = pickle.loads(out["summary"][0].as_py())
    assert summary["rows"] == 40 and not summary["error"]
    hand_off = LaneHandOff(str(tmp_path / "lanes"))
    parts = [p for share in hand_off.assign(3) for p in hand_off.parts(share)]
    assert sorted(p[2] for p in parts) == sorted(b"k%d" % i for i in range(40))
    assert len(list((tmp_path / "lanes").rglob("*.arrow"))) == 3 * 4  # runs of 10 parts (two batches reach 8), per lane


def test_an_encoding_error_with_parts_not_yet_in_runs_reaches_the_driver_in_the_summary(
    tmp_path: Path, monkeypatch
) -> None:
    """Parts held when the error came are dropped: the task yields its summary alone, with the error."""
    monkeypatch.setattr(tasks, "_RUN_PARTS", 8)
    spans, batches = _raw_batches(40, 5)
    out = _encode(tmp_path, _FailingLanes(fail_on=4), batches, spans)  # after one run (10 parts) and one batch more
    assert out.num_rows == 1 and out["writer"].to_pylist() == [-1]
    error = pickle.loads(pickle.loads(out["summary"][0].as_py())["error"])
    assert isinstance(error, DownstreamUnavailableError) and "cannot be encoded" in str(error)


def test_parts_that_tie_on_the_order_keep_their_runs_order(tmp_path: Path) -> None:
    """Rows without a key tie on (commit_ts, start_ts, key, seq), and a part's key may be
    None: the merge compares the order alone and keeps the runs' order."""
    hand_off = LaneHandOff(str(tmp_path))
    for partition, part_key, values in [(0, None, [b"z", b"y"]), (1, b"k", [b"a", b"b"])]:
        columns = _columns([(0, "t", 0, 5, 4, b"", 0), (0, "t", 0, 5, 4, b"", 0)])
        columns[7] = [part_key, part_key]
        columns[8] = values
        hand_off.write_runs(columns, partition, 0)
    (share,) = hand_off.assign(1)
    assert [p[8] for p in hand_off.parts(share)] == [b"z", b"y", b"a", b"b"]
