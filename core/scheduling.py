"""What a scheduler plugin is: it decides which capture runs which span.

A changefeed's maintainer owns the changefeed's spans. On every tick it tells
its scheduler what it knows (the spans, the live captures, where each span
runs now) and carries out the tasks the scheduler answers with. A scheduler
decides; it never talks to captures itself (seed 002: "SchedulerM" produces
tasks, "ReplicationM" executes them).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdcflow.core.events import Span
from cdcflow.core.plugin.base import ConfigT, Plugin

__all__ = ["ScheduleTask", "Scheduler", "SpanPlacement", "TaskKind"]


class TaskKind(enum.Enum):
    """The three table-scheduling tasks of seed 002."""

    ADD = "add"
    REMOVE = "remove"
    MOVE = "move"


@dataclass(frozen=True, slots=True)
class ScheduleTask:
    """Add ``span`` on ``target``; remove it from ``source``; or move it from
    ``source`` to ``target``."""

    kind: TaskKind
    span: Span
    source: str | None = None
    target: str | None = None


@dataclass(frozen=True, slots=True)
class SpanPlacement:
    """Where a span runs now: its primary capture (None when absent) and
    whether a scheduling task is in flight for it."""

    span: Span
    capture: str | None
    busy: bool = False


class Scheduler(Plugin[ConfigT], abc.ABC):
    """Base class of scheduler plugins."""

    @abc.abstractmethod
    def schedule(
        self,
        placements: Sequence[SpanPlacement],
        captures: Sequence[str],
        *,
        capture_load: Mapping[str, int] | None = None,
    ) -> list[ScheduleTask]:
        """Tasks that bring the placement closer to the scheduler's goal.

        ``placements`` covers every span the changefeed must replicate;
        ``captures`` are the live captures. The answer must not touch spans
        that are ``busy``. Returning no task means the placement is as wanted.
        """
