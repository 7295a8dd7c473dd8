from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.events import Span
from cdcflow.core.scheduling import SpanPlacement, TaskKind
from cdcflow.plugins.schedulers.round_robin import RoundRobinConfig, RoundRobinScheduler

SPANS = [Span(i, b"%d" % i, b"%d~" % i) for i in range(10)]


def test_places_absent_spans_evenly():
    s = RoundRobinScheduler(RoundRobinConfig())
    tasks = s.schedule([SpanPlacement(span, None) for span in SPANS], ["c1", "c2", "c3"])
    assert all(t.kind is TaskKind.ADD for t in tasks)
    counts = {c: sum(t.target == c for t in tasks) for c in ["c1", "c2", "c3"]}
    assert sorted(counts.values()) == [3, 3, 4]


def test_reassigns_spans_of_dead_capture_and_skips_busy():
    s = RoundRobinScheduler(RoundRobinConfig())
    placements = [
        SpanPlacement(SPANS[0], "dead"),
        SpanPlacement(SPANS[1], "c1"),
        SpanPlacement(SPANS[2], None, busy=True),
    ]
    tasks = s.schedule(placements, ["c1", "c2"])
    assert [(t.span, t.target) for t in tasks] == [(SPANS[0], "c2")]


def test_limit_per_tick_and_no_captures():
    s = RoundRobinScheduler(RoundRobinConfig(max_tasks_per_tick=2))
    assert len(s.schedule([SpanPlacement(span, None) for span in SPANS], ["c1"])) == 2
    assert s.schedule([SpanPlacement(SPANS[0], None)], []) == []


@given(st.lists(st.sampled_from(["c1", "c2", "c3", None, "gone"]), min_size=1, max_size=10))
def test_every_unplaced_span_gets_a_live_capture(assignment):
    s = RoundRobinScheduler(RoundRobinConfig())
    placements = [SpanPlacement(SPANS[i], c) for i, c in enumerate(assignment)]
    tasks = s.schedule(placements, ["c1", "c2", "c3"])
    placed = {t.span for t in tasks}
    for p in placements:
        assert (p.span in placed) == (p.capture not in {"c1", "c2", "c3"})
    assert all(t.target in {"c1", "c2", "c3"} for t in tasks)
