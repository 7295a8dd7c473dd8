"""The playground's cluster state: oracle, MVCC store, regions and stores.

One re-entrant lock orders everything that TiKV streams must see in order:
data changes, region changes and resolved-ts computations. Regions split by
themselves (at their middle key) once they hold more than ``split_keys`` keys
or once more than ``split_bytes`` of keys and values were committed into them
since they were created (an approximation of TiKV's region size check).
``split_keys=0`` turns automatic splits off (splits then happen on demand only).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from cdcflow.plugins.sources.playground._keys import encode_key
from cdcflow.plugins.sources.playground.mvcc import Change, ChangeKind, MVCCStore
from cdcflow.plugins.sources.playground.oracle import TSOOracle
from cdcflow.plugins.sources.playground.regions import RegionMap

__all__ = ["Cluster", "StoreInfo"]


@dataclass
class StoreInfo:
    """A TiKV store as PD lists it. ``address`` is empty until its server listens."""

    id: int
    address: str = ""
    up: bool = True
    start_timestamp: int = 0


class Cluster:
    """Shared state of PD and the TiKV stores (see the module docstring)."""

    def __init__(
        self,
        stores: int = 3,
        *,
        cluster_id: int | None = None,
        split_keys: int = 2000,
        split_bytes: int = 1 << 20,
        seed: int = 0,
    ) -> None:
        if stores < 1:
            from cdcflow.plugins.sources.playground.errors import PlaygroundError

            raise PlaygroundError(f"--stores must be at least 1, got {stores}")
        self.lock = threading.RLock()
        self.cluster_id = cluster_id if cluster_id is not None else random.Random(seed).randrange(1 << 60, 1 << 62)
        self.oracle = TSOOracle()
        self.mvcc = MVCCStore(self.lock)
        self.stores = {i: StoreInfo(i) for i in range(1, stores + 1)}
        self.regions = RegionMap(list(self.stores), self.lock)
        self.split_keys = split_keys
        self.split_bytes = split_bytes
        self.auto_split = split_keys > 0  # 0 turns automatic splits off entirely
        self._written: dict[int, int] = {}  # region id -> bytes committed into it since it was created
        self.mvcc.subscribe(self._maybe_split)

    def store_ids(self) -> Sequence[int]:
        return list(self.stores)

    def split_at_raw(self, raw_key: bytes) -> None:
        """Split the region holding ``raw_key`` so that a region starts at it (no-op if one does)."""
        enc = encode_key(raw_key)
        with self.lock:
            region = self.regions.locate(enc)
            if region.start != enc:
                self.regions.split(region.id, enc)

    def _maybe_split(self, changes: Sequence[Change]) -> None:
        if not self.auto_split or changes[0].kind is not ChangeKind.COMMIT:
            return
        touched: dict[int, int] = {}
        for change in changes:
            region = self.regions.locate(encode_key(change.key))
            touched[region.id] = touched.get(region.id, 0) + len(change.key) + len(change.value)
        for region_id, size in touched.items():
            written = self._written[region_id] = self._written.get(region_id, 0) + size
            grown = self.regions.by_id(region_id)
            assert grown is not None
            too_many = self.split_keys < self.mvcc.key_count(grown.start, grown.end)
            if too_many or 0 < self.split_bytes < written:
                middle = self.mvcc.middle_key(grown.start, grown.end)
                if middle is not None and middle != grown.start:
                    self._written.pop(region_id, None)
                    self.regions.split(grown.id, middle)
