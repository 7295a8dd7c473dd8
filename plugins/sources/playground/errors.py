"""Errors of the playground upstream."""

from __future__ import annotations

from cdcflow.core.errors import CdcflowError

__all__ = ["PlaygroundError"]


class PlaygroundError(CdcflowError):
    """Bad use of the playground (unknown region or store, a split key outside its region, …)."""
