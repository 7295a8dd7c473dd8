from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.control.scheduling import DispatchTableRequest, HeartbeatRequest, ReplicationState
from cdcflow.core.data.events import Span
from cdcflow.core.testing.scheduling import SimulatedCluster
from cdcflow.plugins.schedulers.round_robin import RoundRobinConfig, RoundRobinScheduler

SPANS = [Span(i, b"%d" % i, b"%d~" % i) for i in range(10)]


def test_places_spans_evenly_once_every_capture_reported():
    cluster = SimulatedCluster(RoundRobinScheduler(RoundRobinConfig()), ["c1", "c2", "c3"])
    first = cluster.step(SPANS)
    # Nothing is placed before every capture answered a heartbeat.
    assert all(isinstance(m, HeartbeatRequest) for m in first.messages)
    assert first.watermark is None
    cluster.run_until_replicating(SPANS)
    counts = Counter(c for cs in cluster.replicating().values() for c in cs)
    assert sorted(counts.values()) == [3, 3, 4]


def test_reassigns_spans_of_dead_capture_and_watermark_never_regresses():
    cluster = SimulatedCluster(RoundRobinScheduler(RoundRobinConfig()), ["c1", "c2"])
    cluster.run_until_replicating(SPANS)
    cluster.advance(100)
    cluster.step(SPANS)
    wm = cluster.step(SPANS).watermark
    assert wm is not None and wm.checkpoint_ts == 100
    cluster.kill("c1")
    cluster.advance(200)  # c2's spans move on; c1's are being added again from 100
    wm = cluster.step(SPANS).watermark
    assert wm is None or wm.checkpoint_ts == 100  # held back by the re-added spans
    cluster.run_until_replicating(SPANS)
    assert set(cluster.replicating()) == set(SPANS)
    assert all(cs == ["c2"] for cs in cluster.replicating().values())
    cluster.advance(300)
    for _ in range(3):
        wm = cluster.step(SPANS).watermark
    assert wm is not None and wm.checkpoint_ts == 300


def test_removes_spans_no_longer_wanted():
    cluster = SimulatedCluster(RoundRobinScheduler(RoundRobinConfig()), ["c1"])
    cluster.run_until_replicating(SPANS)
    for _ in range(3):
        cluster.step(SPANS[:4])
    assert set(cluster.replicating()) == set(SPANS[:4])
    states = {r.span: r.state for r in cluster.scheduler.replication_status()}
    assert states == dict.fromkeys(SPANS[:4], ReplicationState.REPLICATING)


def test_limit_per_tick_and_no_captures():
    cluster = SimulatedCluster(RoundRobinScheduler(RoundRobinConfig(max_tasks_per_tick=2)), ["c1"])
    cluster.step(SPANS)
    adds = [m for m in cluster.step(SPANS).messages if isinstance(m, DispatchTableRequest)]
    assert len(adds) == 2
    empty = SimulatedCluster(RoundRobinScheduler(RoundRobinConfig()), [])
    assert empty.step(SPANS).messages == []


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["c1", "c2", "c3"]), min_size=1, max_size=3, unique=True))
def test_every_span_replicates_on_exactly_one_live_capture(captures):
    cluster = SimulatedCluster(RoundRobinScheduler(RoundRobinConfig()), captures)
    cluster.run_until_replicating(SPANS)
    for _ in range(3):
        cluster.step(SPANS)
    assert all(len(cs) == 1 for cs in cluster.replicating().values())
