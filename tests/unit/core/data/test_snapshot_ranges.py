"""Key-range arithmetic of a snapshot shared by a cluster: what is left once some ranges are delivered."""

from __future__ import annotations

import itertools
import random

from cdcflow.core.data.events import Span
from cdcflow.core.data.snapshot_ranges import SnapshotRecord, merged, remaining


def span(start: str, end: str, table: int = 1) -> Span:
    return Span(table, start.encode(), end.encode())


def test_merged_joins_overlapping_and_adjacent_ranges_of_a_table() -> None:
    got = merged([span("c", "e"), span("a", "c"), span("f", ""), span("g", "h"), span("b", "d", 2), span("x", "y", 2)])
    assert got == [span("a", "e"), span("f", ""), span("b", "d", 2), span("x", "y", 2)]


def test_remaining_cuts_out_what_was_delivered() -> None:
    assert remaining([span("a", "z")], [span("b", "c"), span("d", "e")]) == [
        span("a", "b"),
        span("c", "d"),
        span("e", "z"),
    ]
    assert remaining([span("a", "")], [span("b", "c"), span("d", "")]) == [span("a", "b"), span("c", "d")]
    assert remaining([span("a", "c"), span("c", "e")], [span("a", "c")]) == [span("c", "e")]
    assert remaining([span("b", "c")], [span("a", "")]) == []
    assert remaining([span("b", "c")], [span("a", "c", 2)]) == [span("b", "c")], "another table's range"
    assert remaining([span("a", "c")], []) == [span("a", "c")]


def test_remaining_keys_are_exactly_the_keys_not_delivered() -> None:
    """Regions re-cut between two plans: every key is read once, by the old plan or the new."""
    rng = random.Random(7)
    keys = [bytes([k]) for k in range(1, 60)]

    def cut(points: list[int]) -> list[Span]:
        bounds = [b""] + [bytes([p]) for p in sorted(set(points))] + [b""]
        return [Span(1, a, b) for a, b in itertools.pairwise(bounds)]

    for _ in range(200):
        old = cut(rng.sample(range(2, 60), rng.randint(0, 8)))
        done = rng.sample(old, rng.randint(0, len(old)))
        new = cut(rng.sample(range(2, 60), rng.randint(0, 8)))
        left = remaining(new, done)
        for key in keys:
            delivered = any(s.contains(key) for s in done)
            assert sum(s.contains(key) for s in left) == (0 if delivered else 1), (key, done, new, left)


def test_a_record_survives_json() -> None:
    record = SnapshotRecord(5, (span("a", ""), span("b", "c", 2)), 3, 7, 300, False, 1.5, None, "region")
    assert SnapshotRecord.from_json(record.to_json()) == record
    done = SnapshotRecord(5, (span("a", ""),), 7, 7, 700, True, 1.5, 9.0)
    assert SnapshotRecord.from_json(done.to_json()) == done
