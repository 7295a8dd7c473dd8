"""DDLTracker logic: job writes applied in commit-ts order once both DDL spans resolve, errors handed on.

The feeds here are in-test generators (the EventFeed client itself is tested
over gRPC elsewhere); the mounter records the order it is asked to mount.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cdcflow.core.data.events import DDLEvent, RawKVEvent, ResolvedEvent, Span, TableName
from cdcflow.core.errors import CdcflowError
from cdcflow.core.testing import until
from cdcflow.plugins.sources.tikv.catalog import TiDBCatalog
from cdcflow.plugins.sources.tikv.ddl import DDLTracker

JOBS, HISTORY = TiDBCatalog.ddl_spans()


class Feeds:
    def __init__(self) -> None:
        self.queues: dict[Span, asyncio.Queue[Any]] = {JOBS: asyncio.Queue(), HISTORY: asyncio.Queue()}
        self.started: list[tuple[Span, int]] = []

    async def feed(self, span: Span, start_ts: int) -> AsyncIterator[Any]:
        self.started.append((span, start_ts))
        while True:
            item = await self.queues[span].get()
            if isinstance(item, BaseException):
                raise item
            yield item


class Mounter:
    def __init__(self) -> None:
        self.mounted: list[int] = []

    async def mount_event(self, event: RawKVEvent) -> DDLEvent | None:
        self.mounted.append(event.commit_ts)
        if event.value == b"noop":
            return None
        return DDLEvent(event.commit_ts, event.value.decode(), TableName("db", "t", 42))


def job(span: Span, commit_ts: int, query: str = "ALTER TABLE t ADD c int") -> RawKVEvent:
    return RawKVEvent(span, span.start + b"\x01", query.encode(), b"", commit_ts - 1, commit_ts)


def test_applies_jobs_in_commit_ts_order_when_both_spans_resolve() -> None:
    async def body() -> None:
        feeds, mounter = Feeds(), Mounter()
        tracker = DDLTracker(feeds, TiDBCatalog("127.0.0.1:1"), mounter, 100)  # type: ignore[arg-type]
        try:
            feeds.queues[JOBS].put_nowait(job(JOBS, 130, "B"))
            feeds.queues[HISTORY].put_nowait(job(HISTORY, 120, "A"))
            feeds.queues[HISTORY].put_nowait(job(HISTORY, 125, "noop"))
            feeds.queues[JOBS].put_nowait(ResolvedEvent(JOBS, 140))
            await until(lambda: all(q.empty() for q in feeds.queues.values()), message="the feeds to be read")
            # Time passes on purpose (not a wait on a condition): with HISTORY unresolved,
            # nothing read may be applied however long the tracker runs.
            await asyncio.sleep(0.05)
            assert tracker.resolved == 100 and mounter.mounted == []  # HISTORY not resolved yet
            waiter = asyncio.create_task(tracker.wait_resolved(135))
            feeds.queues[HISTORY].put_nowait(ResolvedEvent(HISTORY, 135))
            await asyncio.wait_for(waiter, 5)
            assert tracker.resolved == 135
            assert mounter.mounted == [120, 125, 130]
            assert [d.query for d in tracker.between(100, 135)] == ["A", "B"]
            assert [d.query for d in tracker.between(120, 135)] == ["B"]
            assert tracker.concerns(tracker.ddl[0], Span(42, b"", b""))
            assert not tracker.concerns(tracker.ddl[0], Span(43, b"", b""))
        finally:
            await tracker.close()

    asyncio.run(asyncio.wait_for(body(), 30))


def test_an_error_reaches_waiting_feeds_and_a_successor_keeps_the_history() -> None:
    async def body() -> None:
        feeds, mounter = Feeds(), Mounter()
        catalog = TiDBCatalog("127.0.0.1:1")
        tracker = DDLTracker(feeds, catalog, mounter, 100)  # type: ignore[arg-type]
        feeds.queues[JOBS].put_nowait(job(JOBS, 110, "A"))
        feeds.queues[JOBS].put_nowait(ResolvedEvent(JOBS, 115))
        feeds.queues[HISTORY].put_nowait(ResolvedEvent(HISTORY, 115))
        await asyncio.wait_for(tracker.wait_resolved(115), 5)
        feeds.queues[JOBS].put_nowait(CdcflowError("stores unreachable"))
        with pytest.raises(CdcflowError, match="unreachable"):
            await asyncio.wait_for(tracker.wait_resolved(200), 5)
        assert tracker.failed
        await tracker.close()
        started = len(feeds.started)
        successor = DDLTracker(feeds, catalog, mounter, tracker.resolved, history=tracker.ddl)  # type: ignore[arg-type]
        try:
            await until(lambda: len(feeds.started) >= started + 2, message="the successor's two feeds to start")
            assert sorted(feeds.started[-2:]) == sorted([(JOBS, 115), (HISTORY, 115)])
            assert [d.query for d in successor.between(100, 115)] == ["A"]
        finally:
            await successor.close()

    asyncio.run(asyncio.wait_for(body(), 30))


def test_the_schema_store_is_settled_at_the_ddl_resolved_ts() -> None:
    from cdcflow.plugins.sources.tikv.tidb.ddl_job import DDLJob

    async def body() -> None:
        feeds, mounter = Feeds(), Mounter()
        catalog = TiDBCatalog("127.0.0.1:1")
        # A drop the status API reported as finished at 120, its job write never seen.
        drop = DDLJob(id=7, type=4, schema_id=1, table_id=42, state=6, finished_ts=120)
        catalog.schemas.apply_job(drop, 120, exact=False)
        tracker = DDLTracker(feeds, catalog, mounter, 100)  # type: ignore[arg-type]
        try:
            feeds.queues[JOBS].put_nowait(ResolvedEvent(JOBS, 110))
            feeds.queues[HISTORY].put_nowait(ResolvedEvent(HISTORY, 110))
            await asyncio.wait_for(tracker.wait_resolved(110), 5)
            assert catalog.schemas.table_at(42, 120) is not None and not catalog.schemas.table_at(42, 120).exact
            feeds.queues[JOBS].put_nowait(ResolvedEvent(JOBS, 130))
            feeds.queues[HISTORY].put_nowait(ResolvedEvent(HISTORY, 130))
            await asyncio.wait_for(tracker.wait_resolved(130), 5)
            # Resolved past FinishedTS without the write: the write was at or below the load ts.
            settled = catalog.schemas.table_at(42, 0)
            assert settled is not None and settled.exact and settled.table is None
        finally:
            await tracker.close()

    asyncio.run(asyncio.wait_for(body(), 30))
