"""The GC safepoint machinery of the coordinator (seed 000 "GC safepoint/屏障管理").

Per upstream, the service safepoint is the minimum checkpoint over the
changefeeds that still need protection: Normal, Paused and Warning ones, and
Failed ones only for ``gc_ttl`` after they failed (so a forgotten failed
changefeed cannot pin GC forever). Finished changefeeds need none. When no
changefeed of an upstream needs protection, cdcflow's safepoint is removed.

The coordinator calls :meth:`GCManager.update` on a ticker (default one
minute) and at once when a changefeed is created or resumed. Changefeeds
whose checkpoint is below what the upstream already collected come back as
:class:`~cdcflow.core.errors.CheckpointStaleError` (5001).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cdcflow.core.config.settings import DEFAULT_GC_TTL
from cdcflow.core.control.changefeed import ChangeFeedInfo, ChangefeedState, ChangeFeedStatus
from cdcflow.core.control.gc.keeper import GCSafepointKeeper
from cdcflow.core.errors import CdcflowError, CheckpointStaleError

__all__ = ["DEFAULT_GC_TICK", "GCManager", "KeeperResolver", "needs_protection"]

log = logging.getLogger(__name__)

#: Seconds between two updates of the service safepoints.
DEFAULT_GC_TICK = 60.0

#: Maps a changefeed to (upstream key, keeper); None when its upstream keeps no history.
KeeperResolver = Callable[[ChangeFeedInfo], tuple[str, GCSafepointKeeper] | None]


def needs_protection(info: ChangeFeedInfo, now: float, gc_ttl: float) -> bool:
    """Whether the changefeed's checkpoint must be kept from upstream GC."""
    if info.state in (ChangefeedState.NORMAL, ChangefeedState.PAUSED, ChangefeedState.WARNING):
        return True
    return info.state is ChangefeedState.FAILED and now - info.state_changed_at < gc_ttl


@dataclass
class _Upstream:
    keeper: GCSafepointKeeper
    has_safepoint: bool = False


class GCManager:
    """Keeps one service safepoint per upstream."""

    def __init__(self, service_id: str, resolver: KeeperResolver, *, gc_ttl: float = DEFAULT_GC_TTL) -> None:
        self.service_id = service_id
        self.gc_ttl = gc_ttl
        self._resolver = resolver
        self._upstreams: dict[str, _Upstream] = {}
        #: The last safepoint set per upstream (for status and tests).
        self.safepoints: dict[str, int] = {}

    async def update(
        self, changefeeds: Iterable[tuple[ChangeFeedInfo, ChangeFeedStatus]], now: float
    ) -> dict[str, CheckpointStaleError]:
        """Set or remove the safepoint of every upstream; return stale changefeeds by id."""
        minimum: dict[str, int] = {}
        members: dict[str, list[tuple[ChangeFeedInfo, ChangeFeedStatus]]] = {}
        for info, status in changefeeds:
            resolved = self._resolver(info)
            if resolved is None:
                continue
            key, keeper = resolved
            self._upstreams.setdefault(key, _Upstream(keeper))
            if needs_protection(info, now, self.gc_ttl):
                minimum[key] = min(minimum.get(key, status.checkpoint_ts), status.checkpoint_ts)
                members.setdefault(key, []).append((info, status))
        stale: dict[str, CheckpointStaleError] = {}
        for key, upstream in self._upstreams.items():
            try:
                if key in minimum:
                    floor = await upstream.keeper.update_service_gc_safepoint(
                        self.service_id, int(self.gc_ttl), minimum[key]
                    )
                    upstream.has_safepoint = True
                    self.safepoints[key] = minimum[key]
                    stale.update(self._stale(members[key], floor))
                elif upstream.has_safepoint:
                    await upstream.keeper.remove_service_gc_safepoint(self.service_id)
                    upstream.has_safepoint = False
                    self.safepoints.pop(key, None)
            except CdcflowError as exc:
                log.warning("GC safepoint of upstream %s not updated (retried next tick): %s", key, exc)
        return stale

    @staticmethod
    def _stale(members: list[tuple[ChangeFeedInfo, ChangeFeedStatus]], floor: int) -> dict[str, CheckpointStaleError]:
        out: dict[str, CheckpointStaleError] = {}
        for info, status in members:
            if status.checkpoint_ts < floor and info.state is not ChangefeedState.FAILED:
                out[info.id] = CheckpointStaleError(
                    f"changefeed {info.id}: checkpoint {status.checkpoint_ts} is below the upstream GC safepoint "
                    f"{floor}; the changes in between are gone. Remove the changefeed and create it again "
                    "from a newer start-ts",
                    detail={"changefeed_id": info.id, "checkpoint_ts": status.checkpoint_ts, "gc_safepoint": floor},
                )
        return out

    async def close(self) -> None:
        for upstream in self._upstreams.values():
            await upstream.keeper.close()
