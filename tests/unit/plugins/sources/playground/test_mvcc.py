"""The playground's MVCC store, oracle and region map, without servers."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.playground.mvcc import (
    Change,
    ChangeKind,
    KeyLockedError,
    Mutation,
    MVCCStore,
    Op,
    WriteConflictError,
)
from cdcflow.plugins.sources.playground.oracle import TSOOracle
from cdcflow.plugins.sources.playground.regions import RegionEventKind, RegionMap
from cdcflow.plugins.sources.tikv.tidb.keys import encode_bytes


def test_oracle_is_strictly_monotonic_across_threads() -> None:
    oracle = TSOOracle()
    results: list[list[int]] = [[] for _ in range(4)]

    def take(out: list[int]) -> None:
        out.extend(oracle.allocate(n % 3 + 1) for n in range(2000))

    threads = [threading.Thread(target=take, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [ts for out in results for ts in out]
    assert len(set(every)) == len(every)
    assert all(out == sorted(out) for out in results)
    with pytest.raises(ValueError, match="at least 1"):
        oracle.allocate(0)


def test_percolator_conflicts_and_old_values() -> None:
    store = MVCCStore()
    seen: list[Change] = []
    store.subscribe(seen.extend)
    store.prewrite([Mutation(b"k", Op.PUT, b"v1")], b"k", 10)
    with pytest.raises(KeyLockedError):
        store.prewrite([Mutation(b"k", Op.PUT, b"x")], b"k", 11)
    store.commit([b"k"], 10, 12)
    with pytest.raises(WriteConflictError):  # started before the commit at 12
        store.prewrite([Mutation(b"k", Op.PUT, b"x")], b"k", 11)
    store.prewrite([Mutation(b"k", Op.DELETE)], b"k", 20)
    assert store.get(b"k", 19) == b"v1"  # locks do not hide committed data
    store.commit([b"k"], 20, 21)
    assert (store.get(b"k", 12), store.get(b"k", 11), store.get(b"k", 21)) == (b"v1", None, None)
    assert [(c.kind, c.old_value) for c in seen] == [
        (ChangeKind.PREWRITE, b""),
        (ChangeKind.COMMIT, b""),
        (ChangeKind.PREWRITE, b"v1"),
        (ChangeKind.COMMIT, b"v1"),
    ]
    committed, locks = store.feed_scan(b"", b"", 12)
    assert [(c.key, c.op, c.commit_ts) for c in committed] == [(b"k", Op.DELETE, 21)] and locks == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.binary(min_size=0, max_size=3), st.booleans())))
def test_reads_at_any_ts_match_a_model(steps: list[tuple[bytes, bytes, bool]]) -> None:
    """Committed transactions (some rolled back) against a dict-per-ts model."""
    store, oracle = MVCCStore(), TSOOracle()
    history: list[tuple[int, dict[bytes, bytes]]] = [(0, {})]
    for key, value, roll_back in steps:
        start = oracle.next()
        mutation = Mutation(key, Op.PUT, value) if value else Mutation(key, Op.DELETE)
        store.prewrite([mutation], key, start)
        if roll_back:
            store.rollback([key], start)
            continue
        commit = oracle.next()
        store.commit([key], start, commit)
        state = dict(history[-1][1])
        if value:
            state[key] = value
        else:
            state.pop(key, None)
        history.append((commit, state))
    for ts, state in history:
        assert {k: v for k in (b"a", b"b", b"c") if (v := store.get(k, ts)) is not None} == state
        assert dict(store.scan(b"", b"", ts)) == state
    assert store.min_lock_ts(b"", b"") is None


def test_region_map_split_merge_and_leaders() -> None:
    regions = RegionMap([1, 2])
    events: list[object] = []
    regions.subscribe(events.append)
    (only,) = regions.all()
    left, right = regions.split(only.id, encode_bytes(b"m"))
    assert (left.id, left.end, right.start, right.end) == (only.id, encode_bytes(b"m"), encode_bytes(b"m"), b"")
    assert left.version == right.version == only.version + 1
    assert regions.locate(encode_bytes(b"z")) == right and regions.locate(b"") == left
    assert regions.previous(encode_bytes(b"z")) == left
    moved = regions.transfer_leader(right.id, 2)
    assert moved.leader_store == 2 and moved.version == right.version
    merged = regions.merge(right.id, left.id)
    assert (merged.start, merged.end, merged.version) == (b"", b"", right.version + 1)
    assert [e.kind for e in events] == [RegionEventKind.SPLIT, RegionEventKind.LEADER, RegionEventKind.MERGE]  # type: ignore[attr-defined]
    with pytest.raises(PlaygroundError, match="not strictly inside"):
        regions.split(merged.id, b"")
    with pytest.raises(PlaygroundError, match="no peer on store 9"):
        regions.transfer_leader(merged.id, 9)


def test_regions_split_by_themselves_past_the_key_threshold() -> None:
    cluster = Cluster(1, split_keys=10)
    for i in range(25):
        start = cluster.oracle.next()
        key = b"k%03d" % i
        cluster.mvcc.prewrite([Mutation(key, Op.PUT, b"v")], key, start)
        cluster.mvcc.commit([key], start, cluster.oracle.next())
    regions = cluster.regions.all()
    assert len(regions) >= 3
    assert all(cluster.mvcc.key_count(r.start, r.end) <= 10 for r in regions)
