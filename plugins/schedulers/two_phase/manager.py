"""All of a changefeed's ReplicationSets and the changefeed's progress (seed 002's ``ReplicationM``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cdcflow.core.control.scheduling import RemoveSpan, ReplicationState, Watermark
from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SpanState, SpanStatus
from cdcflow.plugins.schedulers.two_phase.replication_set import Command, ReplicationSet

__all__ = ["ReplicationManager"]

_ABSENT = ReplicationState.ABSENT
_IDLE = {SpanState.ABSENT, SpanState.STOPPED, SpanState.STOPPING}


class ReplicationManager:
    """One :class:`ReplicationSet` per span; routes reports to them; computes the watermark.

    The watermark is the minimum checkpoint ts and resolved ts over the sets;
    it is None while any set is absent (seed 002: the changefeed cannot
    advance while a span is missing) and, once given, never goes backwards.
    """

    def __init__(self) -> None:
        self.sets: dict[Span, ReplicationSet] = {}
        #: Last checkpoint of every span removed from the changefeed, by span.
        self.removed: dict[Span, int] = {}
        self._watermark: Watermark | None = None

    def sync(self, spans: Iterable[Span], checkpoint_ts: int) -> list[Command]:
        """Make the sets match the changefeed's spans: new ones start absent at
        ``checkpoint_ts``; spans no longer wanted are removed (once replicating)."""
        wanted = set(spans)
        out: list[Command] = []
        for span in wanted.difference(self.sets):
            self.sets[span] = ReplicationSet(span, checkpoint_ts)
            self.removed.pop(span, None)
        if len(wanted) == len(self.sets):
            return out
        for span, rs in list(self.sets.items()):
            if span in wanted:
                continue
            if rs.state is _ABSENT:
                del self.sets[span]
                self.removed[span] = rs.checkpoint_ts
            else:
                out += rs.remove()
        return out

    def heartbeat(self, capture: str, statuses: Sequence[SpanStatus], ack: int) -> list[Command]:
        """``capture`` reported every span it holds; a span it does not list is absent there."""
        out: list[Command] = []
        reported = set()
        for status in statuses:
            reported.add(status.span)
            out += self.report(capture, status, ack)
        for rs in self.sets.values():
            if (capture in (rs.primary, rs.secondary)) and rs.span not in reported:
                out += rs.observe(capture, SpanStatus(rs.span, SpanState.ABSENT, 0, 0), ack)
        return out

    def report(self, capture: str, status: SpanStatus, ack: int) -> list[Command]:
        """One span's status from ``capture``; a span the changefeed does not have is removed there."""
        rs = self.sets.get(status.span)
        if rs is not None:
            return rs.observe(capture, status, ack)
        if status.state in _IDLE:
            return []
        return [Command(capture, RemoveSpan(status.span))]

    def capture_lost(self, capture: str) -> list[Command]:
        out: list[Command] = []
        for rs in self.sets.values():
            out += rs.capture_lost(capture)
        return out

    def watermark(self, floor: int) -> Watermark | None:
        """The changefeed's progress, at least ``floor`` and never below an earlier answer."""
        if not self.sets:
            return None
        checkpoint = resolved = 1 << 64
        for rs in self.sets.values():
            if rs.state is _ABSENT:
                return None
            checkpoint = min(checkpoint, rs.checkpoint_ts)
            resolved = min(resolved, rs.resolved_ts)
        prev = self._watermark
        checkpoint = max(checkpoint, floor, prev.checkpoint_ts if prev else 0)
        resolved = max(resolved, checkpoint, prev.resolved_ts if prev else 0)
        self._watermark = Watermark(checkpoint, resolved)
        return self._watermark
