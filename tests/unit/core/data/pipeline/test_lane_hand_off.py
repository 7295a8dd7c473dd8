"""Encoded parts handed from encoding tasks to lane tasks through sorted runs per lane."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

from cdcflow.core.data.pipeline.tasks import ENCODED_SCHEMA, LaneHandOff

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
