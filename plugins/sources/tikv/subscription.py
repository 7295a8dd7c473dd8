"""Per-feed and per-region subscription state of the EventFeed client.

A :class:`Subscription` is one feed (a span, its key ranges' resolved ts and
the queue its consumer reads); a :class:`RegionState` is one region
registration serving part of that span, with its own matcher.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2
from cdcflow.plugins.sources.tikv.matcher import Committed, Matcher
from cdcflow.plugins.sources.tikv.rangets import RangeTs
from cdcflow.plugins.sources.tikv.regions import RegionInfo
from cdcflow.plugins.sources.tikv.stream import StoreStream

__all__ = ["END", "FeedEvent", "RegionState", "Subscription", "drain", "error_name", "max_end"]

FeedEvent = RawKVEvent | ResolvedEvent

#: Put in a feed's queue when the client closes: the feed ends.
END = object()


@dataclass(eq=False)
class Subscription:
    """One feed: a span, its ranges' resolved ts, and the queue the feed reads."""

    request_id: int
    span: Span
    start: bytes  # region-space
    end: bytes
    ranges: RangeTs
    out: asyncio.Queue[FeedEvent | BaseException | object]
    emitted_resolved: int
    regions: dict[int, RegionState] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    closed: bool = False
    #: Consecutive stream breaks and busy answers since the frontier last moved (drives backoff).
    failures: int = 0
    failing_since: float | None = None
    #: Held while a region of this feed is being registered.
    subscribing: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(eq=False)
class RegionState:
    """One region subscription: the region, the clipped range, and its matching state."""

    sub: Subscription
    region: RegionInfo
    start: bytes
    end: bytes
    checkpoint_ts: int
    stream: StoreStream
    matcher: Matcher
    resolved_ts: int = 0
    initialized: bool = False
    retired: bool = False
    #: Committed changes held until INITIALIZED (see :meth:`release`).
    held: list[Committed] = field(default_factory=list)

    def hold(self, changes: list[Committed]) -> None:
        self.held.extend(changes)

    def release(self) -> list[Committed]:
        """The held changes in commit-ts order, each ``(key, commit_ts)`` once, none at or below the checkpoint.

        The scan and live rows of one registration may report the same commit
        (a write between registration and the scan's snapshot); one copy is
        enough. Order between keys of equal commit ts is arrival order.
        """
        held, self.held = self.held, []
        held.sort(key=lambda c: c.commit_ts)
        seen: set[tuple[bytes, int]] = set()
        out: list[Committed] = []
        for change in held:
            k = (change.key, change.commit_ts)
            if change.commit_ts > self.checkpoint_ts and k not in seen:
                seen.add(k)
                out.append(change)
        return out

    @property
    def request_id(self) -> int:
        return self.sub.request_id

    @property
    def region_id(self) -> int:
        return self.region.id


def max_end(a: bytes, b: bytes) -> bytes:
    """The larger of two range ends, where empty means +infinity."""
    return b"" if not a or not b else max(a, b)


def drain(queue: asyncio.Queue[Any]) -> None:
    while not queue.empty():
        queue.get_nowait()


def error_name(error: cdcpb_pb2.Error) -> str:
    return next((f.name for f, _ in error.ListFields()), "error")
