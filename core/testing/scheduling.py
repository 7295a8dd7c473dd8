"""An in-process cluster for testing and benchmarking schedulers, without servers.

:class:`MemorySpanExecutor` is a :class:`SpanExecutor` whose spans take a
chosen number of polls to prepare and to stop, and whose progress moves when
the test says so (:meth:`MemorySpanExecutor.advance`). :class:`SimulatedCluster`
wires one scheduler to an :class:`Agent` per capture and delivers messages
between them, one round trip per :meth:`SimulatedCluster.step`; captures can
join, die (their spans vanish) or shut down gracefully.

This is a kit for scheduler authors (the scheduler and agent are the real
ones; only the data plane and the transport are simulated). It guarantees
nothing about timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cdcflow.core.control.scheduling.agent import Agent
from cdcflow.core.control.scheduling.protocol import AgentMessage, SchedulerMessage
from cdcflow.core.control.scheduling.scheduler import Scheduler, TickResult
from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SpanExecutor, SpanState, SpanStatus

__all__ = ["MemorySpanExecutor", "SimulatedCluster"]


@dataclass(slots=True)
class _Loaded:
    state: SpanState
    checkpoint_ts: int
    resolved_ts: int
    steps_left: int


class MemorySpanExecutor(SpanExecutor):
    """Spans in memory: a prepare takes ``prepare_polls`` calls, a stop ``stop_polls``."""

    def __init__(self, *, prepare_polls: int = 0, stop_polls: int = 0) -> None:
        self.prepare_polls = prepare_polls
        self.stop_polls = stop_polls
        self._spans: dict[Span, _Loaded] = {}
        #: Every (span, from_ts) this executor started writing downstream, in order.
        self.replication_starts: list[tuple[Span, int]] = []
        #: Every changefeed checkpoint handed to this executor, in order.
        self.changefeed_checkpoints: list[int] = []

    async def add_span(self, span: Span, checkpoint_ts: int, *, prepare: bool) -> bool:
        loaded = self._spans.get(span)
        if loaded is None or loaded.state is SpanState.STOPPING:
            if loaded is not None:
                return False  # still stopping: cannot load it again yet
            loaded = _Loaded(SpanState.PREPARING, checkpoint_ts, checkpoint_ts, self.prepare_polls)
            self._spans[span] = loaded
        if loaded.state is SpanState.PREPARING:
            if loaded.steps_left > 0:
                loaded.steps_left -= 1
                return False
            loaded.state = SpanState.PREPARED
        if prepare or loaded.state is SpanState.REPLICATING:
            return True
        # Phase two: write downstream from the later of our start and the given checkpoint.
        loaded.checkpoint_ts = max(loaded.checkpoint_ts, checkpoint_ts)
        loaded.resolved_ts = max(loaded.resolved_ts, loaded.checkpoint_ts)
        loaded.state = SpanState.REPLICATING
        self.replication_starts.append((span, loaded.checkpoint_ts))
        return True

    async def remove_span(self, span: Span) -> int | None:
        loaded = self._spans.get(span)
        if loaded is None:
            return 0
        if loaded.state is not SpanState.STOPPING:
            loaded.state = SpanState.STOPPING
            loaded.steps_left = self.stop_polls
        if loaded.steps_left > 0:
            loaded.steps_left -= 1
            return None
        del self._spans[span]
        return loaded.checkpoint_ts

    def status(self, span: Span) -> SpanStatus:
        loaded = self._spans.get(span)
        if loaded is None:
            return SpanStatus(span, SpanState.ABSENT, 0, 0)
        return SpanStatus(span, loaded.state, loaded.checkpoint_ts, loaded.resolved_ts)

    def spans(self) -> list[Span]:
        return sorted(self._spans)

    async def set_changefeed_checkpoint(self, ts: int) -> None:
        self.changefeed_checkpoints.append(ts)

    def advance(self, ts: int) -> None:
        """Resolved ts of every loaded span, and checkpoint of replicating ones, move to ``ts``."""
        for loaded in self._spans.values():
            loaded.resolved_ts = max(loaded.resolved_ts, ts)
            if loaded.state is SpanState.REPLICATING:
                loaded.checkpoint_ts = max(loaded.checkpoint_ts, ts)

    def crash(self) -> None:
        """Lose every span at once, as a killed process does."""
        self._spans.clear()


class SimulatedCluster:
    """One changefeed's scheduler and an agent per capture, in one process."""

    def __init__(
        self,
        scheduler: Scheduler[Any],
        captures: Iterable[str],
        *,
        changefeed_id: str = "cf",
        epoch: int = 1,
        prepare_polls: int = 0,
        stop_polls: int = 0,
    ) -> None:
        self.scheduler = scheduler
        self.changefeed_id = changefeed_id
        self.prepare_polls = prepare_polls
        self.stop_polls = stop_polls
        scheduler.bind(changefeed_id, epoch)
        self.agents: dict[str, Agent] = {}
        self.executors: dict[str, MemorySpanExecutor] = {}
        for capture in captures:
            self.join(capture)
        #: Agent responses waiting for the next tick.
        self.inbox: list[AgentMessage] = []
        self.last: TickResult = TickResult()

    def join(self, capture: str) -> None:
        """A new capture comes up (empty)."""
        executor = MemorySpanExecutor(prepare_polls=self.prepare_polls, stop_polls=self.stop_polls)
        self.executors[capture] = executor
        self.agents[capture] = Agent(self.changefeed_id, capture, executor)

    def kill(self, capture: str) -> None:
        """The capture dies: its spans vanish and it leaves the membership."""
        self.executors.pop(capture).crash()
        del self.agents[capture]
        self.inbox = [m for m in self.inbox if m.capture_id != capture]

    def advance(self, ts: int) -> None:
        """Every capture's spans make progress up to ``ts``."""
        for executor in self.executors.values():
            executor.advance(ts)

    def step(self, spans: Iterable[Span], checkpoint_ts: int = 0) -> TickResult:
        """One scheduler tick, then every request delivered and answered."""
        inbox, self.inbox = self.inbox, []
        self.last = self.scheduler.tick(
            checkpoint_ts=checkpoint_ts, spans=list(spans), captures=list(self.agents), messages=inbox
        )
        self.deliver(self.last.messages)
        return self.last

    def deliver(self, messages: Iterable[SchedulerMessage]) -> None:
        """Hand ``messages`` to their agents (unknown captures drop them); also polls idle agents."""
        by_capture: dict[str, list[SchedulerMessage]] = {c: [] for c in self.agents}
        for msg in messages:
            if msg.capture_id in by_capture:
                by_capture[msg.capture_id].append(msg)
        self.inbox.extend(asyncio.run(self._handle_all(by_capture)))

    async def _handle_all(self, by_capture: dict[str, list[SchedulerMessage]]) -> list[AgentMessage]:
        out: list[AgentMessage] = []
        for capture, msgs in by_capture.items():
            out.extend(await self.agents[capture].handle(msgs))
        return out

    def replicating(self) -> dict[Span, list[str]]:
        """The captures replicating each span now (the ground truth, not the scheduler's view)."""
        out: dict[Span, list[str]] = {}
        for capture, executor in sorted(self.executors.items()):
            for span in executor.spans():
                if executor.status(span).state is SpanState.REPLICATING:
                    out.setdefault(span, []).append(capture)
        return out

    def run_until_replicating(self, spans: Iterable[Span], *, max_steps: int = 1000) -> int:
        """Step until every span replicates on a live capture; returns the steps taken."""
        wanted = list(spans)
        for n in range(1, max_steps + 1):
            self.step(wanted)
            if set(self.replicating()) >= set(wanted):
                return n
        raise AssertionError(f"spans not all replicating after {max_steps} steps")
