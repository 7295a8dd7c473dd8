"""The service GC safepoint a changefeed keeps in PD, so TiKV keeps the history it still needs.

The control plane calls :meth:`PDSafepointKeeper.update_service_gc_safepoint`
with the minimum checkpoint of the changefeeds it runs (after the checkpoint
is persisted, seed 000's order: sinks flushed, checkpoint saved, upstream
told), with a TTL that outlives a coordinator fail-over. PD answers with the
minimum service safepoint of all services; if that is above the checkpoint,
TiKV may already have collected versions the changefeed still needs, and the
changefeed fails with :class:`CheckpointStaleError` (5001) —
:meth:`PDSafepointKeeper.update` raises it, the ``*_service_gc_safepoint``
methods return PD's answer for the caller to judge.

A keeper either shares the source's open PD client or owns one that it
connects on first use and closes in :meth:`PDSafepointKeeper.close` (the
control plane asks an unopened source for its keeper).
"""

from __future__ import annotations

from cdcflow.core.control.gc.keeper import GCSafepointKeeper
from cdcflow.core.errors import CheckpointStaleError
from cdcflow.plugins.sources.tikv.pd import PDClient

__all__ = ["PDSafepointKeeper"]


class PDSafepointKeeper(GCSafepointKeeper):
    """Service GC safepoints in one PD. Calls raise PDUnavailableError (3001) when PD cannot be reached."""

    def __init__(self, pd: PDClient, *, owns_client: bool = False) -> None:
        self._pd = pd
        self._owns = owns_client
        self._connected = not owns_client

    async def _client(self) -> PDClient:
        if not self._connected:
            await self._pd.connect()
            self._connected = True
        return self._pd

    async def close(self) -> None:
        """Release the PD connection if this keeper owns it."""
        if self._owns:
            await self._pd.close()
            self._connected = False

    # -- what the coordinator calls ------------------------------------------

    async def update_service_gc_safepoint(self, service_id: str, ttl_seconds: int, safepoint: int) -> int:
        """Keep versions above ``safepoint`` for ``ttl_seconds`` under ``service_id``; returns PD's minimum.

        Does not judge the answer: a minimum above ``safepoint`` means the
        checkpoint is stale (see :meth:`update` for the raising variant).
        """
        if ttl_seconds <= 0:
            raise ValueError(f"ttl must be positive (got {ttl_seconds}); use remove_service_gc_safepoint()")
        pd = await self._client()
        return await pd.update_service_gc_safepoint(service_id, ttl_seconds, safepoint)

    async def remove_service_gc_safepoint(self, service_id: str) -> None:
        """Drop ``service_id``'s safepoint (idempotent); GC may then pass it."""
        pd = await self._client()
        await pd.update_service_gc_safepoint(service_id, 0, 0)

    async def upstream_id(self) -> str:
        """``tikv-cluster-<id>``: the cluster id PD's GetMembers header carries, the same
        whichever address of the cluster (or spelling of it) the source names."""
        pd = await self._client()
        if not pd.cluster_id:
            await pd.connect()
        return f"tikv-cluster-{pd.cluster_id}"

    async def gc_safepoint(self) -> int:
        return await self.current()

    async def current_ts(self) -> int:
        pd = await self._client()
        return await pd.tso()

    # -- convenience with the stale check built in ------------------------------

    async def update(self, service_id: str, ts: int, ttl: int) -> int:
        """As :meth:`update_service_gc_safepoint`, raising CheckpointStaleError when PD's minimum is above ``ts``."""
        minimum = await self.update_service_gc_safepoint(service_id, ttl, ts)
        if minimum > ts:
            raise CheckpointStaleError(
                f"checkpoint {ts} of service {service_id!r} is below PD's GC safepoint {minimum}: "
                "the data it needs may be garbage-collected; recreate the changefeed from a newer start-ts",
                detail={"service_id": service_id, "checkpoint_ts": ts, "gc_safepoint": minimum},
            )
        return minimum

    async def remove(self, service_id: str) -> None:
        await self.remove_service_gc_safepoint(service_id)

    async def current(self) -> int:
        """PD's GC safepoint: versions below it may be gone."""
        pd = await self._client()
        return await pd.get_gc_safepoint()

    async def check_start_ts(self, ts: int) -> None:
        """Raise CheckpointStaleError if a feed cannot start at ``ts`` (it is below the GC safepoint)."""
        safepoint = await self.current()
        if ts < safepoint:
            raise CheckpointStaleError(
                f"start ts {ts} is below PD's GC safepoint {safepoint}: the history since then is gone; "
                "choose a start-ts at or above the safepoint",
                detail={"start_ts": ts, "gc_safepoint": safepoint},
            )
