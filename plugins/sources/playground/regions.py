"""Regions, stores and leaders: the topology PD reports and TiKV enforces.

Regions cover the memcomparable-encoded key space without gaps: the first
starts at ``b""``, the last ends at ``b""`` (+inf). Each region has an epoch
(``version`` moves on split and merge, ``conf_ver`` on peer changes), one peer
on every store, and a leader store. Changes are reported to observers under
the cluster lock so that TiKV streams see them in order with data changes.

Split keeps the region id on the left part; the right part gets a new id.
Merge folds a region into its right or left neighbour, which keeps its id.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from cdcflow.plugins.sources.playground.errors import PlaygroundError

__all__ = ["Region", "RegionEvent", "RegionEventKind", "RegionMap"]


@dataclass(frozen=True)
class Region:
    """A region's meta at one epoch. ``peers`` maps store id → peer id."""

    id: int
    start: bytes  # encoded, inclusive
    end: bytes  # encoded, exclusive; b"" = +inf
    version: int
    conf_ver: int
    peers: tuple[tuple[int, int], ...]  # (store id, peer id)
    leader_store: int

    def contains(self, enc_key: bytes) -> bool:
        return self.start <= enc_key and (not self.end or enc_key < self.end)

    def overlaps(self, enc_start: bytes, enc_end: bytes) -> bool:
        return (not enc_end or self.start < enc_end) and (not self.end or enc_start < self.end)

    def peer_on(self, store_id: int) -> int:
        return dict(self.peers)[store_id]

    @property
    def leader_peer(self) -> tuple[int, int]:
        """(peer id, store id) of the leader."""
        return self.peer_on(self.leader_store), self.leader_store


class RegionEventKind(enum.Enum):
    SPLIT = "split"  # region ``old`` became ``new`` (2 regions)
    MERGE = "merge"  # ``old`` = [source, target]; ``new`` = [merged target]
    LEADER = "leader"  # ``old`` = [before]; ``new`` = [after]


@dataclass(frozen=True)
class RegionEvent:
    kind: RegionEventKind
    old: tuple[Region, ...]
    new: tuple[Region, ...]


RegionObserver = Callable[[RegionEvent], None]


@dataclass
class RegionMap:
    """The cluster's regions. All methods take ``lock`` (shared with the MVCC store)."""

    store_ids: Sequence[int]
    lock: threading.RLock = field(default_factory=threading.RLock)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _regions: list[Region] = field(default_factory=list)  # sorted by start
    _starts: list[bytes] = field(default_factory=list)  # their start keys, for bisect
    _observers: list[RegionObserver] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.store_ids:
            raise PlaygroundError("a playground cluster needs at least one store")
        self._regions = [self._new_region(b"", b"", version=1, leader=self.store_ids[0])]
        self._starts = [b""]

    def subscribe(self, observer: RegionObserver) -> None:
        with self.lock:
            self._observers.append(observer)

    def alloc_id(self) -> int:
        return next(self._ids)

    # -- lookups -------------------------------------------------------------------------------

    def all(self) -> list[Region]:
        with self.lock:
            return list(self._regions)

    def locate(self, enc_key: bytes) -> Region:
        with self.lock:
            return self._regions[bisect.bisect_right(self._starts, enc_key) - 1]

    def previous(self, enc_key: bytes) -> Region | None:
        with self.lock:
            idx = self._regions.index(self.locate(enc_key))
            return self._regions[idx - 1] if idx > 0 else None

    def by_id(self, region_id: int) -> Region | None:
        with self.lock:
            return next((r for r in self._regions if r.id == region_id), None)

    def overlapping(self, enc_start: bytes, enc_end: bytes) -> list[Region]:
        with self.lock:
            return [r for r in self._regions if r.overlaps(enc_start, enc_end)]

    # -- changes -------------------------------------------------------------------------------

    def split(self, region_id: int, enc_key: bytes) -> tuple[Region, Region]:
        """Split ``region_id`` at ``enc_key`` (strictly inside it)."""
        with self.lock:
            old = self._require(region_id)
            if enc_key <= old.start or (old.end and enc_key >= old.end):
                raise PlaygroundError(f"split key {enc_key.hex()} is not strictly inside region {region_id}")
            left = replace(old, end=enc_key, version=old.version + 1)
            right = self._new_region(enc_key, old.end, version=old.version + 1, leader=old.leader_store)
            idx = self._regions.index(old)
            self._regions[idx : idx + 1] = [left, right]
            self._emit(RegionEvent(RegionEventKind.SPLIT, (old,), (left, right)))
            return left, right

    def merge(self, source_id: int, target_id: int) -> Region:
        """Fold ``source_id`` into its adjacent ``target_id``; return the grown target."""
        with self.lock:
            source, target = self._require(source_id), self._require(target_id)
            if source.end == target.start and source.end:
                merged = replace(target, start=source.start)
            elif target.end == source.start and target.end:
                merged = replace(target, end=source.end)
            else:
                raise PlaygroundError(f"regions {source_id} and {target_id} are not adjacent; cannot merge")
            merged = replace(merged, version=max(source.version, target.version) + 1)
            self._regions.remove(source)
            self._regions[self._regions.index(target)] = merged
            self._emit(RegionEvent(RegionEventKind.MERGE, (source, target), (merged,)))
            return merged

    def transfer_leader(self, region_id: int, store_id: int) -> Region:
        """Move the leader of ``region_id`` to its peer on ``store_id`` (epoch unchanged)."""
        with self.lock:
            old = self._require(region_id)
            if store_id not in dict(old.peers):
                raise PlaygroundError(f"region {region_id} has no peer on store {store_id}")
            new = replace(old, leader_store=store_id)
            self._regions[self._regions.index(old)] = new
            self._emit(RegionEvent(RegionEventKind.LEADER, (old,), (new,)))
            return new

    def _require(self, region_id: int) -> Region:
        region = self.by_id(region_id)
        if region is None:
            raise PlaygroundError(f"no region {region_id}; list regions with Playground.regions()")
        return region

    def _new_region(self, start: bytes, end: bytes, *, version: int, leader: int) -> Region:
        peers = tuple((s, self.alloc_id()) for s in self.store_ids)
        return Region(self.alloc_id(), start, end, version, 1, peers, leader)

    def _emit(self, event: RegionEvent) -> None:
        self._starts = [r.start for r in self._regions]
        for observer in self._observers:
            observer(event)
