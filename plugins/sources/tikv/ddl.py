"""DDL for table feeds: TiDB's DDL job tables followed through EventFeed (TiCDC's DDL puller).

One :class:`DDLTracker` per source feeds the spans of TiDB's DDL job tables
from the ts the schema store was loaded at. Each time both spans are resolved
further, it mounts the job writes up to there in commit-ts order, which
applies them to the schema store (at the job write's exact commit ts) and
yields :class:`DDLEvent`\\ s.

Table feeds use it as a barrier: before a table feed yields
``ResolvedEvent(span, t)`` it waits until the tracker is resolved to ``t``,
and yields first the DDL of that table committed in between. So a sink sees
a table's DDL before the resolved ts passes it, and every row at or below a
resolved ts is decoded with a schema store that has every DDL below that ts.

DDL that no table feed carries — schema-level DDL (CREATE/DROP DATABASE, …,
no table) and the creation of a table (CREATE TABLE/VIEW/SEQUENCE: no feed of
it can exist yet) — is yielded by the source's feed of the first DDL job span
(:meth:`DDLTracker.is_unowned`), with that span's resolved ts.

Each time both spans are resolved further the schema store is settled to
that ts (:meth:`SchemaStore.settle`), so a job the status API reported as
finished after the load ts but whose write was at or below it is pinned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cdcflow.core.data.events import DDLEvent, RawKVEvent, ResolvedEvent, Span
from cdcflow.plugins.sources.tikv.catalog import TiDBCatalog
from cdcflow.plugins.sources.tikv.eventfeed import EventFeedClient
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBMounter

__all__ = ["CREATE_ACTIONS", "DDLTracker", "TrackerSuperseded"]

log = logging.getLogger(__name__)

#: ActionTypes that create a table-like object: CREATE TABLE, VIEW, SEQUENCE, TABLES.
CREATE_ACTIONS = frozenset({3, 21, 34, 60})


class TrackerSuperseded(Exception):
    """The tracker was closed (replaced by one from a lower ts, or the source closed)."""


_Item = RawKVEvent | ResolvedEvent | BaseException


class DDLTracker:
    """Follows the DDL job spans from ``start_ts``; :attr:`resolved` only moves forward."""

    def __init__(
        self,
        feeds: EventFeedClient,
        catalog: TiDBCatalog,
        mounter: TiDBMounter,
        start_ts: int,
        *,
        history: list[DDLEvent] | None = None,
    ) -> None:
        self._feeds = feeds
        self._catalog = catalog
        self._mounter = mounter
        self.start_ts = start_ts
        self.resolved = start_ts
        #: DDL seen so far (``history``: what a failed predecessor had seen).
        self.ddl: list[DDLEvent] = list(history or ())
        self._changed = asyncio.Condition()
        self._error: BaseException | None = None
        self._task = asyncio.create_task(self._run(), name="tikv-ddl-tracker")

    @property
    def failed(self) -> bool:
        """Whether tracking stopped on an error (the source then starts a successor)."""
        return self._error is not None

    async def close(self) -> None:
        """Stop following; feeds waiting on this tracker get :class:`TrackerSuperseded`."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        async with self._changed:
            if self._error is None:
                self._error = TrackerSuperseded()
            self._changed.notify_all()

    async def wait_resolved(self, ts: int) -> None:
        """Return once every DDL committed at or below ``ts`` is applied; raise the tracker's error."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.resolved >= ts or self._error is not None)
        if self.resolved < ts and self._error is not None:
            raise self._error

    def between(self, lo: int, hi: int) -> list[DDLEvent]:
        """DDL events with ``lo < commit_ts <= hi``, in commit-ts order."""
        return sorted((d for d in self.ddl if lo < d.commit_ts <= hi), key=lambda d: d.commit_ts)

    @staticmethod
    def is_unowned(ddl: DDLEvent) -> bool:
        """Whether no table feed carries ``ddl``: schema-level DDL, or the creation of a table."""
        return ddl.table is None or ddl.action_type in CREATE_ACTIONS

    def concerns(self, ddl: DDLEvent, span: Span) -> bool:
        """Whether ``ddl`` changes the table whose rows ``span`` holds."""
        return self._catalog.ddl_concerns(ddl, span)

    async def _run(self) -> None:
        spans = self._catalog.ddl_spans()
        queue: asyncio.Queue[_Item] = asyncio.Queue()

        async def pump(span: Span) -> None:
            try:
                async for ev in self._feeds.feed(span, self.start_ts):
                    await queue.put(ev)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - handed to the table feeds waiting on this tracker
                await queue.put(exc)

        pumps = [asyncio.create_task(pump(span)) for span in spans]
        try:
            await self._follow(spans, queue)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - same: every waiting feed gets it
            log.warning("DDL tracking stopped: %s", exc)
            async with self._changed:
                self._error = exc
                self._changed.notify_all()
        finally:
            for task in pumps:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pumps, return_exceptions=True)

    async def _follow(self, spans: list[Span], queue: asyncio.Queue[_Item]) -> None:
        resolved = dict.fromkeys(spans, self.start_ts)
        pending: list[RawKVEvent] = []
        while True:
            ev = await queue.get()
            if isinstance(ev, BaseException):
                raise ev
            if isinstance(ev, RawKVEvent):
                pending.append(ev)
                continue
            resolved[ev.span] = max(resolved[ev.span], ev.ts)
            upto = min(resolved.values())
            if upto <= self.resolved:
                continue
            ready = sorted((e for e in pending if e.commit_ts <= upto), key=lambda e: e.sort_key())
            pending = [e for e in pending if e.commit_ts > upto]
            for raw in ready:
                ddl = await self._mounter.mount_event(raw)
                if isinstance(ddl, DDLEvent):
                    self.ddl.append(ddl)
            self._catalog.schemas.settle(upto)
            async with self._changed:
                self.resolved = upto
                self._changed.notify_all()
