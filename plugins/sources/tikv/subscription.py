"""Per-feed and per-region subscription state of the EventFeed client.

A :class:`Subscription` is one feed (a span, its key ranges' resolved ts and
the queue its consumer reads); a :class:`RegionState` is one region
registration serving part of that span, with its own matcher.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.data.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2
from cdcflow.plugins.sources.tikv.matcher import Matcher
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
    """One region subscription: the region, the clipped range, and its matching state
    (which also holds the region's changes until INITIALIZED)."""

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
    #: Event-loop time at which resolved_ts last moved (or the region was subscribed or
    #: INITIALIZED): a region that stays behind for the resolve-lock interval has its locks resolved.
    advanced_at: float = 0.0
    #: Not before this loop time is the region's next lock-resolution pass (backoff after one).
    resolve_after: float = 0.0
    resolve_backoff: float = 0.0

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
