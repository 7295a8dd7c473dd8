"""RangeTs (resolved ts per key range) and RegionCache (bisect over region start keys)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdcflow.plugins.sources.tikv.rangets import RangeTs
from cdcflow.plugins.sources.tikv.regions import RegionCache, RegionInfo, clip


def test_rangets_forward_splits_and_merges() -> None:
    r = RangeTs(b"a", b"z", 10)
    r.forward(b"c", b"f", 20)
    assert r.pieces() == [(b"a", b"c", 10), (b"c", b"f", 20), (b"f", b"z", 10)]
    assert r.frontier == 10
    assert r.min_ts(b"c", b"e") == 20
    assert r.min_ts(b"b", b"d") == 10
    r.forward(b"a", b"c", 20)
    r.forward(b"f", b"z", 20)
    assert r.pieces() == [(b"a", b"z", 20)]
    r.forward(b"a", b"z", 15)  # never backwards
    assert r.frontier == 20


def test_rangets_open_end() -> None:
    r = RangeTs(b"", b"", 5)
    r.forward(b"m", b"", 9)
    assert r.pieces() == [(b"", b"m", 5), (b"m", b"", 9)]
    r.forward(b"", b"m", 9)
    assert r.pieces() == [(b"", b"", 9)]


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 10), st.integers(0, 50)), max_size=30))
def test_rangets_matches_a_per_key_model(updates: list[tuple[int, int, int]]) -> None:
    keys = [bytes([k]) for k in range(10)]
    model = dict.fromkeys(keys, 0)
    r = RangeTs(bytes([0]), bytes([10]), 0)
    for lo, width, ts in updates:
        hi = min(lo + width, 10)
        r.forward(bytes([lo]), bytes([hi]), ts)
        for k in range(lo, hi):
            model[bytes([k])] = max(model[bytes([k])], ts)
    assert r.frontier == min(model.values())
    for k in keys:
        assert r.min_ts(k, bytes([k[0] + 1])) == model[k]


def _region(rid: int, start: bytes, end: bytes) -> RegionInfo:
    return RegionInfo(id=rid, start=start, end=end, conf_ver=1, version=1, leader_store_id=1)


def test_region_cache_locate_insert_evicts_overlaps_and_invalidate() -> None:
    cache = RegionCache()
    cache.insert(_region(1, b"", b"g"))
    cache.insert(_region(2, b"g", b"p"))
    cache.insert(_region(3, b"p", b""))
    assert cache.locate(b"a").id == 1  # type: ignore[union-attr]
    assert cache.locate(b"g").id == 2  # type: ignore[union-attr]
    assert cache.locate(b"zz").id == 3  # type: ignore[union-attr]
    # A split of region 2 (newer epoch) replaces it.
    cache.insert(_region(4, b"g", b"k"))
    assert cache.by_id(2) is None
    assert cache.locate(b"h").id == 4  # type: ignore[union-attr]
    assert cache.locate(b"m") is None  # not known until PD is asked
    assert cache.covering(b"a", b"h") == [cache.by_id(1), cache.by_id(4)]
    assert cache.covering(b"a", b"m") is None  # [k, p) is unknown
    assert cache.covering(b"q", b"") == [cache.by_id(3)]
    cache.invalidate(4)
    assert cache.locate(b"h") is None
    cache.invalidate_range(b"q", b"r")
    assert cache.by_id(3) is None and cache.by_id(1) is not None
    moved = cache.update_leader(1, 9)
    assert moved is not None and cache.locate(b"a").leader_store_id == 9  # type: ignore[union-attr]


def test_clip() -> None:
    reg = _region(1, b"c", b"m")
    assert clip(b"a", b"z", reg) == (b"c", b"m")
    assert clip(b"d", b"f", reg) == (b"d", b"f")
    assert clip(b"d", b"", reg) == (b"d", b"m")
    assert clip(b"a", b"f", _region(2, b"", b"")) == (b"a", b"f")
