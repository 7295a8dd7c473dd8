"""The GC safepoint machinery: which changefeeds hold the safepoint, removal, staleness."""

from __future__ import annotations

import asyncio

import pytest

from cdcflow.core.control.changefeed import ChangeFeedInfo, ChangefeedState, ChangeFeedStatus
from cdcflow.core.control.gc.keeper import GCSafepointKeeper
from cdcflow.core.control.gc.manager import GCManager, overwrite_checkpoint_ts
from cdcflow.core.errors import ConfigInvalidError, PDUnavailableError


class MemoryUpstream(GCSafepointKeeper):
    """An upstream's service safepoints as PD keeps them: the minimum wins, and a
    value below what GC already reached is not taken."""

    def __init__(self, gc_safepoint: int = 0) -> None:
        self.gc_safepoint = gc_safepoint
        self.services: dict[str, int] = {}

    async def update_service_gc_safepoint(self, service_id, ttl_seconds, safepoint):
        if safepoint >= self.gc_safepoint:
            self.services[service_id] = safepoint
        return max(self.gc_safepoint, min(self.services.values(), default=self.gc_safepoint))

    async def remove_service_gc_safepoint(self, service_id):
        self.services.pop(service_id, None)


def cf(name, state, changed_at=0.0):
    return ChangeFeedInfo(name, {"type": "x"}, [], state=state, state_changed_at=changed_at)


def test_minimum_over_protected_changefeeds_and_removal():
    upstream = MemoryUpstream()
    gc = GCManager("svc", lambda info: ("up", upstream), gc_ttl=100)

    async def main():
        records = [
            (cf("normal", ChangefeedState.NORMAL), ChangeFeedStatus(50, 50)),
            (cf("paused", ChangefeedState.PAUSED), ChangeFeedStatus(40, 40)),
            (cf("finished", ChangefeedState.FINISHED), ChangeFeedStatus(10, 10)),
            (cf("failed-old", ChangefeedState.FAILED, changed_at=0), ChangeFeedStatus(5, 5)),
            (cf("failed-new", ChangefeedState.FAILED, changed_at=950), ChangeFeedStatus(30, 30)),
        ]
        assert await gc.update(records, now=1000) == {}
        assert upstream.services == {"svc": 30}  # failed within gc-ttl counts, old failed and finished do not
        assert await gc.update(records[2:4], now=1000) == {}
        assert upstream.services == {}  # nothing needs protection: removed

    asyncio.run(main())


def test_checkpoint_behind_upstream_gc_is_stale():
    upstream = MemoryUpstream(gc_safepoint=100)
    gc = GCManager("svc", lambda info: ("up", upstream))

    async def main():
        stale = await gc.update([(cf("late", ChangefeedState.NORMAL), ChangeFeedStatus(60, 60))], now=0)
        assert set(stale) == {"late"} and stale["late"].code == 5001

    asyncio.run(main())


class NamedUpstream(GCSafepointKeeper):
    """One spelling of an upstream's address: it reaches ``cluster`` and reports its id."""

    def __init__(self, cluster: MemoryUpstream, cluster_id: str) -> None:
        self.cluster = cluster
        self.cluster_id = cluster_id

    async def upstream_id(self):
        return self.cluster_id

    async def update_service_gc_safepoint(self, service_id, ttl_seconds, safepoint):
        return await self.cluster.update_service_gc_safepoint(service_id, ttl_seconds, safepoint)

    async def remove_service_gc_safepoint(self, service_id):
        await self.cluster.remove_service_gc_safepoint(service_id)


def spelled(name, state, address):
    return ChangeFeedInfo(name, {"type": "x", "pd": [address]}, [], state=state)


def test_two_spellings_of_one_cluster_share_one_safepoint_at_their_minimum():
    cluster = MemoryUpstream()
    spellings = {"127.0.0.1:2379": NamedUpstream(cluster, "c-1"), "localhost:2379": NamedUpstream(cluster, "c-1")}
    gc = GCManager("svc", lambda info: (info.source["pd"][0], spellings[info.source["pd"][0]]), gc_ttl=100)

    async def main():
        records = [
            (spelled("paused", ChangefeedState.PAUSED, "127.0.0.1:2379"), ChangeFeedStatus(40, 40)),
            (spelled("running", ChangefeedState.NORMAL, "localhost:2379"), ChangeFeedStatus(90, 90)),
        ]
        for _ in range(3):
            assert await gc.update(records, now=0) == {}
            assert cluster.services == {"svc": 40}  # the paused changefeed's checkpoint is kept
        assert gc.safepoints == {"c-1": 40}
        assert await gc.update(records[1:], now=0) == {}  # the paused one removed
        assert cluster.services == {"svc": 90}

    asyncio.run(main())


def test_a_cluster_that_cannot_be_told_holds_the_safepoint():
    cluster = MemoryUpstream()

    class Unreachable(NamedUpstream):
        async def upstream_id(self):
            raise PDUnavailableError("PD is unreachable")

    reachable = NamedUpstream(cluster, "c-1")
    spellings = {"a": reachable, "b": Unreachable(cluster, "c-1")}
    gc = GCManager("svc", lambda info: (info.source["pd"][0], spellings[info.source["pd"][0]]), gc_ttl=100)

    async def main():
        running = (spelled("running", ChangefeedState.NORMAL, "a"), ChangeFeedStatus(50, 50))
        assert await gc.update([running], now=0) == {}
        assert cluster.services == {"svc": 50}
        later = (running[0], ChangeFeedStatus(90, 90))
        paused = (spelled("paused", ChangefeedState.PAUSED, "b"), ChangeFeedStatus(60, 60))
        assert await gc.update([later, paused], now=0) == {}
        assert cluster.services == {"svc": 50}  # not lifted past what "b" may need
        assert await gc.update([paused], now=0) == {}
        assert cluster.services == {"svc": 50}  # nor removed

    asyncio.run(main())


class TimedUpstream(NamedUpstream):
    """An upstream that tells its GC safepoint and current timestamp."""

    def __init__(self, gc_safepoint: int, now: int) -> None:
        super().__init__(MemoryUpstream(gc_safepoint), "c-1")
        self.now = now

    async def gc_safepoint(self):
        return self.cluster.gc_safepoint

    async def current_ts(self):
        return self.now


@pytest.mark.parametrize("value", [-5, 0, 2**70, 2**64, "12", 1.5, True, None, [1]])
def test_overwrite_checkpoint_ts_outside_the_tso_range_is_1001(value):
    with pytest.raises(ConfigInvalidError) as refused:
        overwrite_checkpoint_ts("cf", value)
    assert refused.value.code == 1001 and "overwrite_checkpoint_ts" in str(refused.value)


def test_resume_ts_between_the_gc_safepoint_and_the_current_ts():
    upstream = TimedUpstream(gc_safepoint=100, now=1000)
    gc = GCManager("svc", lambda info: ("up", upstream))
    info = cf("cf", ChangefeedState.PAUSED)

    async def main():
        for bad in (99, 1001):
            with pytest.raises(ConfigInvalidError) as refused:
                await gc.check_resume_ts(info, bad)
            assert refused.value.code == 1001
        for good in (100, 500, 1000):
            await gc.check_resume_ts(info, good)
        assert upstream.cluster.services == {}  # checking sets nothing

    asyncio.run(main())
