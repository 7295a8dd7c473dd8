"""The balance policy: where spans should run, as add and move tasks.

A policy, not a scheduler plugin: the ``two-phase`` scheduler asks it on
every tick what to start, and carries the answers out through its
ReplicationSets (so moves are two-phase and gap-free). Keeping placement
apart from the state machine lets another policy drop in without touching
the protocol.

What it decides, in this order, each tick:

1. every absent span is added to the accepting capture with the fewest spans
   (ties by capture id), at most ``max_adds`` per tick — this is also how a
   dead capture's spans are reassigned: they become absent first;
2. spans replicating on a draining capture (one shutting down) move away;
3. when nothing is absent, spans move from the most loaded to the least
   loaded capture until counts are within one of each other — which is what
   happens when a capture joins;

with at most ``max_concurrent_moves`` moves in flight (drain and balance
together). A span counts on the capture it is heading to (the secondary of an
add or move), so decisions of one tick are not repeated on the next.
Manually placed (``pinned``) spans are moved for balance only when no other
span can go.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cdcflow.core.control.scheduling import ReplicationState
from cdcflow.core.data.events import Span

__all__ = ["AddTask", "BalancePolicy", "MoveTask", "Placement"]


class Placement(Protocol):
    """What the policy needs to know about one span (a ReplicationSet fits)."""

    @property
    def span(self) -> Span: ...
    @property
    def state(self) -> ReplicationState: ...
    @property
    def primary(self) -> str | None: ...
    @property
    def secondary(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class AddTask:
    """Add the absent ``span`` on ``capture``."""

    span: Span
    capture: str


@dataclass(frozen=True, slots=True)
class MoveTask:
    """Move the replicating ``span`` to ``target``."""

    span: Span
    target: str


@dataclass(frozen=True, slots=True)
class BalancePolicy:
    """Spreads spans evenly; ``max_adds``/``max_concurrent_moves`` of 0 mean no limit."""

    max_adds: int = 0
    max_concurrent_moves: int = 1
    balance: bool = True
    #: Move spans off captures that are shutting down.
    drain: bool = True

    def plan(
        self,
        placements: Iterable[Placement],
        accepting: Sequence[str],
        *,
        draining: Collection[str] = (),
        pinned: Collection[Span] = (),
        force_balance: bool = False,
    ) -> list[AddTask | MoveTask]:
        """The tasks to start now. ``accepting``: live captures that take spans."""
        targets = sorted(set(accepting))
        if not targets:
            return []
        sets = list(placements)
        load: Counter[str] = Counter({c: 0 for c in targets})
        for p in sets:
            heading = p.secondary or p.primary
            if heading is not None and heading in load:
                load[heading] += 1
        tasks: list[AddTask | MoveTask] = list(self._adds(sets, targets, load))
        in_flight = sum(1 for p in sets if p.primary is not None and p.secondary is not None)
        budget = self.max_concurrent_moves - in_flight if self.max_concurrent_moves else len(sets)
        drained = list(self._drain(sets, targets, load, set(draining), budget)) if self.drain else []
        tasks += drained
        budget -= len(drained)
        nothing_absent = not any(p.state is ReplicationState.ABSENT for p in sets)
        if (self.balance or force_balance) and nothing_absent and budget > 0:
            tasks += self._balance(sets, targets, load, set(pinned), budget)
        return tasks

    def _adds(self, sets: list[Placement], targets: list[str], load: Counter[str]) -> Iterable[AddTask]:
        absent = sorted(p.span for p in sets if p.state is ReplicationState.ABSENT)
        for span in absent[: self.max_adds or None]:
            target = min(targets, key=lambda c: (load[c], c))
            load[target] += 1
            yield AddTask(span, target)

    def _drain(
        self, sets: list[Placement], targets: list[str], load: Counter[str], draining: set[str], budget: int
    ) -> Iterable[MoveTask]:
        leaving = sorted(p.span for p in sets if p.state is ReplicationState.REPLICATING and p.primary in draining)
        for span in leaving[: max(budget, 0)]:
            target = min(targets, key=lambda c: (load[c], c))
            load[target] += 1
            yield MoveTask(span, target)

    def _balance(
        self, sets: list[Placement], targets: list[str], load: Counter[str], pinned: set[Span], budget: int
    ) -> list[MoveTask]:
        if max(load[c] for c in targets) - min(load[c] for c in targets) <= 1:
            return []  # balanced already: the common case, without sorting every span
        movable: dict[str, list[Span]] = {c: [] for c in targets}
        for p in sets:
            if p.state is ReplicationState.REPLICATING and p.primary in movable:
                movable[p.primary].append(p.span)
        for spans in movable.values():
            # Pinned spans last (popped last), then by span, so choices are stable.
            spans.sort(key=lambda s: (s not in pinned, s))
        moves: list[MoveTask] = []
        while len(moves) < budget:
            source = max(targets, key=lambda c: (load[c], c))
            target = min(targets, key=lambda c: (load[c], c))
            if load[source] - load[target] <= 1 or not movable[source]:
                break
            span = movable[source].pop()
            load[source] -= 1
            load[target] += 1
            moves.append(MoveTask(span, target))
        return moves
