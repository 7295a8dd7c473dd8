"""The ``round-robin`` scheduler: the simplest placement that is still correct.

Spans that run nowhere (new spans, or spans of a capture that is gone) are
added in one phase (``is_secondary=False``) to the live capture with the
fewest spans, ties broken by capture id. It never moves a running span and
has no move-table; use ``two-phase`` for that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

from pydantic import Field

from cdcflow.core.events import Span
from cdcflow.core.executor import SpanState, SpanStatus
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.core.scheduling import (
    AddSpan,
    AgentMessage,
    DispatchTableResponse,
    RemoveSpan,
    ReplicationState,
    Scheduler,
    SchedulerMessage,
    SpanReplication,
    TickResult,
    Watermark,
)

__all__ = ["RoundRobinConfig", "RoundRobinScheduler"]

_LOADED = {SpanState.PREPARING, SpanState.PREPARED, SpanState.REPLICATING, SpanState.STOPPING}


class RoundRobinConfig(PluginConfig):
    """Options of the round-robin scheduler."""

    max_tasks_per_tick: int = Field(0, ge=0, description="Most add tasks issued per scheduling tick; 0 means no limit.")
    heartbeat_ticks: int = Field(1, ge=1, description="Ask every capture for a heartbeat once every this many ticks.")


class RoundRobinScheduler(Scheduler[RoundRobinConfig]):
    """Places each unplaced span on the least-loaded live capture; never moves spans."""

    type_name = "round-robin"
    Config = RoundRobinConfig
    summary = "Adds unplaced spans to the least-loaded capture; never moves a running span."

    def __init__(self, config: RoundRobinConfig) -> None:
        super().__init__(config)
        self._ticks = 0
        self._heard: set[str] = set()
        # Where each span is loaded, as the agents last reported, and its status there.
        self._where: dict[Span, tuple[str, SpanStatus]] = {}
        self._spans: list[Span] = []
        self._watermark: Watermark | None = None

    def tick(
        self,
        *,
        checkpoint_ts: int,
        spans: Sequence[Span],
        captures: Collection[str],
        messages: Sequence[AgentMessage],
    ) -> TickResult:
        self._ticks += 1
        self._spans = sorted(set(spans))
        live = set(captures)
        for msg in messages:
            if self.accepts(msg) and msg.capture_id in live:
                self._receive(msg)
        self._heard &= live
        self._where = {s: (c, st) for s, (c, st) in self._where.items() if c in live}
        out: list[SchedulerMessage] = []
        if self._ticks % self.config.heartbeat_ticks == 1 % self.config.heartbeat_ticks:
            out += [self.heartbeat_request(c) for c in sorted(live)]
        if live and live <= self._heard:
            out += self._dispatch(checkpoint_ts, spans, sorted(live))
        return TickResult(out, self._advance(checkpoint_ts, spans))

    def _receive(self, msg: AgentMessage) -> None:
        if isinstance(msg, DispatchTableResponse):
            self._record(msg.capture_id, msg.status)
            return
        self._heard.add(msg.capture_id)
        reported = {s.span for s in msg.spans}
        for span, (capture, _) in list(self._where.items()):
            if capture == msg.capture_id and span not in reported:
                del self._where[span]
        for status in msg.spans:
            self._record(msg.capture_id, status)

    def _record(self, capture: str, status: SpanStatus) -> None:
        if status.state in _LOADED:
            self._where[status.span] = (capture, status)
        elif self._where.get(status.span, ("", None))[0] == capture:
            del self._where[status.span]

    def _dispatch(self, checkpoint_ts: int, spans: Sequence[Span], live: list[str]) -> list[SchedulerMessage]:
        wanted = set(spans)
        out: list[SchedulerMessage] = []
        for span, (capture, status) in sorted(self._where.items()):
            if span not in wanted and status.state is not SpanState.STOPPING:
                out.append(self.dispatch_request(capture, RemoveSpan(span)))
        load: Counter[str] = Counter({c: 0 for c in live})
        load.update(c for c, _ in self._where.values())
        limit = self.config.max_tasks_per_tick or len(wanted)
        added = 0
        for span in sorted(wanted):
            if span in self._where or added >= limit:
                continue
            target = min(live, key=lambda c: (load[c], c))
            load[target] += 1
            added += 1
            out.append(self.dispatch_request(target, AddSpan(span, checkpoint_ts, is_secondary=False)))
        return out

    def _advance(self, checkpoint_ts: int, spans: Sequence[Span]) -> Watermark | None:
        statuses = [self._where.get(s) for s in spans]
        running = [st for cs in statuses if cs is not None and (st := cs[1]).state is SpanState.REPLICATING]
        if not spans or len(running) < len(spans):
            return None  # a span is absent or not replicating yet: cannot advance
        floor = max(checkpoint_ts, self._watermark.checkpoint_ts if self._watermark else 0)
        resolved_floor = max(floor, self._watermark.resolved_ts if self._watermark else 0)
        checkpoint = max(floor, min(st.checkpoint_ts for st in running))
        resolved = max(resolved_floor, checkpoint, min(st.resolved_ts for st in running))
        self._watermark = Watermark(checkpoint, resolved)
        return self._watermark

    def replication_status(self) -> list[SpanReplication]:
        out = []
        for span in self._spans:
            if span not in self._where:
                out.append(SpanReplication(span, ReplicationState.ABSENT, None, None, 0, 0))
                continue
            capture, st = self._where[span]
            state = {
                SpanState.REPLICATING: ReplicationState.REPLICATING,
                SpanState.STOPPING: ReplicationState.REMOVING,
            }.get(st.state, ReplicationState.PREPARE)
            out.append(SpanReplication(span, state, capture, None, st.checkpoint_ts, st.resolved_ts))
        return out


@hookimpl
def cdcflow_register_schedulers(registry: Registrar[Scheduler[Any]]) -> None:
    registry.add(RoundRobinScheduler)
