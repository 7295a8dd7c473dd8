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
  back). Then it reads again from the first locked key. The region/store
  calls and the check-then-resolve steps are :class:`~.locks.LockResolver`'s,
  shared with the EventFeed client's resolution of lagging regions.

Every page yielded is exact at T. Without progress (no page read) for
``retry_timeout`` seconds the read fails with :class:`SnapshotUnavailableError`
(3001, retryable); a key error other than a lock is fatal.

Not modelled: async-commit and pessimistic locks, pushing a lock's
min-commit-ts instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from cdcflow.core.errors import CdcflowError, PDUnavailableError
from cdcflow.plugins.sources.tikv.channels import TLSFiles
from cdcflow.plugins.sources.tikv.kvproto import kvrpcpb_pb2
from cdcflow.plugins.sources.tikv.locks import LockResolver, LockStats, RetryError, raw_end
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.regions import region_key
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
class SnapshotStats(LockStats):
    """What a reader did (all reads since it was made)."""

    pages: int = 0
    pairs: int = 0


async def region_ranges(pd: PDClient, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
    """``[start, end)`` (raw keys) cut at PD's current region boundaries: one range per region."""
    regions = await pd.scan_regions(region_key(start, encoded=True), region_key(end, encoded=True))
    cuts = [start]
    for region in regions[1:]:
        raw = decode_bytes(region.start)[0]
        if cuts[-1] < raw and (not end or raw < end):
            cuts.append(raw)
    return [(lo, hi) for lo, hi in zip(cuts, [*cuts[1:], end], strict=True)]


class SnapshotReader(LockResolver):
    """Reads key ranges at a version through ``tikvpb.Tikv`` (see the module docstring)."""

    stats: SnapshotStats

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
        super().__init__(pd, tls=tls, rpc_timeout=rpc_timeout, stats=SnapshotStats())
        self.page_size = page_size
        self.retry_timeout = retry_timeout
        #: Sampling: keys only (values empty), a locked key counted as a key without
        #: resolving its lock — where to cut ranges needs no exact read.
        self.keys_only = keys_only

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
            except RetryError as retry:
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
        Raises RetryError to read from ``key`` again."""
        region = await self.locate(key)
        request = kvrpcpb_pb2.ScanRequest(
            context=self.context(region),
            start_key=key,
            end_key=end,
            limit=self.page_size,
            version=version,
            key_only=self.keys_only,
        )
        response = await self.call(region, "KvScan", request)
        if response.HasField("region_error"):
            self.on_region_error(region, response.region_error)
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
            resolved = await self.resolve(locks, version)
            if pairs:
                return pairs, locks[0].key
            if not resolved:
                raise RetryError(f"waiting for the lock of transaction {locks[0].lock_version} on {locks[0].key.hex()}")
            return [], key
        if len(response.pairs) >= self.page_size:
            return pairs, response.pairs[-1].key + b"\x00"
        region_end = raw_end(region)
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
