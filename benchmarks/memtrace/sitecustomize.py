"""Where a ``cdcflow run`` process spends its memory: RSS and tracemalloc, sampled.

Put this directory on ``PYTHONPATH`` and name an output file in
``CDCFLOW_MEMTRACE``: every ``cdcflow`` process started so (not Spark's Python
workers) traces its Python allocations from start-up and appends a JSON line
per second — RSS, Python bytes traced — and, whenever RSS reaches a new high
by 48 MiB, the allocation sites holding the most memory (top 12, by
traceback of ``CDCFLOW_MEMTRACE_FRAMES`` frames, default 1). RSS minus what
Python traced is native memory (gRPC, librdkafka, Arrow, SQLite) and the
tracer's own. ``bench_e2e --memory --trace FILE`` sets both variables.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

_STEP_KIB = 48 * 1024
#: Frames kept per allocation: more says more, and costs far more time and memory.
_FRAMES = int(os.environ.get("CDCFLOW_MEMTRACE_FRAMES", "1"))


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _sample(out: Path) -> None:
    high = 0
    started = time.monotonic()
    while True:
        time.sleep(1.0)
        rss = _rss_kib()
        traced, _ = tracemalloc.get_traced_memory()
        record: dict[str, object] = {
            "t": round(time.monotonic() - started, 1),
            "rss_mib": rss // 1024,
            "python_mib": traced // 2**20,
        }
        if rss > high + _STEP_KIB:
            high = rss
            stats = tracemalloc.take_snapshot().statistics("traceback")[:12]
            record["top"] = [
                {"mib": round(s.size / 2**20, 1), "count": s.count, "at": [str(f) for f in s.traceback]} for s in stats
            ]
        with out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


_out = os.environ.get("CDCFLOW_MEMTRACE")
if _out and sys.argv and Path(sys.argv[0]).name == "cdcflow":
    tracemalloc.start(_FRAMES)
    threading.Thread(target=_sample, args=(Path(_out),), name="memtrace", daemon=True).start()
