from collections import Counter

import pytest

from cdcflow.core.control.scheduling import InvalidScheduleRequestError, ReplicationState
from cdcflow.core.data.events import Span
from cdcflow.core.testing.scheduling import SimulatedCluster
from cdcflow.plugins.schedulers.two_phase import TwoPhaseConfig, TwoPhaseScheduler

SPANS = [Span(i, b"", b"") for i in range(12)]


def cluster(captures=("c1", "c2", "c3"), **kw):
    c = SimulatedCluster(TwoPhaseScheduler(TwoPhaseConfig(**kw)), captures, prepare_polls=1, stop_polls=1)
    c.run_until_replicating(SPANS)
    for _ in range(3):
        c.step(SPANS)
    return c


def per_capture(c):
    return Counter(cs[0] for cs in c.replicating().values())


def test_join_rebalances_within_one_and_death_reassigns():
    c = cluster()
    assert sorted(per_capture(c).values()) == [4, 4, 4]
    c.join("c4")
    for _ in range(30):
        c.step(SPANS)
    assert sorted(per_capture(c).values()) == [3, 3, 3, 3]
    c.kill("c2")
    for _ in range(30):
        c.step(SPANS)
    assert sorted(per_capture(c).values()) == [4, 4, 4] and "c2" not in per_capture(c)
    assert all(r.state is ReplicationState.REPLICATING for r in c.scheduler.replication_status())


def test_a_stopping_capture_is_drained():
    c = cluster()
    c.agents["c1"].set_stopping()
    for _ in range(30):
        c.step(SPANS)
    assert set(per_capture(c)) == {"c2", "c3"}


def test_move_table_and_its_errors():
    c = cluster()
    status = {r.span: r for r in c.scheduler.replication_status()}
    source = status[SPANS[0]].primary
    target = next(x for x in ("c1", "c2", "c3") if x != source)
    assert c.scheduler.move_table(0, target) == [SPANS[0]]
    for _ in range(10):
        c.step(SPANS)
    assert c.replicating()[SPANS[0]] == [target]
    assert c.scheduler.move_table(0, target) == []  # already there
    with pytest.raises(InvalidScheduleRequestError, match="table 404 is not replicated"):
        c.scheduler.move_table(404, target)
    with pytest.raises(InvalidScheduleRequestError, match="capture 'nope' is not alive"):
        c.scheduler.move_table(0, "nope")


def test_removed_spans_leave_with_their_last_checkpoint():
    c = cluster()
    c.advance(500)
    for _ in range(2):
        c.step(SPANS)
    for _ in range(5):
        c.step(SPANS[:10])
    assert set(c.replicating()) == set(SPANS[:10])
    assert c.scheduler.manager.removed == {SPANS[10]: 500, SPANS[11]: 500}
