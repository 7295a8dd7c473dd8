from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.events import Span
from cdcflow.core.data.frontier import SpanFrontier

SPANS = [Span(i, b"a%d" % i, b"b%d" % i) for i in range(5)]


def test_frontier_is_minimum_and_moves_only_when_minimum_moves():
    f = SpanFrontier(SPANS[:2], 10)
    assert f.frontier == 10
    assert f.forward(SPANS[0], 20) is False
    assert f.frontier == 10
    assert f.forward(SPANS[1], 15) is True
    assert f.frontier == 15
    assert f.forward(SPANS[1], 12) is False  # backwards ignored
    assert f.resolved_ts(SPANS[1]) == 15


def test_add_and_remove_spans():
    f = SpanFrontier([SPANS[0]], 10)
    f.add(SPANS[1], 5)
    assert f.frontier == 5
    f.remove(SPANS[1])
    assert f.frontier == 10
    assert SpanFrontier([]).frontier == 0


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1000)), max_size=200))
def test_matches_naive_model(updates):
    f = SpanFrontier(SPANS, 0)
    model = dict.fromkeys(SPANS, 0)
    last = 0
    for index, ts in updates:
        span = SPANS[index]
        moved = f.forward(span, ts)
        model[span] = max(model[span], ts)
        expected = min(model.values())
        assert f.frontier == expected
        assert moved == (expected > last)
        assert f.frontier >= last  # never goes back
        last = expected
