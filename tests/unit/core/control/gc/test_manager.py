"""The GC safepoint machinery: which changefeeds hold the safepoint, removal, staleness."""

from __future__ import annotations

import asyncio

from cdcflow.core.control.changefeed import ChangeFeedInfo, ChangefeedState, ChangeFeedStatus
from cdcflow.core.control.gc.keeper import GCSafepointKeeper
from cdcflow.core.control.gc.manager import GCManager


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
