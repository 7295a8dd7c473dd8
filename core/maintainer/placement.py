"""Where the maintainer meets the scheduler plugin: the one place that knows
:mod:`cdcflow.core.scheduling`'s interface.

The maintainer keeps, per span, the capture it was placed on; each tick it
hands the scheduler the placements and the live captures and gets back add /
remove / move tasks, which it turns into span-agent requests. Keeping this in
one module lets the scheduler's interface change (two-phase scheduling with
ReplicationSets and agent responses) without touching the maintainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cdcflow.core.events import Span
from cdcflow.core.scheduling import Scheduler, ScheduleTask, SpanPlacement, TaskKind

__all__ = ["Move", "Placement", "span_from_json", "span_to_json"]


def span_to_json(span: Span) -> dict[str, Any]:
    return {"table_id": span.table_id, "start": span.start.hex(), "end": span.end.hex()}


def span_from_json(data: dict[str, Any]) -> Span:
    return Span(int(data["table_id"]), bytes.fromhex(data["start"]), bytes.fromhex(data["end"]))


@dataclass(frozen=True, slots=True)
class Move:
    """Run ``span`` on ``target`` (None: nowhere) and stop it on ``source`` (None: nowhere)."""

    span: Span
    source: str | None
    target: str | None


class Placement:
    """Spans of one changefeed and the capture each runs on."""

    def __init__(self, scheduler: Scheduler[Any], spans: Sequence[Span]) -> None:
        self.scheduler = scheduler
        self.where: dict[Span, str | None] = {span: None for span in spans}

    def forget_captures(self, live: Sequence[str]) -> None:
        """Spans on captures that left are absent again."""
        for span, capture in self.where.items():
            if capture is not None and capture not in live:
                self.where[span] = None

    def plan(self, live: Sequence[str]) -> list[Move]:
        """Ask the scheduler; apply its tasks to the placement; return the moves to carry out."""
        placements = [SpanPlacement(span, capture) for span, capture in self.where.items()]
        moves: list[Move] = []
        for task in self.scheduler.schedule(placements, list(live)):
            moves.append(self._apply(task))
        return moves

    def _apply(self, task: ScheduleTask) -> Move:
        source = self.where.get(task.span)
        target = None if task.kind is TaskKind.REMOVE else task.target
        self.where[task.span] = target
        return Move(task.span, source, target)
