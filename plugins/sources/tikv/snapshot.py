"""Consistent reads of key ranges at a version: TiKV's transactional scan, as TiKV clients do it.

:class:`SnapshotReader` reads ``[start, end)`` (raw TiDB keys) as of version
``T`` region by region with ``tikvpb.Tikv/KvScan`` (``kvrpcpb.ScanRequest``
with ``version`` = T), in pages of ``page_size`` keys:

* **Regions** come from PD's region cache (:class:`~.pd.PDClient`). A region
  error re-locates the rest of the range and retries it: ``NotLeader`` with a
  leader moves the request to that store at once; without one, and
  ``EpochNotMatch`` (a split or merge), ``RegionNotFound``, ``KeyNotInRegion``
  and ``StoreNotMatch`` drop the cached region and ask PD again;
  ``ServerIsBusy`` and an unreachable store back off. A store answers for its
  region only: the reader goes on from the region's end key.
* **Locks** (Percolator's read protocol): a key locked by a transaction whose
  start ts is at or below T may yet commit at or below T, so its value at T
  is unknown. The reader yields the keys before the first lock, then for each
  locked transaction asks its primary key's region ``KvCheckTxnStatus``:
  committed → ``KvResolveLock`` with the commit ts; rolled back (or rolled
  back now because its TTL expired) → ``KvResolveLock`` without one; still
  alive → back off (at most until its TTL runs out, when the check rolls it
  back). Then it reads again from the first locked key.

Every page yielded is exact at T. Without progress (no page read) for
``retry_timeout`` seconds the read fails with :class:`SnapshotUnavailableError`
(3001, retryable); a key error other than a lock is fatal.

Not modelled: async-commit and pessimistic locks, pushing a lock's
min-commit-ts instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from cdcflow.core.errors import CdcflowError, PDUnavailableError
from cdcflow.plugins.sources.tikv.channels import TLSFiles, open_channel
from cdcflow.plugins.sources.tikv.kvproto import errorpb_pb2, kvrpcpb_pb2, metapb_pb2, tikvpb_pb2_grpc
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.regions import RegionInfo, region_key
from cdcflow.plugins.sources.tikv.tidb.keys import decode_bytes

__all__ = ["DEFAULT_PAGE_SIZE", "SnapshotReader", "SnapshotStats", "SnapshotUnavailableError", "region_ranges"]

log = logging.getLogger(__name__)

#: Keys per KvScan (TiDB's default scan batch is 256; larger pages cost fewer round trips).
DEFAULT_PAGE_SIZE = 2048
_FIRST_BACKOFF = 0.01
_MAX_BACKOFF = 1.0


class SnapshotUnavailableError(PDUnavailableError):
    """A snapshot read made no progress for its retry timeout (stores or PD unreachable,
    regions moving, a lock that does not go away). Retryable."""


@dataclass
class SnapshotStats:
    """What a reader did (all reads since it was made)."""

    pages: int = 0
    pairs: int = 0
    region_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    locks_met: int = 0
    resolved_commit: int = 0
    resolved_rollback: int = 0
    lock_waits: int = 0


def _region_error_name(error: errorpb_pb2.Error) -> str:
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


def _raw_end(region: RegionInfo) -> bytes | None:
    """The raw key at which ``region`` ends (None: it ends at +infinity)."""
    if not region.end:
        return None
    return decode_bytes(region.end)[0]


async def region_ranges(pd: PDClient, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
    """``[start, end)`` (raw keys) cut at PD's current region boundaries: one range per region."""
    regions = await pd.scan_regions(region_key(start, encoded=True), region_key(end, encoded=True))
    cuts = [start]
    for region in regions[1:]:
        raw = decode_bytes(region.start)[0]
        if cuts[-1] < raw and (not end or raw < end):
            cuts.append(raw)
    return [(lo, hi) for lo, hi in zip(cuts, [*cuts[1:], end], strict=True)]


class _Retry(Exception):
    """Read the current position again (after a region error or resolved locks)."""


