"""The test process's resident size, and a watchdog that aborts it past a limit.

``python tests/memory_watch.py PID LIMIT_BYTES`` runs beside the test process
(see ``tests/conftest.py``): past the limit it sends SIGABRT, which pytest's
faulthandler answers with every thread's stack even while a runaway in C code
holds the GIL. It ends when the process does. Standard library only, so that it
starts in a moment.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def rss_bytes(pid: int | str = "self") -> int:
    """The resident size of process ``pid`` (OSError once it is gone)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def watch(pid: int, limit: int) -> None:
    while True:
        try:
            rss = rss_bytes(pid)
        except OSError:
            return
        if rss > limit:
            os.kill(pid, signal.SIGABRT)
            return
        time.sleep(0.5)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
