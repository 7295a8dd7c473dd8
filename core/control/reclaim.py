"""The capture's sweep of its data directory: files of changefeeds that no longer exist go.

A changefeed's spans leave a directory on every capture that ran them
(``<data-dir>/changefeeds/<id>/``: event store, Spark checkpoint, snapshot
parts; :mod:`cdcflow.core.data.pipeline.files`). Pausing a changefeed or
moving its maintainer must keep them (the next executor resumes from them);
removing it must not keep them forever. Every capture therefore sweeps its
data directory when it joins the cluster and then every
``server.reclaim-interval`` (:class:`ChangefeedFilesSweeper`):

1. it scans the directory first (in a thread),
2. then lists the changefeeds in the metastore; when that fails the sweep
   deletes nothing and the next one tries again;
3. a directory found by the scan is reclaimed when its changefeed is absent
   from the listing, or when it holds the files of an older changefeed of the
   same id (its owner file records an earlier creation time than the stored
   changefeed's) — and in both cases only when no executor of that id runs or
   is closing on this capture.

The order makes the sweep safe against a changefeed created meanwhile: a
changefeed is written to the metastore before any capture makes its
directory, so a directory the scan saw belongs to a changefeed the listing
shows, unless that changefeed was removed. A directory to reclaim is renamed
out of the way on the event loop right after the check that no executor of
its id runs here (executors are made on the event loop, so none can start in
between), then deleted in a thread: an executor made afterwards starts on a
new, empty directory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cdcflow.core.control.changefeed import ChangefeedState
from cdcflow.core.control.metastore.base import MetaStore
from cdcflow.core.data.pipeline.files import (
    ChangefeedDir,
    delete_detached,
    detach_changefeed_dir,
    recorded_created_at,
    scan_changefeed_dirs,
)
from cdcflow.core.metrics import CaptureMetrics

__all__ = ["ChangefeedFilesSweeper", "Reclaimed"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """A directory a sweep deleted."""

    changefeed_id: str
    path: Path
    bytes_freed: int
    #: "removed" (no such changefeed any more) or "replaced" (the files of an older one of the id).
    reason: str


class ChangefeedFilesSweeper:
    """Deletes the files of changefeeds that no longer exist from ``data_dir`` (module docs).

    ``busy`` names the changefeeds whose files must be left alone now: those
    with an executor running or closing on this capture
    (:meth:`~cdcflow.core.control.span_host.SpanHost.changefeeds_here`).
    """

    def __init__(
        self,
        store: MetaStore,
        data_dir: str | Path,
        busy: Callable[[], set[str]],
        metrics: CaptureMetrics | None = None,
    ) -> None:
        self.store = store
        self.data_dir = Path(data_dir)
        self.busy = busy
        self.metrics = metrics

    async def run(self, interval: float) -> None:
        """Sweep now, then every ``interval`` seconds, until cancelled. A sweep that fails
        is logged and the next one runs on time."""
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("the sweep of %s for removed changefeeds' files failed", self.data_dir)
            await asyncio.sleep(interval)

    async def sweep(self) -> list[Reclaimed]:
        """One sweep: what it deleted (see the module docs for what and in which order)."""
        found, leftovers = await asyncio.to_thread(scan_changefeed_dirs, self.data_dir)
        for path in leftovers:  # a sweep stopped while it deleted them: finish the job
            freed = await asyncio.to_thread(delete_detached, path)
            log.info("deleted %s, left by an earlier reclaim (%d bytes freed)", path, freed)
        if not found:
            return []
        try:
            records = await self.store.list_changefeeds()
        except Exception as exc:  # noqa: BLE001 - whatever the cause, nothing is deleted on it
            log.warning(
                "not reclaiming removed changefeeds' files in %s this time: cannot list the changefeeds (%s)",
                self.data_dir,
                exc,
            )
            return []
        stored = {info.id: info.created_at for info, _ in records if info.state is not ChangefeedState.REMOVED}
        reclaimed = []
        for directory in found:
            reason = _reason(directory, stored)
            if reason is None:
                continue
            if directory.changefeed_id in self.busy():
                log.debug("changefeed %s runs here: its files in %s stay", directory.changefeed_id, directory.path)
                continue
            if reason == "replaced" and recorded_created_at(directory.path) != directory.created_at:
                continue  # claimed since the scan by an executor of the stored changefeed (a small read)
            try:
                detached = detach_changefeed_dir(self.data_dir, directory.changefeed_id)
            except OSError as exc:
                log.warning("cannot reclaim %s (changefeed %s): %s", directory.path, directory.changefeed_id, exc)
                continue
            if detached is None:
                continue  # gone meanwhile
            freed = await asyncio.to_thread(delete_detached, detached)
            log.info(
                "reclaimed the files of %s changefeed %s: %s (%d bytes freed)",
                "removed" if reason == "removed" else "a replaced",
                directory.changefeed_id,
                directory.path,
                freed,
            )
            if self.metrics is not None:
                self.metrics.reclaimed(freed)
            reclaimed.append(Reclaimed(directory.changefeed_id, directory.path, freed, reason))
        return reclaimed


def _reason(directory: ChangefeedDir, stored: dict[str, float]) -> str | None:
    """Why ``directory`` is to be reclaimed, or None to keep it."""
    created_at = stored.get(directory.changefeed_id)
    if created_at is None:
        return "removed"
    if directory.created_at is not None and directory.created_at < created_at:
        return "replaced"
    return None
