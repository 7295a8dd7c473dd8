"""How fast the two-phase scheduler is on this machine.

1. Scheduling N spans (default 10,000) over 3 captures until every span
   replicates: the real scheduler and the real agents, in one process, with
   in-memory executors (``SimulatedCluster``). Baselines measured in the same
   run: the executor calls alone (each span prepared, then replicated, on a
   round-robin capture, no scheduler, no messages), and the ``round-robin``
   scheduler (same engine, no balancing) through the same protocol.
2. One steady tick once everything replicates: the scheduler takes a
   heartbeat from each capture (N span statuses in all) and answers.
3. One checkpoint computation (``ReplicationManager.watermark``) over N
   replicating spans. Baselines: ``min()`` over N ints, and one pass over a
   dict of N objects reading two attributes.

    .venv/bin/python benchmarks/bench_scheduler.py [N]

Figures are ratios to the baselines; absolute times depend on the machine.
"""

from __future__ import annotations

import asyncio
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

from cdcflow.core.control.scheduling import Scheduler
from cdcflow.core.data.events import Span
from cdcflow.core.testing.scheduling import MemorySpanExecutor, SimulatedCluster
from cdcflow.plugins.schedulers.round_robin import RoundRobinConfig, RoundRobinScheduler
from cdcflow.plugins.schedulers.two_phase import TwoPhaseConfig, TwoPhaseScheduler

CAPTURES = ["capture-1", "capture-2", "capture-3"]


def spans(n: int) -> list[Span]:
    return [Span(i + 1, b"t%08d_r" % (i + 1), b"t%08d_s" % (i + 1)) for i in range(n)]


def direct(n: int) -> float:
    """The data-plane work alone: every span prepared then replicated, no scheduler."""
    executors = [MemorySpanExecutor() for _ in CAPTURES]
    todo = spans(n)

    async def run() -> None:
        for i, span in enumerate(todo):
            executor = executors[i % len(executors)]
            await executor.add_span(span, 100, prepare=True)
            await executor.add_span(span, 100, prepare=False)

    t0 = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - t0


def scheduled(n: int, make: Callable[[], Scheduler[Any]]) -> tuple[float, int]:
    cluster = SimulatedCluster(make(), CAPTURES)
    todo = spans(n)
    t0 = time.perf_counter()
    steps = cluster.run_until_replicating(todo)
    elapsed = time.perf_counter() - t0
    counts = sorted(len(v) for v in _by_capture(cluster).values())
    assert counts[-1] - counts[0] <= 1, counts
    return elapsed, steps


def _by_capture(cluster: SimulatedCluster) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for span, captures in cluster.replicating().items():
        out.setdefault(captures[0], []).append(span)
    return out


def checkpoint_cost(n: int) -> tuple[float, float, float]:
    """Seconds per call: the watermark, min() over ints, a dict pass."""
    scheduler = TwoPhaseScheduler(TwoPhaseConfig())
    cluster = SimulatedCluster(scheduler, CAPTURES)
    todo = spans(n)
    cluster.run_until_replicating(todo)
    cluster.advance(1000)
    cluster.step(todo)
    cluster.step(todo)
    manager = scheduler.manager
    assert manager.watermark(0) is not None
    ints = [rs.checkpoint_ts for rs in manager.sets.values()]
    sets = manager.sets

    def dict_pass() -> tuple[int, int]:
        c = r = 1 << 64
        for rs in sets.values():
            c = min(c, rs.checkpoint_ts)
            r = min(r, rs.resolved_ts)
        return c, r

    reps = 200
    watermark = min(timeit.repeat(lambda: manager.watermark(0), number=reps, repeat=5)) / reps
    plain_min = min(timeit.repeat(lambda: min(ints), number=reps, repeat=5)) / reps
    passed = min(timeit.repeat(dict_pass, number=reps, repeat=5)) / reps
    return watermark, plain_min, passed


def steady_tick(n: int) -> float:
    """Seconds for one scheduler tick handling a heartbeat from every capture."""
    scheduler = TwoPhaseScheduler(TwoPhaseConfig())
    cluster = SimulatedCluster(scheduler, CAPTURES)
    todo = spans(n)
    cluster.run_until_replicating(todo)
    cluster.step(todo)
    times = []
    for _ in range(5):
        inbox, cluster.inbox = cluster.inbox, []
        t0 = time.perf_counter()
        result = scheduler.tick(checkpoint_ts=0, spans=todo, captures=CAPTURES, messages=inbox)
        times.append(time.perf_counter() - t0)
        cluster.deliver(result.messages)
    return min(times)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    print(f"scheduling {n:,} spans over {len(CAPTURES)} captures until all replicate")
    base = direct(n)
    two_phase, tp_steps = scheduled(n, lambda: TwoPhaseScheduler(TwoPhaseConfig()))
    round_robin, rr_steps = scheduled(n, lambda: RoundRobinScheduler(RoundRobinConfig()))
    print(f"  executor calls only (baseline): {base * 1000:9.1f} ms")
    print(f"  two-phase scheduler + agents:   {two_phase * 1000:9.1f} ms  ({tp_steps} ticks)  x{two_phase / base:.1f}")
    print(
        f"  round-robin (adds only):        {round_robin * 1000:9.1f} ms  ({rr_steps} ticks)  x{round_robin / base:.1f}"
    )
    tick = steady_tick(n)
    print(f"  one steady tick, 3 heartbeats of {n:,} spans: {tick * 1000:.1f} ms  x{tick / base:.2f} of the baseline")
    watermark, plain_min, passed = checkpoint_cost(n)
    print(f"one checkpoint computation over {n:,} spans")
    print(f"  min() over {n:,} ints (baseline): {plain_min * 1e6:9.1f} us")
    print(f"  dict pass, two attributes:        {passed * 1e6:9.1f} us  x{passed / plain_min:.1f}")
    print(f"  ReplicationManager.watermark:     {watermark * 1e6:9.1f} us  x{watermark / plain_min:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
