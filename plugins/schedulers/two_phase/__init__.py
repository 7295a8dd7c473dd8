"""The ``two-phase`` scheduler (seed 002): gap-free span moves through ReplicationSets.

Each span has a :class:`ReplicationSet` (Absent, Prepare, Commit,
Replicating, Removing) driven only by the agents' reports. Placement comes
from the :class:`~cdcflow.plugins.schedulers.balance.BalancePolicy`: absent
spans are added to the least-loaded capture, spans leave shutting-down
captures, and span counts are kept within one of each other, with a cap on
moves in flight. ``move_table`` queues manual moves (the API's and CLI's
move-table).

Per tick: membership changes first (a capture gone from ``captures`` is dead:
its sets recover — a move falls back to its source or its target, an add or a
replicating span becomes absent and is added again), then the agents'
messages (stale epochs and, per capture, anything not newer than the last
accepted seq are dropped), then the spans wanted, then — once every live
capture has answered a heartbeat — placement.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from cdcflow.core.control.scheduling import (
    AgentMessage,
    CaptureLiveness,
    HeartbeatResponse,
    InvalidScheduleRequestError,
    ReplicationState,
    Scheduler,
    SchedulerMessage,
    SpanReplication,
    TickResult,
)
from cdcflow.core.data.events import Span
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.plugins.schedulers.balance import AddTask, BalancePolicy
from cdcflow.plugins.schedulers.two_phase.manager import ReplicationManager
from cdcflow.plugins.schedulers.two_phase.replication_set import Command, ReplicationSet

__all__ = ["ReplicationManager", "ReplicationSet", "TwoPhaseConfig", "TwoPhaseScheduler"]


class TwoPhaseConfig(PluginConfig):
    """Options of the two-phase scheduler."""

    heartbeat_ticks: int = Field(1, ge=1, description="Ask every capture for a heartbeat once every this many ticks.")
    max_adds_per_tick: int = Field(
        0, ge=0, description="Most absent spans added per tick; 0 means no limit (all at once)."
    )
    max_concurrent_moves: int = Field(
        10, ge=0, description="Most balancing or draining moves in flight at once; 0 means no limit."
    )
    balance: bool = Field(
        True, description="Move spans between captures so that span counts stay within one of each other."
    )


@dataclass(slots=True)
class _Capture:
    initialized: bool = False
    liveness: CaptureLiveness = CaptureLiveness.ALIVE
    last_seq: int = 0


class TwoPhaseScheduler(Scheduler[TwoPhaseConfig]):
    """Places spans with two-phase add/move/remove and keeps captures balanced."""

    type_name = "two-phase"
    Config = TwoPhaseConfig
    summary = "Two-phase span scheduling (prepare, then commit): gap-free moves, balance, move-table."

    def __init__(self, config: TwoPhaseConfig) -> None:
        super().__init__(config)
        self.manager = ReplicationManager()
        self.policy = BalancePolicy(config.max_adds_per_tick, config.max_concurrent_moves, config.balance)
        self._captures: dict[str, _Capture] = {}
        self._manual: dict[Span, str] = {}
        self._pinned: set[Span] = set()
        self._rebalance = False
        self._ticks = 0

    def tick(
        self,
        *,
        checkpoint_ts: int,
        spans: Sequence[Span],
        captures: Collection[str],
        messages: Sequence[AgentMessage],
    ) -> TickResult:
        self._ticks += 1
        commands = self._membership(set(captures))
        for msg in messages:
            commands += self._receive(msg)
        commands += self.manager.sync(spans, checkpoint_ts)
        ready = bool(self._captures) and all(c.initialized for c in self._captures.values())
        if ready:
            commands += self._schedule()
        out: list[SchedulerMessage] = []
        if (self._ticks - 1) % self.config.heartbeat_ticks == 0:
            out += [self.heartbeat_request(c) for c in sorted(self._captures)]
        out += self._requests(commands)
        return TickResult(out, self.manager.watermark(checkpoint_ts))

    def _membership(self, live: set[str]) -> list[Command]:
        commands: list[Command] = []
        for gone in sorted(self._captures.keys() - live):
            del self._captures[gone]
            commands += self.manager.capture_lost(gone)
        for new in live - self._captures.keys():
            self._captures[new] = _Capture()
        return commands

    def _receive(self, msg: AgentMessage) -> list[Command]:
        info = self._captures.get(msg.capture_id)
        if info is None or not self.accepts(msg) or msg.seq <= info.last_seq:
            return []  # a dead capture, another epoch, a duplicate or an overtaken message
        info.last_seq = msg.seq
        if isinstance(msg, HeartbeatResponse):
            info.initialized = True
            info.liveness = msg.liveness
            return self.manager.heartbeat(msg.capture_id, msg.spans, msg.ack)
        return self.manager.report(msg.capture_id, msg.status, msg.ack)

    def _schedule(self) -> list[Command]:
        commands = self._manual_moves()
        accepting = [c for c, i in self._captures.items() if i.liveness is CaptureLiveness.ALIVE]
        draining = {c for c, i in self._captures.items() if i.liveness is CaptureLiveness.STOPPING}
        tasks = self.policy.plan(
            self.manager.sets.values(),
            accepting,
            draining=draining,
            pinned=self._pinned,
            force_balance=self._rebalance,
        )
        self._rebalance = False
        for task in tasks:
            rs = self.manager.sets[task.span]
            commands += rs.add(task.capture) if isinstance(task, AddTask) else rs.move(task.target)
        return commands

    def _manual_moves(self) -> list[Command]:
        commands: list[Command] = []
        for span, target in list(self._manual.items()):
            rs = self.manager.sets.get(span)
            if rs is None or target not in self._captures or (rs.primary == target and rs.secondary is None):
                del self._manual[span]  # gone, target dead, or already there
            elif rs.state is ReplicationState.REPLICATING:
                commands += rs.move(target)
                self._pinned.add(span)
                del self._manual[span]
        return commands

    def _requests(self, commands: list[Command]) -> list[SchedulerMessage]:
        out: list[SchedulerMessage] = []
        seen: set[Command] = set()
        for cmd in commands:
            if cmd in seen:
                continue  # the same request from two reports of one tick
            seen.add(cmd)
            msg = self.dispatch_request(cmd.capture, cmd.task)
            rs = self.manager.sets.get(cmd.task.span)
            if rs is not None:
                rs.note_sent(cmd.capture, msg.seq)
            out.append(msg)
        return out

    def replication_status(self) -> list[SpanReplication]:
        return [self.manager.sets[s].status() for s in sorted(self.manager.sets)]

    def move_table(self, table_id: int, target_capture: str) -> list[Span]:
        spans = sorted(s for s in self.manager.sets if s.table_id == table_id)
        detail = {"changefeed_id": self.changefeed_id, "table_id": table_id, "target_capture": target_capture}
        if not spans:
            raise InvalidScheduleRequestError(
                f"move-table: table {table_id} is not replicated by changefeed {self.changefeed_id!r}; "
                "check the table id with the changefeed's status",
                detail=detail,
            )
        if target_capture not in self._captures:
            alive = ", ".join(sorted(self._captures)) or "none"
            raise InvalidScheduleRequestError(
                f"move-table: capture {target_capture!r} is not alive (alive captures: {alive})", detail=detail
            )
        moving = [s for s in spans if self.manager.sets[s].primary != target_capture]
        for span in moving:
            self._manual[span] = target_capture
        return moving

    def rebalance(self) -> None:
        self._rebalance = True


@hookimpl
def cdcflow_register_schedulers(registry: Registrar[Scheduler[Any]]) -> None:
    registry.add(TwoPhaseScheduler)
