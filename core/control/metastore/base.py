"""The metastore interface: where the control plane keeps its state.

One interface, two implementations: SQLite (``sqlite:///path``, the embedded
default, safe for one node) and etcd (``etcd://host:port[,host:port]``, the
cluster store). Both pass the same test suite.

What every implementation guarantees:

* **Sessions.** A capture registers under a :class:`Session` with a TTL; its
  registration disappears when the session is not kept alive (an etcd lease).
  ``Session.lost`` is set when the session is known to be gone.
* **One owner.** :meth:`MetaStore.campaign` returns an :class:`OwnerTerm` once
  this session owns the cluster. Every write of the coordinator carries the
  term and is refused with :class:`NotOwnerError` when the term is no longer
  current — two captures can never both win a write.
* **Optimistic concurrency.** A changefeed record is replaced only when the
  stored ``version`` is the one the writer read (``info.version - 1``);
  otherwise :class:`MetaStoreConflictError`.
* **Monotonic checkpoints.** :meth:`MetaStore.update_checkpoints` never moves
  a stored checkpoint or resolved ts backwards.
* **Unavailability** is retried with backoff; when retries are exhausted the
  call raises :class:`~cdcflow.core.errors.MetaStoreIOError` (3002) and no
  record is half-written.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo, ChangeFeedStatus
from cdcflow.core.errors import MetaStoreIOError, Retryable

__all__ = [
    "POLL_INTERVAL",
    "MetaStore",
    "MetaStoreConflictError",
    "NotOwnerError",
    "OwnerTerm",
    "Session",
]

#: Seconds between two looks of a polling watcher or campaigner at the metastore.
POLL_INTERVAL = 0.2


class MetaStoreConflictError(MetaStoreIOError):
    """Someone else changed the record since it was read: read again and recompute."""

    default_retryable = Retryable.NONE


class NotOwnerError(MetaStoreIOError):
    """The writer's owner term is no longer current: it must stop acting as owner."""

    default_retryable = Retryable.NONE


@dataclass(frozen=True, slots=True)
class OwnerTerm:
    """Proof of ownership: the owner capture and a term that grows with each election."""

    capture_id: str
    term: int


class Session(abc.ABC):
    """A capture's liveness in the metastore (an etcd lease, a SQLite row with a TTL)."""

    def __init__(self, capture: CaptureInfo, ttl: float) -> None:
        self.capture = capture
        self.ttl = ttl
        #: Set once the session is known to be gone; the capture must then stop
        #: everything it runs and join again with a new session (seed 001).
        self.lost = asyncio.Event()

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session: the capture's registration (and ownership) go at once."""


class MetaStore(abc.ABC):
    """The control plane's store. Coroutines run on the capture's event loop."""

    url: str

    # -- sessions, captures and the owner ------------------------------------------

    @abc.abstractmethod
    async def open_session(self, capture: CaptureInfo, ttl: float) -> Session:
        """Register ``capture`` under a new session kept alive in the background."""

    @abc.abstractmethod
    async def list_captures(self) -> list[CaptureInfo]:
        """The captures whose sessions are alive, by id."""

    @abc.abstractmethod
    def watch_captures(self) -> AsyncIterator[list[CaptureInfo]]:
        """The live captures now, then again after every change."""

    @abc.abstractmethod
    async def campaign(self, session: Session) -> OwnerTerm:
        """Wait until ``session`` owns the cluster; the term proves it in writes."""

    @abc.abstractmethod
    async def get_owner(self) -> OwnerTerm | None:
        """The current owner, if any."""

    @abc.abstractmethod
    async def resign(self, term: OwnerTerm) -> None:
        """Give up ownership (no-op when ``term`` is not current any more)."""

    # -- changefeeds -------------------------------------------------------------------

    @abc.abstractmethod
    async def create_changefeed(self, info: ChangeFeedInfo, status: ChangeFeedStatus, term: OwnerTerm) -> None:
        """Store a new changefeed; DuplicateChangefeedIDError when the id exists."""

    @abc.abstractmethod
    async def get_changefeed(self, changefeed_id: str) -> tuple[ChangeFeedInfo, ChangeFeedStatus] | None:
        """A changefeed and its progress, or None."""

    @abc.abstractmethod
    async def list_changefeeds(self) -> list[tuple[ChangeFeedInfo, ChangeFeedStatus]]:
        """Every changefeed, by id."""

    @abc.abstractmethod
    async def update_changefeed(self, info: ChangeFeedInfo, term: OwnerTerm) -> None:
        """Replace the record if its stored version is ``info.version - 1``."""

    @abc.abstractmethod
    async def delete_changefeed(self, changefeed_id: str, term: OwnerTerm) -> None:
        """Delete the changefeed, its progress and its snapshot record (idempotent)."""

    @abc.abstractmethod
    async def update_checkpoints(self, statuses: Mapping[str, ChangeFeedStatus], term: OwnerTerm) -> dict[str, int]:
        """Move each changefeed's progress forward (never back) in one batch.

        Returns the stored checkpoint of each changefeed written; ids that no
        longer exist are skipped.
        """

    @abc.abstractmethod
    async def save_snapshot_record(self, changefeed_id: str, record: Mapping[str, Any], term: OwnerTerm) -> None:
        """Store the changefeed's initial-snapshot record (the ranges its cluster delivered:
        :class:`~cdcflow.core.data.snapshot_ranges.SnapshotRecord` as JSON), replacing the
        last; skipped when the changefeed no longer exists."""

    @abc.abstractmethod
    async def list_snapshot_records(self) -> dict[str, dict[str, Any]]:
        """Every changefeed's initial-snapshot record, by changefeed id."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
