"""Percolator lock resolution against TiKV's ``tikvpb.Tikv`` service, shared by every reader.

:class:`LockResolver` calls a key's region leader (PD's region cache,
:class:`~.pd.PDClient`), handles region errors by updating the cache and
raising :class:`RetryError`, and decides the fate of locks as TiKV clients do:
for each locked transaction, ``KvCheckTxnStatus`` on its primary key —
committed → ``KvResolveLock`` with the commit ts; rolled back (or rolled back
now, because its TTL expired) → ``KvResolveLock`` without one; still alive →
left alone (its owner may yet commit it; the check rolls it back once its TTL
runs out).

Two users:

* the snapshot reader (:mod:`.snapshot`) resolves the locks a ``KvScan`` at
  its version meets, then reads again;
* the EventFeed client (:mod:`.eventfeed`) resolves the locks that hold a
  region's resolved ts back: :meth:`LockResolver.resolve_range` lists the
  locks of a key range below a ts with ``KvScanLock``, region by region, and
  resolves those of decided transactions (TiKV's resolved ts then moves past
  them).

Not modelled: async-commit and pessimistic locks, pushing a lock's
min-commit-ts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from cdcflow.core.errors import CdcflowError
from cdcflow.plugins.sources.tikv.channels import TLSFiles, open_channel
from cdcflow.plugins.sources.tikv.kvproto import errorpb_pb2, kvrpcpb_pb2, metapb_pb2, tikvpb_pb2_grpc
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.regions import RegionInfo, region_key
from cdcflow.plugins.sources.tikv.tidb.keys import decode_bytes

__all__ = ["LockResolver", "LockStats", "RangeResolution", "RetryError", "raw_end", "region_error_name"]

log = logging.getLogger(__name__)

_RELOCATE_DELAY = 0.01


class RetryError(Exception):
    """Do the request again (after a region error, an unreachable store, or a live lock)."""


@dataclass
class LockStats:
    """What a resolver did (since it was made)."""

    region_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    locks_met: int = 0
    resolved_commit: int = 0
    resolved_rollback: int = 0
    lock_waits: int = 0


@dataclass
class RangeResolution:
    """What one :meth:`LockResolver.resolve_range` pass found: locks listed, locks of live
    transactions left alone, and whether it stopped at its lock budget before the range's end."""

    locks: int = 0
    alive: int = 0
    truncated: bool = False


def region_error_name(error: errorpb_pb2.Error) -> str:
    for name in (
        "not_leader",
        "region_not_found",
        "key_not_in_region",
        "epoch_not_match",
        "server_is_busy",
        "stale_command",
        "store_not_match",
    ):
        if error.HasField(name):
            return name
    return "other"


def raw_end(region: RegionInfo) -> bytes | None:
    """The raw key at which ``region`` ends (None: it ends at +infinity)."""
    if not region.end:
        return None
    return decode_bytes(region.end)[0]


