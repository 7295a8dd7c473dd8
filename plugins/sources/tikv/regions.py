"""Regions as the client sees them, and a cache of them keyed by region start key.

Region boundaries in PD are in the key space of TiKV's storage: for TiDB and
txnkv data that is the memcomparable encoding of the user key
(:func:`~cdcflow.plugins.sources.tikv.tidb.keys.encode_bytes`), for rawkv (API v1) the raw key itself. Every key handled
here is already in that space; :func:`region_key` converts a user key.

The cache answers "which region holds this key" with a bisect over the start
keys of the regions it knows. It is only a hint: a request built from it may
be answered with EpochNotMatch / RegionNotFound / NotLeader, and the caller
then invalidates the entry and asks PD again.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from cdcflow.plugins.sources.tikv.tidb.keys import encode_bytes

__all__ = ["RegionCache", "RegionInfo", "clip", "encode_bytes", "region_key"]


def region_key(key: bytes, *, encoded: bool) -> bytes:
    """``key`` in the region key space; the empty key (±infinity) stays empty."""
    if not key or not encoded:
        return key
    return encode_bytes(key)


@dataclass(frozen=True, slots=True)
class RegionInfo:
    """A region as PD last described it, with the store of its leader peer.

    ``start``/``end`` are region-space keys; an empty ``end`` is +infinity.
    """

    id: int
    start: bytes
    end: bytes
    conf_ver: int
    version: int
    leader_store_id: int
    #: Store ids of all peers (a NotLeader hint names one of them).
    peer_store_ids: tuple[int, ...] = ()
    #: Peer ids, in the order of ``peer_store_ids`` (KV requests name the peer they are for).
    peer_ids: tuple[int, ...] = ()

    def contains(self, key: bytes) -> bool:
        return key >= self.start and (not self.end or key < self.end)

    def with_leader(self, store_id: int) -> RegionInfo:
        return replace(self, leader_store_id=store_id)

    def peer_on(self, store_id: int) -> int:
        """The id of the region's peer on ``store_id`` (0 when unknown)."""
        for store, peer in zip(self.peer_store_ids, self.peer_ids, strict=False):
            if store == store_id:
                return peer
        return 0


def clip(start: bytes, end: bytes, region: RegionInfo) -> tuple[bytes, bytes]:
    """The part of ``[start, end)`` inside ``region`` (empty end = +infinity)."""
    lo = max(start, region.start)
    if not end:
        hi = region.end
    elif not region.end:
        hi = end
    else:
        hi = min(end, region.end)
    return lo, hi


class RegionCache:
    """Regions ordered by start key; inserting a region evicts every region it overlaps."""

    def __init__(self) -> None:
        self._starts: list[bytes] = []
        self._regions: list[RegionInfo] = []
        self._by_id: dict[int, RegionInfo] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def by_id(self, region_id: int) -> RegionInfo | None:
        return self._by_id.get(region_id)

    def locate(self, key: bytes) -> RegionInfo | None:
        """The cached region containing ``key``, if any."""
        i = bisect.bisect_right(self._starts, key) - 1
        if i < 0:
            return None
        region = self._regions[i]
        return region if region.contains(key) else None

    def covering(self, start: bytes, end: bytes) -> list[RegionInfo] | None:
        """Cached regions covering ``[start, end)`` without a hole, or None if any part is unknown."""
        out: list[RegionInfo] = []
        key = start
        while True:
            region = self.locate(key)
            if region is None:
                return None
            out.append(region)
            key = region.end
            if not key or (end and key >= end):
                return out

    def insert(self, region: RegionInfo) -> None:
        """Cache ``region``, dropping cached regions whose ranges overlap it (they are stale)."""
        self.invalidate(region.id)
        lo = bisect.bisect_right(self._starts, region.start) - 1
        lo = max(lo, 0)
        keep_starts: list[bytes] = self._starts[:lo]
        keep_regions: list[RegionInfo] = self._regions[:lo]
        for old in self._regions[lo:]:
            if _overlaps(old, region):
                del self._by_id[old.id]
            else:
                keep_starts.append(old.start)
                keep_regions.append(old)
        i = bisect.bisect_left(keep_starts, region.start)
        keep_starts.insert(i, region.start)
        keep_regions.insert(i, region)
        self._starts, self._regions = keep_starts, keep_regions
        self._by_id[region.id] = region

    def invalidate(self, region_id: int) -> None:
        """Forget region ``region_id`` (after an epoch error, or when it moved)."""
        region = self._by_id.pop(region_id, None)
        if region is None:
            return
        i = self._regions.index(region)
        del self._regions[i]
        del self._starts[i]

    def invalidate_range(self, start: bytes, end: bytes) -> None:
        """Forget every cached region overlapping ``[start, end)``."""
        probe = RegionInfo(id=0, start=start, end=end, conf_ver=0, version=0, leader_store_id=0)
        for region in [r for r in self._regions if _overlaps(r, probe)]:
            self.invalidate(region.id)

    def update_leader(self, region_id: int, store_id: int) -> RegionInfo | None:
        """Record a new leader store for a cached region (a NotLeader hint)."""
        region = self._by_id.get(region_id)
        if region is None:
            return None
        moved = region.with_leader(store_id)
        i = self._regions.index(region)
        self._regions[i] = moved
        self._by_id[region_id] = moved
        return moved


def _overlaps(a: RegionInfo, b: RegionInfo) -> bool:
    a_before_b = bool(a.end) and a.end <= b.start
    b_before_a = bool(b.end) and b.end <= a.start
    return not (a_before_b or b_before_a)
