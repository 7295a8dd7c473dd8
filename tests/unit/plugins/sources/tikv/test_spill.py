"""The matcher with a memory budget: spilled to disk it gives exactly what it gives in memory.

Each scenario is a region's entries (real ``cdcpb`` rows) played through a
matcher the way the EventFeed client plays them: changes before INITIALIZED
are held, released at INITIALIZED, emitted directly after. The same entries
go through an unbounded matcher and through matchers whose budget forces
every entry, or some of them at random moments, to disk; the emitted
changes, their order, the unmatched commits and the skipped counts must be
identical, and the accounted bytes never pass the budget.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2
from cdcflow.plugins.sources.tikv.matcher import Committed, Matcher, UnmatchedCommitError
from cdcflow.plugins.sources.tikv.spill import FeedMemory

Event = cdcpb_pb2.Event
Row = cdcpb_pb2.Event.Row
CHECKPOINT = 100

# (region, row) pairs; region 0 and 1 share one FeedMemory.
Script = list[tuple[int, Any]]


def row(kind: int, key: bytes, start: int, commit: int = 0, value: bytes = b"", **kw: Any) -> Any:
    return Row(type=kind, key=key, start_ts=start, commit_ts=commit, value=value, **kw)  # type: ignore[arg-type]


class Region:
    """One region subscription as the client drives its matcher."""

    def __init__(self, memory: FeedMemory) -> None:
        self.matcher = Matcher(CHECKPOINT, memory)
        self.initialized = False
        self.out: list[Any] = []

    def feed(self, r: Any) -> None:
        m = self.matcher
        try:
            if r.type == Event.INITIALIZED:
                self.initialized = True
                m.initialized()
                self.out.extend(_plain(c) for c in m.release())
            elif r.type == Event.COMMITTED:
                self._deliver(m.committed(r))
            elif r.type == Event.PREWRITE:
                for change in m.prewrite(r, self.initialized):
                    self._deliver(change)
            elif r.type == Event.COMMIT:
                self._deliver(m.commit(r, self.initialized))
            elif r.type == Event.ROLLBACK:
                m.rollback(r)
        except UnmatchedCommitError:
            self.out.append(("unmatched", r.key, r.start_ts, r.commit_ts))

    def _deliver(self, change: Committed | None) -> None:
        if change is None:
            return
        if self.initialized:
            self.out.append(_plain(change))
        else:
            self.matcher.hold(change)


def _plain(c: Committed) -> tuple[bytes, bytes, bytes, int, int, bool]:
    return (c.key, c.value, c.old_value, c.start_ts, c.commit_ts, c.delete)


@contextmanager
def feed_memory(budget: int | None) -> Iterator[FeedMemory]:
    with tempfile.TemporaryDirectory() as tmp:
        memory = FeedMemory(budget, Path(tmp) / "spill")
        yield memory
        memory.close()


def play(script: Script, budget: int | None) -> tuple[list[list[Any]], list[int], FeedMemory]:
    """Play ``script`` with a shared budget; returns each region's output, its skipped
    commits and pending prewrites at the end, and the account."""
    with feed_memory(budget) as memory:
        regions = [Region(memory), Region(memory)]
        for index, r in script:
            regions[index].feed(r)
            if budget is not None:
                assert memory.used <= budget
        outputs = [region.out for region in regions]
        counts = [n for region in regions for n in (region.matcher.skipped, len(region.matcher))]
        for region in regions:
            region.matcher.close()
        assert memory.used == 0
        return outputs, counts, memory


# -- generated scenarios ----------------------------------------------------------------

KEYS = [b"k0", b"k1", b"k2", b"k3"]
TXNS = [90, 101, 102, 103, 104]  # 90: committed at or below the checkpoint


@st.composite
def scripts(draw: st.DrawFn) -> Script:
    """Entries of two regions: prewrites (heartbeats, generations), commits (some before their
    prewrite, some stale), rollbacks, scan COMMITTED rows (some repeated live), INITIALIZED."""
    out: Script = []
    scanned: Script = []
    n = draw(st.integers(1, 60))
    init_at = [draw(st.integers(0, n)), draw(st.integers(0, n + 5))]
    for i in range(n):
        for region in (0, 1):
            if init_at[region] == i:
                out.append((region, row(Event.INITIALIZED, b"", 0)))
        region = draw(st.integers(0, 1))
        key = draw(st.sampled_from(KEYS))
        start = draw(st.sampled_from(TXNS))
        # Few commit ts: many changes share one (ties are ordered by arrival).
        commit = start + (5 if start == 90 else draw(st.integers(1, 3)))
        kinds = ["prewrite", "prewrite", "heartbeat", "commit", "commit", "rollback", "committed", "again"]
        kind = draw(st.sampled_from(kinds))
        if kind == "prewrite":
            value = draw(st.binary(min_size=1, max_size=30))
            gen = draw(st.integers(0, 2))
            op = draw(st.sampled_from([Row.PUT, Row.DELETE]))
            old = draw(st.sampled_from([b"", b"old-" + key]))
            out.append(
                (region, row(Event.PREWRITE, key, start, value=value, op_type=op, old_value=old, generation=gen))
            )
        elif kind == "heartbeat":
            out.append((region, row(Event.PREWRITE, key, start, generation=draw(st.integers(0, 2)))))
        elif kind == "commit":
            op = draw(st.sampled_from([Row.UNKNOWN, Row.PUT, Row.DELETE]))
            out.append((region, row(Event.COMMIT, key, start, commit, op_type=op)))
        elif kind == "rollback":
            out.append((region, row(Event.ROLLBACK, key, start)))
        elif kind == "again" and scanned:  # a commit reported twice (scan and live): once out
            out.append(draw(st.sampled_from(scanned)))
        else:
            value = draw(st.binary(min_size=1, max_size=30))
            scanned.append((region, row(Event.COMMITTED, key, start, commit, value=value, old_value=b"o")))
            out.append(scanned[-1])
    for region in (0, 1):
        if init_at[region] >= n and draw(st.booleans()):
            out.append((region, row(Event.INITIALIZED, b"", 0)))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts(), budget=st.sampled_from([0, 500, 1200, 3000]))
def test_spilled_matchers_give_the_same_changes_in_the_same_order(script: Script, budget: int) -> None:
    expected, expected_counts, _ = play(script, None)
    got, counts, memory = play(script, budget)
    assert got == expected
    assert counts == expected_counts
    assert memory.peak <= budget


def test_budget_zero_keeps_nothing_in_memory_and_everything_matches() -> None:
    script: Script = [
        (0, row(Event.COMMIT, b"k1", 101, 110)),  # before its lock is scanned
        (0, row(Event.PREWRITE, b"k1", 101, value=b"v1")),
        (0, row(Event.PREWRITE, b"k2", 102, value=b"v2")),
        (0, row(Event.PREWRITE, b"k2", 102)),  # heartbeat: keeps v2
        (0, row(Event.PREWRITE, b"k3", 103, value=b"gen2", generation=2)),
        (0, row(Event.PREWRITE, b"k3", 103, value=b"gen1", generation=1)),  # older generation: ignored
        (0, row(Event.PREWRITE, b"k4", 104, value=b"rolled")),
        (0, row(Event.ROLLBACK, b"k4", 104)),
        (0, row(Event.COMMITTED, b"k5", 95, 105, value=b"v5")),
        (0, row(Event.COMMITTED, b"k5", 95, 105, value=b"v5")),  # reported twice: once out
        (0, row(Event.COMMIT, b"k5", 95, 105)),  # its lock was never scanned: delivered as COMMITTED
        (0, row(Event.INITIALIZED, b"", 0)),
        (0, row(Event.COMMIT, b"k2", 102, 111)),
        (0, row(Event.COMMIT, b"k3", 103, 112)),
        (0, row(Event.COMMIT, b"k4", 104, 113)),  # rolled back: unmatched after INITIALIZED
    ]
    (out, _), _, memory = play(script, 0)
    assert out == [
        (b"k5", b"v5", b"", 95, 105, False),
        (b"k1", b"v1", b"", 101, 110, False),
        (b"k2", b"v2", b"", 102, 111, False),
        (b"k3", b"gen2", b"", 103, 112, False),
        ("unmatched", b"k4", 104, 113),
    ]
    assert memory.peak == 0 and memory.spilled_entries > 0


# -- the account ----------------------------------------------------------------------------


def _prewrites(matcher: Matcher, start: int, count: int, size: int = 100) -> None:
    for i in range(count):
        matcher.prewrite(row(Event.PREWRITE, b"key%06d" % i, start, value=b"v" * size), True)


def test_the_largest_region_spills_first_and_the_budget_holds() -> None:
    with feed_memory(30_000) as memory:
        big, small = Matcher(CHECKPOINT, memory), Matcher(CHECKPOINT, memory)
        _prewrites(big, 101, 50)
        _prewrites(small, 102, 5)
        assert not big.spilled and not small.spilled
        _prewrites(small, 103, 30)  # past the budget: the big region's oldest go to disk, the small one stays
        assert big.spilled and not small.spilled
        assert memory.used <= 30_000 and memory.peak <= 30_000
        # Slices, not everything: what was needed plus a sixteenth of the budget at a time.
        assert 0 < memory.spilled_entries < 50 and memory.spills >= 1
        assert len(big) == 50 and big.memory > 0 and big.memory + small.memory == memory.used
        # Both still match every commit, from disk and from memory.
        got = [big.commit(row(Event.COMMIT, b"key%06d" % i, 101, 200), True) for i in range(50)]
        assert all(c is not None and c.value == b"v" * 100 for c in got)
        assert len(big) == 0 and len(small) == 35
        big.close()
        small.close()
        assert memory.used == 0


def test_a_spilled_transaction_stays_on_disk_until_its_last_lock_goes() -> None:
    with feed_memory(0) as memory:
        m = Matcher(CHECKPOINT, memory)
        _prewrites(m, 101, 3)
        assert len(m) == 3 and m.memory == 0
        m.rollback(row(Event.ROLLBACK, b"key000000", 101))
        assert m.commit(row(Event.COMMIT, b"key000001", 101, 150), True) is not None
        # Stale: at or below the checkpoint, dropped with its lock.
        assert m.commit(row(Event.COMMIT, b"key000002", 101, 100), True) is None
        assert len(m) == 0 and m.skipped == 1
        with pytest.raises(UnmatchedCommitError):
            m.commit(row(Event.COMMIT, b"key000001", 101, 150), True)
        m.close()


def test_closing_deletes_spill_files_and_the_directory() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "spill"
        (directory / "stale").mkdir(parents=True)  # left by an earlier run
        memory = FeedMemory(0, directory)
        assert not directory.exists()
        m = Matcher(CHECKPOINT, memory)
        _prewrites(m, 101, 10)
        files = list(directory.rglob("*.db"))
        assert memory.files == 1 and len(files) == 1
        m.close()
        assert not files[0].exists()
        memory.close()
        assert not directory.exists()


def test_a_closing_client_leaves_the_files_of_its_successor_alone() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "spill"
        old = FeedMemory(0, directory)
        closing = Matcher(CHECKPOINT, old)
        _prewrites(closing, 101, 3)
        new = FeedMemory(0, directory)  # a restarted source, while the old one still closes
        current = Matcher(CHECKPOINT, new)
        _prewrites(current, 102, 3)
        closing.close()
        old.close()
        assert len(list(directory.rglob("*.db"))) == 1
        assert current.commit(row(Event.COMMIT, b"key000001", 102, 150), True) is not None
        current.close()
        new.close()
        assert not directory.exists()


def test_releasing_held_changes_streams_from_disk_and_stops_when_closed() -> None:
    with feed_memory(0) as memory:
        m = Matcher(CHECKPOINT, memory)
        for i in range(2000):
            m.hold(Committed(b"key%06d" % i, b"v", b"", 101, 200 - i % 50, False))
        released = m.release()
        first = [next(released) for _ in range(10)]
        assert [c.commit_ts for c in first] == [151] * 10
        m.close()  # the region was retired meanwhile: the rest is not read
        assert len(list(released)) < 512  # at most what was fetched already
