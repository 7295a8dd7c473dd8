"""The ``round-robin`` scheduler: the simplest placement that is still correct.

Spans that run nowhere (new spans, or spans of a capture that is gone) are
added to the live capture with the fewest spans, ties broken by capture id.
It never moves a span that is running; use a balancing scheduler for that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.core.scheduling import Scheduler, ScheduleTask, SpanPlacement, TaskKind

__all__ = ["RoundRobinConfig", "RoundRobinScheduler"]


class RoundRobinConfig(PluginConfig):
    """Options of the round-robin scheduler."""

    max_tasks_per_tick: int = Field(0, ge=0, description="Most add tasks issued per scheduling tick; 0 means no limit.")


class RoundRobinScheduler(Scheduler[RoundRobinConfig]):
    """Places each unplaced span on the least-loaded live capture; never moves spans."""

    type_name = "round-robin"
    Config = RoundRobinConfig

    def schedule(
        self,
        placements: Sequence[SpanPlacement],
        captures: Sequence[str],
        *,
        capture_load: Mapping[str, int] | None = None,
    ) -> list[ScheduleTask]:
        live = sorted(set(captures))
        if not live:
            return []
        load: Counter[str] = Counter({c: 0 for c in live})
        for capture, count in (capture_load or {}).items():
            if capture in load:
                load[capture] += count
        for p in placements:
            if p.capture in load and capture_load is None:
                load[p.capture] += 1
        tasks: list[ScheduleTask] = []
        limit = self.config.max_tasks_per_tick or len(placements)
        for p in sorted(placements, key=lambda p: p.span):
            if p.busy or p.capture in load:
                continue
            if len(tasks) >= limit:
                break
            target = min(live, key=lambda c: (load[c], c))
            load[target] += 1
            tasks.append(ScheduleTask(TaskKind.ADD, p.span, source=None, target=target))
        return tasks


@hookimpl
def cdcflow_register_schedulers(registry: Registrar[Scheduler[Any]]) -> None:
    registry.add(RoundRobinScheduler)
