"""Hooks the ``tikv`` source offers other plugins.

The tikv plugin adds them to the plugin manager (``cdcflow_add_hookspecs``);
docs/reference/hooks.md documents them with cdcflow's own.
"""

from __future__ import annotations

from typing import Protocol

from cdcflow.core.plugin.hookspec import hookspec
from cdcflow.plugins.sources.tikv.config import EmbeddedPlaygroundConfig

__all__ = ["EmbeddedUpstream", "cdcflow_tikv_embedded_upstream"]


class EmbeddedUpstream(Protocol):
    """An upstream running in this process: where its PD and TiDB status API listen."""

    @property
    def pd_address(self) -> str: ...

    @property
    def status_address(self) -> str: ...


@hookspec(firstresult=True)
def cdcflow_tikv_embedded_upstream(options: EmbeddedPlaygroundConfig) -> EmbeddedUpstream | None:
    """Start, or attach to, this process's in-process upstream for a ``tikv``
    source whose ``playground`` option is set, with its options (stores, rate, seed).

    Called when such a source opens, and when the control plane asks it for its
    GC safepoint keeper; may block while the upstream starts (the source calls
    it off the event loop). Return the running upstream, or None to leave it to
    another plugin. firstresult: the first upstream returned is used. The
    playground plugin implements it; without one, the source fails to open.
    """
