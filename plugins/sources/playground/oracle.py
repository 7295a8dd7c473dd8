"""The playground's timestamp oracle: TSOs as PD hands them out.

A TSO is ``physical_ms << 18 | logical``. The oracle guarantees strictly
increasing values across threads, even when the wall clock stalls or goes
back (the physical part then stays put and the logical part counts up; when
the logical part would overflow, the physical part moves one millisecond on).
It does not guarantee that the physical part equals the wall clock.
"""

from __future__ import annotations

import threading
import time

from cdcflow.core.data.events import TSO_LOGICAL_BITS

__all__ = ["TSOOracle"]

_MAX_LOGICAL = (1 << TSO_LOGICAL_BITS) - 1


class TSOOracle:
    """Thread-safe, strictly monotonic TSO allocator."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._physical = 0
        self._logical = 0

    def allocate(self, count: int = 1) -> int:
        """Allocate ``count`` consecutive timestamps; return the **last** one.

        This is how PD's Tso RPC answers a batch: the first of the batch is
        ``last - count + 1`` (all in the same physical millisecond).
        """
        if count < 1:
            raise ValueError(f"TSO count must be at least 1, got {count}")
        if count > _MAX_LOGICAL:
            raise ValueError(f"TSO count must be below {_MAX_LOGICAL}, got {count}")
        with self._lock:
            now = int(time.time() * 1000)
            if now > self._physical:
                self._physical, self._logical = now, 0
            if self._logical + count > _MAX_LOGICAL:
                self._physical, self._logical = self._physical + 1, 0
            self._logical += count
            return (self._physical << TSO_LOGICAL_BITS) | self._logical

    def next(self) -> int:
        """One fresh timestamp."""
        return self.allocate(1)

    def peek(self) -> int:
        """The last timestamp handed out (0 before the first), without allocating."""
        with self._lock:
            return (self._physical << TSO_LOGICAL_BITS) | self._logical
