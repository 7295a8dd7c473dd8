"""The service GC safepoint a changefeed keeps in PD, so TiKV keeps the history it still needs.

The control plane calls :meth:`GCSafepointKeeper.update` with the minimum
checkpoint of the changefeeds it runs (after the checkpoint is persisted,
seed 000's order: sinks flushed, checkpoint saved, upstream told), with a TTL
that outlives a coordinator fail-over. PD answers with the minimum service
safepoint of all services; if that is above the checkpoint, TiKV may already
have collected versions the changefeed still needs and the changefeed fails
with :class:`CheckpointStaleError` (5001).
"""

from __future__ import annotations

from cdcflow.core.errors import CheckpointStaleError
from cdcflow.plugins.sources.tikv.pd import PDClient

__all__ = ["GCSafepointKeeper"]


class GCSafepointKeeper:
    """Service GC safepoints through one PD client. Calls raise PDUnavailableError (3001) when PD cannot be reached."""

    def __init__(self, pd: PDClient) -> None:
        self._pd = pd

    async def update(self, service_id: str, ts: int, ttl: int) -> int:
        """Keep history from ``ts`` for ``ttl`` seconds; returns PD's minimum service safepoint.

        Raises CheckpointStaleError when PD's minimum is above ``ts`` (PD did
        not accept ``ts``: the GC safepoint passed it already).
        """
        if ttl <= 0:
            raise ValueError(f"ttl must be positive (got {ttl}); use remove() to drop a service safepoint")
        minimum = await self._pd.update_service_gc_safepoint(service_id, ttl, ts)
        if minimum > ts:
            raise CheckpointStaleError(
                f"checkpoint {ts} of service {service_id!r} is below PD's GC safepoint {minimum}: "
                "the data it needs may be garbage-collected; recreate the changefeed from a newer start-ts",
                detail={"service_id": service_id, "checkpoint_ts": ts, "gc_safepoint": minimum},
            )
        return minimum

    async def remove(self, service_id: str) -> None:
        """Drop ``service_id``'s safepoint (the changefeed is removed); GC may then pass it."""
        await self._pd.update_service_gc_safepoint(service_id, 0, 0)

    async def current(self) -> int:
        """PD's GC safepoint: versions below it may be gone."""
        return await self._pd.get_gc_safepoint()

    async def check_start_ts(self, ts: int) -> None:
        """Raise CheckpointStaleError if a feed cannot start at ``ts`` (it is below the GC safepoint)."""
        safepoint = await self.current()
        if ts < safepoint:
            raise CheckpointStaleError(
                f"start ts {ts} is below PD's GC safepoint {safepoint}: the history since then is gone; "
                "choose a start-ts at or above the safepoint",
                detail={"start_ts": ts, "gc_safepoint": safepoint},
            )
