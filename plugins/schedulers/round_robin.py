"""The ``round-robin`` scheduler: the simplest placement that is still correct.

Spans that run nowhere (new spans, or spans of a capture that is gone) are
added to the live capture with the fewest spans, ties broken by capture id.
It never moves a running span: no balancing, no draining of captures that
shut down, no move-table (use ``two-phase`` for those).

Adds go through the same ReplicationSets and protocol handling as
``two-phase`` (prepare, then replicate; duplicates, reordering and lost
messages tolerated), so round-robin differs only in what it decides.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from pydantic import Field

from cdcflow.core.control.scheduling import AgentMessage, Scheduler, SpanReplication, TickResult
from cdcflow.core.data.events import Span
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.plugins.schedulers.balance import BalancePolicy
from cdcflow.plugins.schedulers.two_phase import TwoPhaseConfig, TwoPhaseScheduler

__all__ = ["RoundRobinConfig", "RoundRobinScheduler"]


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
        engine_config = TwoPhaseConfig(
            heartbeat_ticks=config.heartbeat_ticks, max_adds_per_tick=config.max_tasks_per_tick, balance=False
        )
        self._engine = TwoPhaseScheduler(engine_config)
        self._engine.policy = BalancePolicy(max_adds=config.max_tasks_per_tick, balance=False, drain=False)

    def bind(self, changefeed_id: str, epoch: int) -> None:
        super().bind(changefeed_id, epoch)
        self._engine.bind(changefeed_id, epoch)

    def tick(
        self,
        *,
        checkpoint_ts: int,
        spans: Sequence[Span],
        captures: Collection[str],
        messages: Sequence[AgentMessage],
    ) -> TickResult:
        return self._engine.tick(checkpoint_ts=checkpoint_ts, spans=spans, captures=captures, messages=messages)

    def replication_status(self) -> list[SpanReplication]:
        return self._engine.replication_status()


@hookimpl
def cdcflow_register_schedulers(registry: Registrar[Scheduler[Any]]) -> None:
    registry.add(RoundRobinScheduler)