class LockResolver:
    """Region-routed ``tikvpb.Tikv`` calls and Percolator lock resolution (see the module docstring)."""

    def __init__(
        self,
        pd: PDClient,
        *,
        tls: TLSFiles | None = None,
        rpc_timeout: float = 30.0,
        stats: LockStats | None = None,
    ) -> None:
        self.pd = pd
        self._tls = tls
        self.rpc_timeout = rpc_timeout
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.stats = stats if stats is not None else LockStats()

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

    # -- locks -------------------------------------------------------------------------------

    async def resolve(self, locks: Sequence[kvrpcpb_pb2.LockInfo], version: int) -> bool:
        """Resolve the transactions of ``locks`` that are decided; False if one is still alive."""
        by_txn: dict[int, list[kvrpcpb_pb2.LockInfo]] = defaultdict(list)
        for lock in locks:
            by_txn[lock.lock_version].append(lock)
        all_resolved = True
        for start_ts, txn_locks in by_txn.items():
            status = await self.check_txn_status(txn_locks[0], version)
            if status.lock_ttl > 0:
                self.stats.lock_waits += 1
                all_resolved = False
                continue
            await self.resolve_keys(start_ts, status.commit_version, [lk.key for lk in txn_locks])
            if status.commit_version:
                self.stats.resolved_commit += len(txn_locks)
            else:
                self.stats.resolved_rollback += len(txn_locks)
        return all_resolved

    async def check_txn_status(self, lock: kvrpcpb_pb2.LockInfo, version: int) -> kvrpcpb_pb2.CheckTxnStatusResponse:
        """The status of the transaction of ``lock`` (asked of its primary key's region)."""
        while True:
            region = await self.locate(lock.primary_lock)
            request = kvrpcpb_pb2.CheckTxnStatusRequest(
                context=self.context(region),
                primary_key=lock.primary_lock,
                lock_ts=lock.lock_version,
                caller_start_ts=version,
                current_ts=await self.pd.tso(),
                rollback_if_not_exist=True,
            )
            response = await self._answer(
                region,
                "KvCheckTxnStatus",
                request,
                f"check transaction {lock.lock_version}",
                {"start_ts": lock.lock_version, "primary": lock.primary_lock.hex()},
            )
            if response is None:
                await asyncio.sleep(_RELOCATE_DELAY)
                continue
            result: kvrpcpb_pb2.CheckTxnStatusResponse = response
            return result

    async def resolve_keys(self, start_ts: int, commit_ts: int, keys: Sequence[bytes]) -> None:
        """ResolveLock for ``keys`` of transaction ``start_ts``, region by region."""
        pending = sorted(set(keys))
        while pending:
            region = await self.locate(pending[0])
            encoded = [(k, region_key(k, encoded=True)) for k in pending]
            here = [k for k, enc in encoded if region.contains(enc)]
            request = kvrpcpb_pb2.ResolveLockRequest(
                context=self.context(region), start_version=start_ts, commit_version=commit_ts, keys=here
            )
            response = await self._answer(
                region,
                "KvResolveLock",
                request,
                f"resolve the locks of transaction {start_ts}",
                {"start_ts": start_ts, "commit_ts": commit_ts},
            )
            if response is None:
                await asyncio.sleep(_RELOCATE_DELAY)
                continue
            done = set(here)
            pending = [k for k in pending if k not in done]

    async def _answer(self, region: RegionInfo, method: str, request: object, what: str, detail: dict[str, Any]) -> Any:
        """``method``'s answer to ``request`` from ``region``'s leader; None after a region
        error the cache was updated for (locate again and retry); a key error raises
        CdcflowError saying TiKV could not do ``what``."""
        response = await self.call(region, method, request)
        if response.HasField("region_error"):
            try:
                self.on_region_error(region, response.region_error)
            except RetryError:
                return None
        if response.HasField("error"):
            raise CdcflowError(f"TiKV could not {what}: {response.error}", detail=detail)
        return response

    async def scan_locks(
        self, start: bytes, end: bytes, max_version: int, limit: int
    ) -> tuple[list[kvrpcpb_pb2.LockInfo], bytes | None]:
        """One ``KvScanLock`` from raw key ``start``: the locks (start ts at or below
        ``max_version``, at most ``limit``) of the region holding it, and where to go on
        (None: ``end`` reached; an empty ``end`` is +infinity). Raises RetryError on a
        region error (the cache is updated)."""
        region = await self.locate(start)
        request = kvrpcpb_pb2.ScanLockRequest(
            context=self.context(region), max_version=max_version, start_key=start, end_key=end, limit=limit
        )
        response = await self.call(region, "KvScanLock", request)
        if response.HasField("region_error"):
            self.on_region_error(region, response.region_error)
        if response.HasField("error"):
            raise CdcflowError(
                f"TiKV could not list the locks from key {start.hex()}: {response.error}",
                detail={"key": start.hex(), "max_version": max_version},
            )
        locks = list(response.locks)
        if limit and len(locks) >= limit:
            return locks, locks[-1].key + b"\x00"
        region_end = raw_end(region)
        if region_end is None or (end and region_end >= end):
            return locks, None
        return locks, region_end

    async def resolve_range(
        self, start: bytes, end: bytes, max_version: int, *, page: int = 256, budget: int = 1024
    ) -> RangeResolution:
        """List the locks of raw range ``[start, end)`` with start ts at or below
        ``max_version`` and resolve those of decided transactions; live ones are left
        alone. At most ``budget`` locks per call (``truncated`` then says so: call again).
        Region errors re-locate the rest of the range (RetryError after a few in a row)."""
        result = RangeResolution()
        key: bytes | None = start
        relocations = 0
        while key is not None and (not end or key < end):
            if result.locks >= budget:
                result.truncated = True
                break
            try:
                locks, next_key = await self.scan_locks(key, end, max_version, min(page, budget - result.locks))
            except RetryError:
                relocations += 1
                if relocations > 3:
                    raise
                await asyncio.sleep(_RELOCATE_DELAY * 2**relocations)
                continue
            relocations = 0
            result.locks += len(locks)
            self.stats.locks_met += len(locks)
            if locks:
                alive_before = self.stats.lock_waits
                await self.resolve(locks, max_version)
                result.alive += self.stats.lock_waits - alive_before
            key = next_key
        return result

    # -- regions and stores ------------------------------------------------------------------

    async def locate(self, key: bytes) -> RegionInfo:
        """The region (from PD's cache, else PD) holding raw key ``key``."""
        enc = region_key(key, encoded=True)
        region = self.pd.regions.locate(enc)
        if region is None:
            region = await self.pd.get_region(enc)
        if region is None:
            raise RetryError(f"PD knows no region for key {key.hex()}")
        return region

    @staticmethod
    def context(region: RegionInfo) -> kvrpcpb_pb2.Context:
        store = region.leader_store_id
        return kvrpcpb_pb2.Context(
            region_id=region.id,
            region_epoch=metapb_pb2.RegionEpoch(conf_ver=region.conf_ver, version=region.version),
            peer=metapb_pb2.Peer(id=region.peer_on(store), store_id=store),
        )

    def on_region_error(self, region: RegionInfo, error: errorpb_pb2.Error) -> None:
        """Update the region cache for ``error``; always raises RetryError."""
        name = region_error_name(error)
        self.stats.region_errors[name] += 1
        if name == "not_leader" and error.not_leader.leader.store_id:
            self.pd.regions.update_leader(region.id, error.not_leader.leader.store_id)
        elif name != "server_is_busy":
            self.pd.regions.invalidate(region.id)
        log.debug("region %d: %s; retrying", region.id, name)
        raise RetryError(f"region {region.id}: {name}")

    async def call(self, region: RegionInfo, method: str, request: object) -> Any:
        """``method`` of ``tikvpb.Tikv`` on the leader of ``region`` (RetryError when unreachable)."""
        try:
            address = await self.pd.store_address(region.leader_store_id)
        except CdcflowError as exc:
            self.pd.regions.invalidate(region.id)
            raise RetryError(str(exc)) from None
        stub = tikvpb_pb2_grpc.TikvStub(self._channel(address))
        try:
            return await getattr(stub, method)(request, timeout=self.rpc_timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                # The store is down or moved: ask PD for the region and the store's address again.
                self.pd.regions.invalidate(region.id)
                await self._drop_channel(address)
                with contextlib.suppress(CdcflowError):
                    await self.pd.store_address(region.leader_store_id, refresh=True)
                raise RetryError(f"store {address}: {exc.code().name}") from None
            raise CdcflowError(
                f"TiKV store {address} failed {method}: {exc.code().name} {exc.details()}",
                detail={"store": address, "method": method},
            ) from None

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._tls)
        return channel

    async def _drop_channel(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            await channel.close()
