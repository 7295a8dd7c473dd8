"""The upstream GC safepoint: what a source plugin implements so that the
upstream keeps the history a changefeed still has to read.

An MVCC upstream (TiKV, CockroachDB) garbage-collects old versions. A
changefeed that resumes from checkpoint ``c`` needs every version newer than
``c``, so the coordinator asks the upstream to keep them: it sets a *service
GC safepoint* under its own service id with a TTL (TiKV: PD's
``UpdateServiceGCSafePoint``). The upstream never collects at or above the
minimum of the service safepoints still alive; a service safepoint whose TTL
runs out is dropped by the upstream, so a dead cdcflow cannot block GC
forever.

Source plugins implement :class:`GCSafepointKeeper` and hand it out through
:meth:`cdcflow.core.data.source.Source.gc_safepoint_keeper`. The coordinator's
:class:`cdcflow.core.control.gc.manager.GCManager` decides the value (seed 000:
"GC safepoint/屏障管理") and calls the keeper on a ticker and at once on
create and resume.
"""

from __future__ import annotations

import abc

__all__ = ["GCSafepointKeeper"]


class GCSafepointKeeper(abc.ABC):
    """Sets and removes cdcflow's service GC safepoint on one upstream.

    Implementations are coroutines on the capture's event loop; they raise
    :class:`~cdcflow.core.errors.PDUnavailableError` (or another retryable
    CdcflowError) when the upstream cannot be reached, and the coordinator
    retries on its next tick.
    """

    @abc.abstractmethod
    async def update_service_gc_safepoint(self, service_id: str, ttl_seconds: int, safepoint: int) -> int:
        """Ask the upstream to keep every version above ``safepoint`` for
        ``ttl_seconds`` under ``service_id`` (replacing that service's previous
        value, even when it was higher).

        Returns the upstream's minimum service safepoint after the call (PD's
        ``min_safe_point``). When it is above ``safepoint`` the upstream has
        already collected what a checkpoint at ``safepoint`` needs: the
        coordinator then fails the changefeed with ``ErrCheckpointStale``.
        """

    @abc.abstractmethod
    async def remove_service_gc_safepoint(self, service_id: str) -> None:
        """Drop ``service_id``'s safepoint (no changefeed needs protection any more).

        Idempotent: removing a safepoint that does not exist succeeds.
        """

    async def upstream_id(self) -> str | None:
        """The identity of the upstream this keeper reaches, as the upstream itself
        reports it (TiKV: PD's cluster id), so that two spellings of one address
        (``127.0.0.1:P``, ``localhost:P``) are known as one upstream and share one
        service safepoint. None: the upstream has no identity to report; the
        coordinator then tells upstreams apart by their source configuration.

        Raises a retryable CdcflowError when the upstream cannot be reached.
        """
        return None

    async def gc_safepoint(self) -> int | None:
        """The upstream's GC safepoint: versions below it may be gone (None: unknown)."""
        return None

    async def current_ts(self) -> int | None:
        """A fresh timestamp of the upstream (TiKV: a TSO from PD; None: unknown).

        A changefeed cannot be resumed from a checkpoint above it.
        """
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the keeper's connections."""
