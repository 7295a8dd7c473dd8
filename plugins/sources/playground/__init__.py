"""The playground upstream: an in-process PD + TiKV stores + TiDB status API.

It speaks the real protocols (``pdpb.PD``, ``cdcpb.ChangeData``, TiDB's status
HTTP API) on 127.0.0.1, backed by an MVCC store with Percolator transactions,
regions that split and move, and a transactional workload. See
docs/reference/playground.md.

:mod:`.plugin` makes it a cdcflow plugin (the ``cdcflow playground`` command,
the upstream of a ``tikv`` source with ``playground`` set). ``Playground`` is
imported on first use, so that loading the plugin does not load the servers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdcflow.plugins.sources.playground.playground import Playground

__all__ = ["Playground"]


def __getattr__(name: str) -> Any:
    if name == "Playground":
        from cdcflow.plugins.sources.playground.playground import Playground

        return Playground
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
