"""HLC ↔ cdcflow ts: order preserved, resolved never overstated, cursors replay everything above a ts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdcflow.plugins.sources.cockroachdb.hlc import HLC, cursor_for, resolved_ts

# A real HLC wall time is a Unix time in ns, never within the first millisecond of 1970
# (whose commit ts would be 0, the ts below which nothing can be resolved).
walls = st.integers(min_value=1_000_000, max_value=(1 << 62))
hlcs = st.builds(HLC, walls, st.integers(min_value=0, max_value=(1 << 32) - 1))


@given(hlcs, hlcs)
def test_order_of_any_two_hlc_is_preserved(a: HLC, b: HLC) -> None:
    ka, kb = (a.commit_ts, a.start_ts), (b.commit_ts, b.start_ts)
    assert (a < b) == (ka < kb)
    assert (a == b) == (ka == kb)


@given(hlcs, hlcs)
def test_resolved_ts_never_overstates(resolved: HLC, later: HLC) -> None:
    # Every row CockroachDB may still send after `resolved` is above it; its commit ts must be above ours.
    if later > resolved:
        assert later.commit_ts > resolved_ts(resolved)


@given(st.integers(min_value=0, max_value=(1 << 63) - 1), hlcs)
def test_cursor_replays_every_change_above_a_ts(ts: int, change: HLC) -> None:
    if change.commit_ts > ts:
        assert change > cursor_for(ts)


def test_physical_milliseconds_stay_in_the_high_bits() -> None:
    h = HLC(1_700_000_000_123_456_789, 7)
    assert h.commit_ts >> 18 == 1_700_000_000_123
    assert str(h) == "1700000000123456789.0000000007"
    assert HLC.parse(str(h)) == h


def test_parse_forms() -> None:
    assert HLC.parse("1536242855577149065.0000000000") == HLC(1536242855577149065, 0)
    assert HLC.parse("1536242855577149065") == HLC(1536242855577149065, 0)
    assert HLC.find_in("schema change occurred at 1536242855.577149065,3") == HLC(1536242855577149065, 3)
    assert HLC.find_in("no timestamp here") is None