class SnapshotReader:
    """Reads key ranges at a version through ``tikvpb.Tikv`` (see the module docstring)."""

    def __init__(
        self,
        pd: PDClient,
        *,
        tls: TLSFiles | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        retry_timeout: float = 60.0,
        rpc_timeout: float = 30.0,
        keys_only: bool = False,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        self.pd = pd
        self._tls = tls
        self.page_size = page_size
        self.retry_timeout = retry_timeout
        self.rpc_timeout = rpc_timeout
        #: Sampling: keys only (values empty), a locked key counted as a key without
        #: resolving its lock — where to cut ranges needs no exact read.
        self.keys_only = keys_only
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.stats = SnapshotStats()

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

    async def read(self, start: bytes, end: bytes, version: int) -> list[tuple[bytes, bytes]]:
        """Every (key, value) of ``[start, end)`` at ``version``, in key order."""
        out: list[tuple[bytes, bytes]] = []
        async for page in self.scan(start, end, version):
            out.extend(page)
        return out

    async def scan(self, start: bytes, end: bytes, version: int) -> AsyncIterator[list[tuple[bytes, bytes]]]:
        """Pages of (key, value) of ``[start, end)`` at ``version``, in key order (raw keys;
        an empty ``end`` is +infinity)."""
        key = start
        backoff = _FIRST_BACKOFF
        progress = time.monotonic()
        while not end or key < end:
            try:
                page, next_key = await self._scan_once(key, end, version)
            except _Retry as retry:
                if time.monotonic() - progress > self.retry_timeout:
                    raise SnapshotUnavailableError(
                        f"reading keys from {key.hex()} at {version} made no progress for "
                        f"{self.retry_timeout:.0f}s (last: {retry}); check the TiKV stores and PD",
                        detail={"key": key.hex(), "version": version, "last_error": str(retry)},
                    ) from None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            backoff = _FIRST_BACKOFF
            progress = time.monotonic()
            if page:
                self.stats.pages += 1
                self.stats.pairs += len(page)
                yield page
            if next_key is None:
                return
            key = next_key

    async def _scan_once(self, key: bytes, end: bytes, version: int) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
        """One KvScan from ``key``: the pairs read and where to go on (None: done).
        Raises _Retry to read from ``key`` again."""
        region = await self._locate(key)
        request = kvrpcpb_pb2.ScanRequest(
            context=self._context(region),
            start_key=key,
            end_key=end,
            limit=self.page_size,
            version=version,
            key_only=self.keys_only,
        )
        response = await self._call(region, "KvScan", request)
        if response.HasField("region_error"):
            self._on_region_error(region, response.region_error)
        pairs: list[tuple[bytes, bytes]] = []
        locks: list[kvrpcpb_pb2.LockInfo] = []
        if self.keys_only:
            pairs = [(pair.key, b"") for pair in response.pairs]
        for pair in [] if self.keys_only else response.pairs:
            if pair.HasField("error"):
                locks.append(self._lock_of(pair.error, pair.key))
            elif not locks:
                pairs.append((pair.key, pair.value))
        if response.HasField("error") and not self.keys_only:
            locks.append(self._lock_of(response.error, key))
        if locks:
            # The pairs before the first lock are exact; the rest is read again once resolved.
            self.stats.locks_met += len(locks)
            resolved = await self._resolve(locks, version)
            if pairs:
                return pairs, locks[0].key
            if not resolved:
                raise _Retry(f"waiting for the lock of transaction {locks[0].lock_version} on {locks[0].key.hex()}")
            return [], key
        if len(response.pairs) >= self.page_size:
            return pairs, response.pairs[-1].key + b"\x00"
        region_end = _raw_end(region)
        if region_end is None or (end and region_end >= end):
            return pairs, None
        return pairs, region_end

    @staticmethod
    def _lock_of(error: kvrpcpb_pb2.KeyError, key: bytes) -> kvrpcpb_pb2.LockInfo:
        if not error.HasField("locked"):
            raise CdcflowError(
                f"TiKV refused to read key {key.hex()}: {error.abort or error.retryable or error}",
                detail={"key": key.hex(), "abort": error.abort, "retryable": error.retryable},
            )
        return error.locked

    # -- locks -------------------------------------------------------------------------------

    async def _resolve(self, locks: Sequence[kvrpcpb_pb2.LockInfo], version: int) -> bool:
        """Resolve the transactions of ``locks`` that are decided; False if one is still alive."""
        by_txn: dict[int, list[kvrpcpb_pb2.LockInfo]] = defaultdict(list)
        for lock in locks:
            by_txn[lock.lock_version].append(lock)
        all_resolved = True
        for start_ts, txn_locks in by_txn.items():
            status = await self._check_txn_status(txn_locks[0], version)
            if status.lock_ttl > 0:
                self.stats.lock_waits += 1
                all_resolved = False
                continue
            await self._resolve_keys(start_ts, status.commit_version, [lk.key for lk in txn_locks])
            if status.commit_version:
                self.stats.resolved_commit += len(txn_locks)
            else:
                self.stats.resolved_rollback += len(txn_locks)
        return all_resolved

    async def _check_txn_status(self, lock: kvrpcpb_pb2.LockInfo, version: int) -> kvrpcpb_pb2.CheckTxnStatusResponse:
        while True:
            region = await self._locate(lock.primary_lock)
            request = kvrpcpb_pb2.CheckTxnStatusRequest(
                context=self._context(region),
                primary_key=lock.primary_lock,
                lock_ts=lock.lock_version,
                caller_start_ts=version,
                current_ts=await self.pd.tso(),
                rollback_if_not_exist=True,
            )
            response = await self._call(region, "KvCheckTxnStatus", request)
            if response.HasField("region_error"):
                try:
                    self._on_region_error(region, response.region_error)
                except _Retry:
                    await asyncio.sleep(_FIRST_BACKOFF)
                    continue
            if response.HasField("error"):
                raise CdcflowError(
                    f"TiKV could not check transaction {lock.lock_version}: {response.error}",
                    detail={"start_ts": lock.lock_version, "primary": lock.primary_lock.hex()},
                )
            result: kvrpcpb_pb2.CheckTxnStatusResponse = response
            return result

    async def _resolve_keys(self, start_ts: int, commit_ts: int, keys: Sequence[bytes]) -> None:
        """ResolveLock for ``keys`` of transaction ``start_ts``, region by region."""
        pending = sorted(set(keys))
        while pending:
            region = await self._locate(pending[0])
            encoded = [(k, region_key(k, encoded=True)) for k in pending]
            here = [k for k, enc in encoded if region.contains(enc)]
            request = kvrpcpb_pb2.ResolveLockRequest(
                context=self._context(region), start_version=start_ts, commit_version=commit_ts, keys=here
            )
            response = await self._call(region, "KvResolveLock", request)
            if response.HasField("region_error"):
                try:
                    self._on_region_error(region, response.region_error)
                except _Retry:
                    await asyncio.sleep(_FIRST_BACKOFF)
                    continue
            if response.HasField("error"):
                raise CdcflowError(
                    f"TiKV could not resolve the locks of transaction {start_ts}: {response.error}",
                    detail={"start_ts": start_ts, "commit_ts": commit_ts},
                )
            done = set(here)
            pending = [k for k in pending if k not in done]

    # -- regions and stores ------------------------------------------------------------------

    async def _locate(self, key: bytes) -> RegionInfo:
        enc = region_key(key, encoded=True)
        region = self.pd.regions.locate(enc)
        if region is None:
            region = await self.pd.get_region(enc)
        if region is None:
            raise _Retry(f"PD knows no region for key {key.hex()}")
        return region

    @staticmethod
    def _context(region: RegionInfo) -> kvrpcpb_pb2.Context:
        store = region.leader_store_id
        return kvrpcpb_pb2.Context(
            region_id=region.id,
            region_epoch=metapb_pb2.RegionEpoch(conf_ver=region.conf_ver, version=region.version),
            peer=metapb_pb2.Peer(id=region.peer_on(store), store_id=store),
        )

    def _on_region_error(self, region: RegionInfo, error: errorpb_pb2.Error) -> None:
        """Update the region cache for ``error``; always raises _Retry."""
        name = _region_error_name(error)
        self.stats.region_errors[name] += 1
        if name == "not_leader" and error.not_leader.leader.store_id:
            self.pd.regions.update_leader(region.id, error.not_leader.leader.store_id)
        elif name != "server_is_busy":
            self.pd.regions.invalidate(region.id)
        log.debug("region %d: %s; retrying", region.id, name)
        raise _Retry(f"region {region.id}: {name}")

    async def _call(self, region: RegionInfo, method: str, request: object) -> Any:
        try:
            address = await self.pd.store_address(region.leader_store_id)
        except CdcflowError as exc:
            self.pd.regions.invalidate(region.id)
            raise _Retry(str(exc)) from None
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
                raise _Retry(f"store {address}: {exc.code().name}") from None
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
