"""One playground per process, for deployments that embed the upstream.

``make run``'s connectors.yaml is meant to work on a machine with no TiDB
cluster: a source configured to use the playground calls
:func:`embedded_playground` when it opens and connects to the returned
addresses. Every caller in the process shares the same playground (so two
connectors see the same data); it stops at interpreter exit or on
:func:`stop_embedded_playground`. Options of later calls are ignored while one
runs.
"""

from __future__ import annotations

import atexit
import threading

from cdcflow.plugins.sources.playground.playground import Playground

__all__ = ["embedded_playground", "stop_embedded_playground"]

_lock = threading.Lock()
_instance: Playground | None = None


def embedded_playground(
    *, stores: int = 3, rate: float = 100.0, seed: int = 0, pd_port: int = 0, status_port: int = 0
) -> Playground:
    """The process's playground, started on first use with these options."""
    global _instance
    with _lock:
        if _instance is None:
            playground = Playground(stores=stores, rate=rate, seed=seed, pd_port=pd_port, status_port=status_port)
            playground.start()
            atexit.register(stop_embedded_playground)
            _instance = playground
        return _instance


def stop_embedded_playground() -> None:
    """Stop the process's playground, if one runs (idempotent)."""
    global _instance
    with _lock:
        playground, _instance = _instance, None
    if playground is not None:
        playground.stop()
