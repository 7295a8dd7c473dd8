"""One CockroachDB playground per process, for sources with ``playground: true``."""

from __future__ import annotations

import threading

from cdcflow.plugins.sources.cockroach_playground.playground import CockroachPlayground

__all__ = ["embedded_cockroach"]

_lock = threading.Lock()
_playground: CockroachPlayground | None = None


def embedded_cockroach(*, rate: float = 50.0, seed: int = 0) -> CockroachPlayground:
    """The process's playground, started on first use (the first caller's options win)."""
    global _playground
    with _lock:
        if _playground is None:
            _playground = CockroachPlayground(rate=rate, seed=seed).start()
        return _playground
