from collections import Counter
from dataclasses import dataclass

from cdcflow.core.control.scheduling import ReplicationState
from cdcflow.core.data.events import Span
from cdcflow.plugins.schedulers.balance import AddTask, BalancePolicy, MoveTask

R, A = ReplicationState.REPLICATING, ReplicationState.ABSENT


@dataclass
class P:
    span: Span
    state: ReplicationState
    primary: str | None = None
    secondary: str | None = None


def spans(n):
    return [Span(i, b"", b"") for i in range(n)]


def test_absent_spans_go_to_the_least_loaded_capture_capped_per_tick():
    sets = [P(s, A) for s in spans(5)] + [P(Span(99, b"", b""), R, "c1")]
    tasks = BalancePolicy(max_adds=3).plan(sets, ["c1", "c2"])
    assert all(isinstance(t, AddTask) for t in tasks)
    assert [t.capture for t in tasks] == ["c2", "c1", "c2"]


def test_a_joining_capture_gets_spans_until_counts_are_within_one_with_a_move_cap():
    sets = [P(s, R, "c1" if s.table_id % 2 else "c2") for s in spans(10)]
    tasks = BalancePolicy(max_concurrent_moves=2).plan(sets, ["c1", "c2", "c3"])
    assert len(tasks) == 2 and all(isinstance(t, MoveTask) and t.target == "c3" for t in tasks)
    tasks = BalancePolicy(max_concurrent_moves=0).plan(sets, ["c1", "c2", "c3"])
    after = Counter(p.primary for p in sets)
    for t in tasks:
        after[next(p.primary for p in sets if p.span == t.span)] -= 1
        after[t.target] += 1
    assert max(after.values()) - min(after.values()) <= 1


def test_moves_in_flight_count_against_the_cap_and_nothing_moves_while_spans_are_absent():
    sets = [P(s, R, "c1") for s in spans(6)]
    sets[0] = P(sets[0].span, ReplicationState.PREPARE, "c1", "c2")
    assert BalancePolicy(max_concurrent_moves=1).plan(sets, ["c1", "c2"]) == []
    sets.append(P(Span(50, b"", b""), A))
    assert all(isinstance(t, AddTask) for t in BalancePolicy(max_concurrent_moves=5).plan(sets, ["c1", "c2"]))


def test_draining_capture_is_emptied_and_pinned_spans_move_last():
    sets = [P(s, R, "c1") for s in spans(3)]
    tasks = BalancePolicy(max_concurrent_moves=0, balance=False).plan(sets, ["c2"], draining={"c1"})
    assert sorted(t.span.table_id for t in tasks) == [0, 1, 2]
    sets = [P(s, R, "c1") for s in spans(4)]
    [move] = BalancePolicy(max_concurrent_moves=1).plan(sets, ["c1", "c2"], pinned={Span(3, b"", b"")})
    assert move.span != Span(3, b"", b"")
