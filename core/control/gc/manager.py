"""The GC safepoint machinery of the coordinator (seed 000 "GC safepoint/屏障管理").

Per upstream cluster (as the upstream identifies itself, not as an address is
spelled), the service safepoint is the minimum checkpoint over the
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
from cdcflow.core.errors import CdcflowError, CheckpointStaleError, ConfigInvalidError, ConfigIssue

__all__ = ["DEFAULT_GC_TICK", "GCManager", "KeeperResolver", "needs_protection", "overwrite_checkpoint_ts"]

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


#: A TSO is an unsigned 64-bit number.
_MAX_TSO = 2**64 - 1
_OVERWRITE = "overwrite_checkpoint_ts"


def _refuse_overwrite(changefeed_id: str, value: object, why: str) -> ConfigInvalidError:
    message = f"changefeed {changefeed_id}: {_OVERWRITE} {value!r} {why}; nothing was changed"
    return ConfigInvalidError(
        message,
        [ConfigIssue(why, path=_OVERWRITE)],
        detail={"changefeed_id": changefeed_id, _OVERWRITE: value if isinstance(value, int) else repr(value)},
    )


def overwrite_checkpoint_ts(changefeed_id: str, value: object) -> int:
    """``value`` as a checkpoint to resume from: an integer TSO in ``[1, 2**64)``, else ConfigInvalidError (1001).

    Whether the upstream still has its history and has reached it is
    :meth:`GCManager.check_resume_ts`'s to say.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse_overwrite(changefeed_id, value, "must be an integer TSO")
    if not 0 < value <= _MAX_TSO:
        raise _refuse_overwrite(changefeed_id, value, f"is out of the TSO range [1, {_MAX_TSO}]")
    return value


@dataclass
class _Upstream:
    """One cluster: the keeper that sets its safepoint and whether one is set."""

    keeper: GCSafepointKeeper
    has_safepoint: bool = False


class GCManager:
    """Keeps one service safepoint per upstream cluster.

    The resolver names each changefeed's upstream by its source configuration;
    configurations that differ only in spelling (``127.0.0.1:P`` and
    ``localhost:P``) reach the same cluster, and they must share one service
    safepoint: upstreams keep one value per service id, so two values written
    under one id overwrite each other and the last one wins, even when it is
    above another changefeed's checkpoint. The manager therefore asks each
    keeper which cluster it reaches (:meth:`GCSafepointKeeper.upstream_id
    <cdcflow.core.control.gc.keeper.GCSafepointKeeper.upstream_id>`, TiKV:
    PD's cluster id), groups the changefeeds by that, and sets each cluster's
    safepoint once, at the minimum over all of its changefeeds.
    """

    def __init__(self, service_id: str, resolver: KeeperResolver, *, gc_ttl: float = DEFAULT_GC_TTL) -> None:
        self.service_id = service_id
        self.gc_ttl = gc_ttl
        self._resolver = resolver
        #: Keeper per configuration key (one per spelling; closed on close()).
        self._keepers: dict[str, GCSafepointKeeper] = {}
        #: Cluster identity per configuration key, once the upstream told it.
        self._identity: dict[str, str] = {}
        self._upstreams: dict[str, _Upstream] = {}
        #: The last safepoint set per upstream cluster (for status and tests).
        self.safepoints: dict[str, int] = {}

    def keeper(self, info: ChangeFeedInfo) -> GCSafepointKeeper | None:
        """The keeper of ``info``'s upstream (None: its upstream keeps no history)."""
        resolved = self._resolver(info)
        if resolved is None:
            return None
        key, keeper = resolved
        return self._keepers.setdefault(key, keeper)

    async def check_resume_ts(self, info: ChangeFeedInfo, ts: int) -> None:
        """Refuse (ConfigInvalidError, 1001) a checkpoint to resume ``info`` from that its
        upstream cannot serve: below the upstream's GC safepoint (the history since is
        gone) or above its current timestamp (a checkpoint in the future would lift the
        service safepoint past every other changefeed). Upstreams that keep no history
        or do not tell these values pass. Raises a retryable CdcflowError when the
        upstream cannot be reached."""
        keeper = self.keeper(info)
        if keeper is None:
            return
        safepoint = await keeper.gc_safepoint()
        if safepoint is not None and ts < safepoint:
            raise _refuse_overwrite(
                info.id, ts, f"is below the upstream's GC safepoint {safepoint} (its history is gone)"
            )
        current = await keeper.current_ts()
        if current is not None and ts > current:
            raise _refuse_overwrite(info.id, ts, f"is above the upstream's current timestamp {current}")

    async def _cluster_of(self, key: str) -> str | None:
        """The cluster identity of configuration ``key``; None while its upstream cannot say."""
        if key in self._identity:
            return self._identity[key]
        keeper = self._keepers[key]
        try:
            identity = await keeper.upstream_id()
        except CdcflowError as exc:
            log.warning("upstream of %s cannot tell its cluster id (asked again next tick): %s", key, exc)
            return None
        self._identity[key] = identity if identity is not None else f"config:{key}"
        return self._identity[key]

    async def update(
        self, changefeeds: Iterable[tuple[ChangeFeedInfo, ChangeFeedStatus]], now: float
    ) -> dict[str, CheckpointStaleError]:
        """Set or remove the safepoint of every upstream cluster; return stale changefeeds by id."""
        minimum: dict[str, int] = {}
        members: dict[str, list[tuple[ChangeFeedInfo, ChangeFeedStatus]]] = {}
        unknown = False  # a protected changefeed whose cluster is not known yet
        for info, status in changefeeds:
            resolved = self._resolver(info)
            if resolved is None:
                continue
            key, keeper = resolved
            keeper = self._keepers.setdefault(key, keeper)
            cluster = await self._cluster_of(key)
            if cluster is None:
                unknown = unknown or needs_protection(info, now, self.gc_ttl)
                continue
            self._upstreams.setdefault(cluster, _Upstream(keeper))
            if needs_protection(info, now, self.gc_ttl):
                minimum[cluster] = min(minimum.get(cluster, status.checkpoint_ts), status.checkpoint_ts)
                members.setdefault(cluster, []).append((info, status))
        stale: dict[str, CheckpointStaleError] = {}
        for cluster, upstream in self._upstreams.items():
            try:
                if cluster in minimum:
                    value = minimum[cluster]
                    if unknown and cluster in self.safepoints:
                        # A changefeed whose cluster cannot be told may belong to this one:
                        # hold the safepoint where it is rather than lift it past that checkpoint.
                        value = min(value, self.safepoints[cluster])
                    floor = await upstream.keeper.update_service_gc_safepoint(self.service_id, int(self.gc_ttl), value)
                    upstream.has_safepoint = True
                    self.safepoints[cluster] = value
                    stale.update(self._stale(members[cluster], floor))
                elif upstream.has_safepoint and not unknown:
                    await upstream.keeper.remove_service_gc_safepoint(self.service_id)
                    upstream.has_safepoint = False
                    self.safepoints.pop(cluster, None)
            except CdcflowError as exc:
                log.warning("GC safepoint of upstream %s not updated (retried next tick): %s", cluster, exc)
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
        for keeper in self._keepers.values():
            await keeper.close()
