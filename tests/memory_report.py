"""What holds a test process's memory: a few lines for the end of a log.

The memory guard (``tests/conftest.py``) prints these last, after every thread's stack,
because a CI log is often kept only by its tail. Each line names one kind of memory, so
that a runaway shows at a glance whether it is Python objects (tracemalloc's sites),
C allocations through malloc (gRPC, librdkafka), Arrow's own pool, or mappings made
outside both. Standard library only, and nothing here raises: a report that fails
would hide the failure it reports.
"""

from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
import threading
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

#: The checkout's root, which the report leaves out of file names.
_ROOT = str(Path(__file__).resolve().parents[1]) + "/"
_STDLIB = sysconfig.get_paths()["stdlib"] + "/"
GIB = 2**30
MIB = 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_in_use() -> tuple[int, int] | None:
    """glibc's ``(bytes in use in its arenas, bytes in its own mmap'd blocks)``, or None
    where there is no ``mallinfo2`` (another C library, glibc before 2.33)."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.uordblks), int(info.hblkhd)


def arrow_pool_bytes() -> int | None:
    """What Arrow's default memory pool holds, if pyarrow is loaded (it allocates
    outside malloc, with jemalloc or mimalloc)."""
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is None:
        return None
    try:
        return int(pyarrow.total_allocated_bytes())
    except Exception:  # noqa: BLE001 - a report that fails would hide the failure it reports
        return None


def _mappings(smaps: str) -> Iterator[tuple[int, str]]:
    """``(resident bytes, name)`` of each mapping in the text of ``/proc/PID/smaps``: a
    header line per mapping (``start-end perms offset dev inode [name]``), then its
    ``Field: value`` lines."""
    name: str | None = None
    rss = 0
    for line in smaps.splitlines():
        fields = line.split(None, 5)
        if not fields:
            continue
        if fields[0].endswith(":"):
            if fields[0] == "Rss:":
                rss = int(fields[1]) * 1024
            continue
        if name is not None:
            yield rss, name
        name = fields[5].strip() if len(fields) > 5 else "[anon]"
        rss = 0
    if name is not None:
        yield rss, name


def largest_mappings(top: int = 3, smaps_path: str = "/proc/self/smaps") -> list[tuple[int, str]]:
    """The ``top`` mappings holding the most resident memory, largest first."""
    try:
        with open(smaps_path) as f:
            text = f.read()
    except OSError:
        return []
    return sorted(_mappings(text), key=lambda m: m[0], reverse=True)[:top]


def _fd_count() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def _frames(traceback: tracemalloc.Traceback, depth: int = 4) -> str:
    """The innermost ``depth`` frames of an allocation, innermost first, on one line
    (a Traceback is ordered from the oldest frame to the most recent)."""
    frames = list(traceback)[-depth:][::-1]
    return " <- ".join(f"{_short(f.filename)}:{f.lineno}" for f in frames)


def _own(path: str) -> bool:
    """Whether ``path`` is this checkout's code (its virtualenv is inside it too)."""
    return path.startswith(_ROOT) and "/site-packages/" not in path


def _short(path: str) -> str:
    for marker in ("/site-packages/", _ROOT, _STDLIB):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def summary(rss: int, stats: list[tracemalloc.Statistic] | None, top: int = 4) -> list[str]:
    """The report's lines, each short enough to read in a log's last screen; ``stats``:
    the traced allocations by traceback, largest first (None when not tracing)."""
    parts = [f"resident {rss / GIB:.2f} GiB"]
    malloc = malloc_in_use()
    if malloc is not None:
        parts.append(f"malloc in use {malloc[0] / GIB:.2f} GiB + {malloc[1] / GIB:.2f} GiB mmap'd")
    arrow = arrow_pool_bytes()
    if arrow is not None:
        parts.append(f"Arrow pool {arrow / GIB:.2f} GiB")
    parts.append(f"{threading.active_count()} Python threads, {_fd_count()} fds")
    lines = ["memory: " + "; ".join(parts)]
    maps = largest_mappings()
    if maps:
        lines.append("largest mappings: " + "; ".join(f"{size / MIB:.0f} MiB {name}" for size, name in maps))
    if stats is not None:
        traced = sum(s.size for s in stats)
        lines.append(f"Python allocations since tracing began: {traced / MIB:.0f} MiB in {len(stats)} sites")
        # Sites under a MiB say nothing of a runaway; the first is shown whatever its size.
        for stat in [s for s in stats[:top] if s.size >= MIB] or stats[:1]:
            lines.append(f"  {stat.size / MIB:.0f} MiB in {stat.count} blocks at {_frames(stat.traceback)}")
    return lines


class Watch:
    """What the guard sees between its checks: the resident size over the last minute,
    and, once tracing, which of this checkout's frames each thread is running (a
    sampling profile of a runaway that a stack dump at the limit comes too late for)."""

    def __init__(self, window: float = 60.0) -> None:
        self.window = window
        self.sizes: list[tuple[float, int]] = []
        self.frames: Counter[str] = Counter()
        #: Each thread's frame in the latest sample.
        self.last: dict[int, str] = {}
        self.samples = 0

    def size(self, now: float, rss: int) -> None:
        self.sizes.append((now, rss))
        while self.sizes and self.sizes[0][0] < now - self.window:
            del self.sizes[0]

    def sample(self, skip: int) -> None:
        """Count, for every thread but ``skip``, the innermost frame of this checkout's own
        code (not the libraries of its virtualenv) that the thread is in."""
        self.samples += 1
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == skip:
                continue
            current: FrameType | None = frame
            while current is not None and not _own(current.f_code.co_filename):
                current = current.f_back
            if current is not None:
                code = current.f_code
                where = f"{names.get(ident, ident)} {_short(code.co_filename)}:{current.f_lineno} {code.co_name}"
                self.frames[where] += 1
                self.last[ident] = where

    def lines(self, now: float) -> list[str]:
        out = []
        if self.sizes:
            marks = [(ago, self._at(now - ago)) for ago in (60, 30, 10, 3, 1)]
            out.append(
                "resident before the stop: "
                + ", ".join(f"{size / GIB:.2f} GiB {ago} s ago" for ago, size in marks if size is not None)
            )
        if self.samples:
            # Where a thread still is at the stop, the stack dump shows; and a thread that
            # waited all along would be at the top of any count. What is left are the
            # frames threads ran and then left: a runaway that has gone idle.
            stopped_at = set(self.last.values())
            moved = [(where, n) for where, n in self.frames.most_common() if where not in stopped_at][:3]
            top = ", ".join(f"{where} ({count})" for where, count in moved)
            out.append(
                f"frames left in {self.samples} samples since tracing began: {top or 'none, every thread stayed put'}"
            )
        return out

    def _at(self, when: float) -> int | None:
        """The resident size last seen at or before ``when``."""
        seen = [rss for t, rss in self.sizes if t <= when]
        return seen[-1] if seen else None
