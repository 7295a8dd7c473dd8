"""CPU-seconds of a capture's process tree, by what spends them.

A capture started with ``start_new_session=True`` (as the benchmarks start
``cdcflow run``) leads a session that its JVM and Spark's Python workers join.
:func:`sample` reads ``/proc`` for every process of that session and sums its
threads' user + system time into kinds:

* ``driver`` — the capture's own Python process (source feeds, event store,
  the driver's side of each micro-batch);
* ``python_tasks`` — Spark's Python workers that run tasks (``pyspark.worker``:
  data source reads, mounting, encoding, producing: the per-row work);
* ``python_planning`` — Spark's other Python processes (the streaming source's
  offsets, planning a data source read);
* ``jvm_compiler`` / ``jvm_gc`` / ``jvm_tasks`` / ``jvm_other`` — the JVM's
  threads by name: the JIT compilers, the garbage collector, the executor's
  task threads (Arrow conversion, shuffle, sort), and the rest (the
  micro-batch machinery, py4j, netty).

Two samples taken around a run give what each kind spent during it
(:func:`spent`); a process that exited between them loses its share, so
each figure is a lower bound: exact for the task workers (Spark reuses them),
possibly short for the planning processes, which Spark may start per query.
Linux only; elsewhere the samples are empty.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["CpuMeter", "process_cpu", "sample", "spent"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(path: Path) -> list[str] | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ")".
    head, _, tail = text.rpartition(")")
    return [head.partition("(")[2], *tail.split()]


def _cpu(fields: list[str]) -> float:
    # Fields after comm: state ppid pgrp session ... utime (12) stime (13) in this list.
    return (int(fields[12]) + int(fields[13])) / _TICK


def _jvm_kind(thread: str) -> str:
    if "Compiler" in thread or thread.startswith(("C1 ", "C2 ")):
        return "jvm_compiler"
    if "GC" in thread or thread.startswith(("G1 ", "Gang worker")):
        return "jvm_gc"
    if thread.startswith("Executor task"):
        return "jvm_tasks"
    return "jvm_other"


def _runs_tasks(process: Path) -> bool:
    try:
        args = (process / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"pyspark.worker" in args


def process_cpu(pids: list[int]) -> float:
    """CPU-seconds so far of the processes ``pids`` (every thread of each; 0 for one gone)."""
    total = 0.0
    for pid in pids:
        fields = _stat_fields(Path("/proc") / str(pid) / "stat")
        if fields is not None:
            total += _cpu(fields)
    return total


def sample(session: int) -> dict[str, float]:
    """CPU-seconds so far of every process in session ``session``, by kind."""
    out: dict[str, float] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return out
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry / "stat")
        if fields is None or int(fields[4]) != session:
            continue
        comm = fields[0]
        if int(entry.name) == session:
            out["driver"] = out.get("driver", 0.0) + _cpu(fields)
        elif comm == "java":
            for task in (entry / "task").iterdir():
                thread = _stat_fields(task / "stat")
                if thread is not None:
                    kind = _jvm_kind(thread[0])
                    out[kind] = out.get(kind, 0.0) + _cpu(thread)
        else:
            kind = "python_tasks" if _runs_tasks(entry) else "python_planning"
            out[kind] = out.get(kind, 0.0) + _cpu(fields)
    return out


def spent(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores each kind used on average between two samples ``seconds`` apart (CPU-seconds
    / wall seconds), with ``total``."""
    if seconds <= 0:
        return {}
    kinds = sorted(set(before) | set(after))
    cores = {k: max(0.0, after.get(k, 0.0) - before.get(k, 0.0)) / seconds for k in kinds}
    cores["total"] = sum(cores.values())
    return {k: round(v, 2) for k, v in cores.items()}


class CpuMeter:
    """Named samples of a session's CPU (:func:`sample`) and of this process's own,
    reported as ``own`` (in the benchmarks, the playground serving the source), and of
    ``others``: processes outside the session by name (a benchmark's own helpers that
    share the cores, a consumer counting what a sink wrote, say)."""

    def __init__(self, session: int, own: str = "playground", others: dict[str, int] | None = None) -> None:
        self.session = session
        self.own = own
        self.others = dict(others or {})
        self.marks: dict[str, tuple[float, dict[str, float]]] = {}

    def mark(self, name: str) -> None:
        times = os.times()
        cpu = sample(self.session)
        cpu[self.own] = times.user + times.system
        for kind, pid in self.others.items():
            cpu[kind] = process_cpu([pid])
        self.marks[name] = (time.perf_counter(), cpu)

    def cores(self, first: str, last: str) -> dict[str, float]:
        """Cores each kind used between two marks (empty when either is missing)."""
        if first not in self.marks or last not in self.marks:
            return {}
        (began, before), (ended, after) = self.marks[first], self.marks[last]
        return spent(before, after, ended - began)
