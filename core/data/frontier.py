"""The span frontier: the minimum resolved ts over a set of spans (seed 004, CockroachDB's
span frontier; ARCHITECTURE.md "Log service").

It only moves forward: a resolved ts below a span's current one is ignored,
and so the frontier of a changefeed never goes back. Events at or below the
frontier are duplicates of events already delivered.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from cdcflow.core.data.events import Span

__all__ = ["SpanFrontier"]


class SpanFrontier:
    """Tracks a resolved ts per span; :attr:`frontier` is their minimum.

    Updates are O(log n) amortised: a lazy min-heap of (ts, span) entries,
    where stale entries are dropped when they reach the top.
    """

    def __init__(self, spans: Iterable[Span], start_ts: int = 0) -> None:
        self._ts: dict[Span, int] = {span: start_ts for span in spans}
        self._heap: list[tuple[int, Span]] = [(start_ts, span) for span in self._ts]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._ts)

    def __contains__(self, span: object) -> bool:
        return span in self._ts

    def spans(self) -> list[Span]:
        return list(self._ts)

    def resolved_ts(self, span: Span) -> int:
        return self._ts[span]

    def forward(self, span: Span, ts: int) -> bool:
        """Move ``span`` to ``ts``; returns whether the frontier itself moved forward."""
        current = self._ts.get(span)
        if current is None:
            raise KeyError(f"{span} is not tracked by this frontier")
        if ts <= current:
            return False
        before = self.frontier
        self._ts[span] = ts
        heapq.heappush(self._heap, (ts, span))
        return self.frontier > before

    def add(self, span: Span, ts: int) -> None:
        """Start tracking ``span`` at ``ts`` (e.g. a span added to a changefeed)."""
        if span in self._ts:
            raise KeyError(f"{span} is already tracked")
        self._ts[span] = ts
        heapq.heappush(self._heap, (ts, span))

    def remove(self, span: Span) -> None:
        """Stop tracking ``span`` (its entries in the heap become stale)."""
        del self._ts[span]

    @property
    def frontier(self) -> int:
        """The minimum resolved ts over all spans (0 when there are none)."""
        heap = self._heap
        while heap:
            ts, span = heap[0]
            if self._ts.get(span) == ts:
                return ts
            heapq.heappop(heap)
        return 0
