"""A metastore that records how long each operation takes (``cdcflow_metastore_operation_duration_seconds``).

The capture wraps its metastore in one when metrics are on; every component
then goes through it. ``campaign`` (which waits for ownership) and the
capture watch (a stream) are passed through untimed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo, ChangeFeedStatus
from cdcflow.core.control.metastore.base import MetaStore, OwnerTerm, Session
from cdcflow.core.metrics import CaptureMetrics

__all__ = ["TimedMetaStore"]

T = TypeVar("T")


class TimedMetaStore(MetaStore):
    """``inner`` with every operation timed into ``metrics``; other attributes are ``inner``'s."""

    def __init__(self, inner: MetaStore, metrics: CaptureMetrics) -> None:
        self.inner = inner
        self.metrics = metrics
        self.url = inner.url

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        began = time.perf_counter()
        try:
            result = await call
        except BaseException as exc:
            self.metrics.metastore_call(operation, time.perf_counter() - began, exc)
            raise
        self.metrics.metastore_call(operation, time.perf_counter() - began, None)
        return result

    async def open_session(self, capture: CaptureInfo, ttl: float) -> Session:
        return await self._timed("open_session", self.inner.open_session(capture, ttl))

    async def list_captures(self) -> list[CaptureInfo]:
        return await self._timed("list_captures", self.inner.list_captures())

    def watch_captures(self) -> AsyncIterator[list[CaptureInfo]]:
        return self.inner.watch_captures()

    async def campaign(self, session: Session) -> OwnerTerm:
        return await self.inner.campaign(session)

    async def get_owner(self) -> OwnerTerm | None:
        return await self._timed("get_owner", self.inner.get_owner())

    async def resign(self, term: OwnerTerm) -> None:
        await self._timed("resign", self.inner.resign(term))

    async def create_changefeed(self, info: ChangeFeedInfo, status: ChangeFeedStatus, term: OwnerTerm) -> None:
        await self._timed("create_changefeed", self.inner.create_changefeed(info, status, term))

    async def get_changefeed(self, changefeed_id: str) -> tuple[ChangeFeedInfo, ChangeFeedStatus] | None:
        return await self._timed("get_changefeed", self.inner.get_changefeed(changefeed_id))

    async def list_changefeeds(self) -> list[tuple[ChangeFeedInfo, ChangeFeedStatus]]:
        return await self._timed("list_changefeeds", self.inner.list_changefeeds())

    async def update_changefeed(self, info: ChangeFeedInfo, term: OwnerTerm) -> None:
        await self._timed("update_changefeed", self.inner.update_changefeed(info, term))

    async def delete_changefeed(self, changefeed_id: str, term: OwnerTerm) -> None:
        await self._timed("delete_changefeed", self.inner.delete_changefeed(changefeed_id, term))

    async def update_checkpoints(self, statuses: Mapping[str, ChangeFeedStatus], term: OwnerTerm) -> dict[str, int]:
        return await self._timed("update_checkpoints", self.inner.update_checkpoints(statuses, term))

    async def save_snapshot_record(self, changefeed_id: str, record: Mapping[str, Any], term: OwnerTerm) -> None:
        await self._timed("save_snapshot_record", self.inner.save_snapshot_record(changefeed_id, record, term))

    async def list_snapshot_records(self) -> dict[str, dict[str, Any]]:
        return await self._timed("list_snapshot_records", self.inner.list_snapshot_records())

    async def close(self) -> None:
        await self.inner.close()
