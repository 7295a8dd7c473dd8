"""Bulk loading of playground tables: many rows, fast, as a physical import.

:class:`BulkLoader` writes rows straight into the MVCC store as committed
puts (one start ts and one commit ts per call), in batches of ``batch`` rows,
without locks and without telling change feeds — what TiDB Lightning's
physical import does to TiKV. It exists so that tests and benchmarks can
fill a table with a million rows in seconds instead of running a million
transactions. Handles are taken above the highest handle of the table (and
above every handle the workload has planned), so a running workload never
collides with the loaded rows; adopted rows may later be updated and deleted
by the workload. Afterwards regions are split so that none holds more than
the cluster's ``split_keys`` keys, as TiKV's size checks would have.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

from cdcflow.plugins.sources.playground._keys import encode_key
from cdcflow.plugins.sources.playground.catalog import Catalog, TableDef
from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key
from cdcflow.plugins.sources.playground.shop import random_value
from cdcflow.plugins.sources.playground.workload import Workload
from cdcflow.plugins.sources.tikv.tidb.keys import decode_record_key, table_record_span

__all__ = ["BulkLoader"]


class BulkLoader:
    """Fills tables of a playground (see the module docstring)."""

    def __init__(self, cluster: Cluster, catalog: Catalog, workload: Workload, *, seed: int = 0) -> None:
        self.cluster, self.catalog, self.workload = cluster, catalog, workload
        self._rng = random.Random(seed)

    def load(
        self,
        db: str,
        table: str,
        count: int,
        *,
        rows: Iterable[Mapping[str, Any]] | None = None,
        batch: int = 50_000,
        adopt: bool = True,
    ) -> int:
        """Write ``count`` rows into ``db.table``; return the commit ts of the load."""
        if count < 0:
            raise PlaygroundError(f"count must not be negative, got {count}")
        if batch < 1:
            raise PlaygroundError(f"batch must be at least 1, got {batch}")
        definition = self.catalog.find(db, table)
        values = iter(rows) if rows is not None else None
        with self.workload.run_lock:
            first = self.workload.planner.reserve(table, count, self._next_free(definition))
            start_ts = self.cluster.oracle.next()
            commit_ts = self.cluster.oracle.next()
            handles = iter(range(first, first + count))
            while True:
                chunk = list(islice(handles, batch))
                if not chunk:
                    break
                pairs, planned = self._encode(definition, chunk, values)
                self.cluster.mvcc.load(pairs, start_ts, commit_ts)
                if adopt:
                    for handle, row in planned:
                        self.workload.planner.adopt(table, handle, row)
        self._split(definition)
        return commit_ts

    def _encode(
        self, definition: TableDef, handles: list[int], values: Iterator[Mapping[str, Any]] | None
    ) -> tuple[list[tuple[bytes, bytes]], list[tuple[int, dict[str, Any]]]]:
        pairs: list[tuple[bytes, bytes]] = []
        planned: list[tuple[int, dict[str, Any]]] = []
        columns = definition.columns[1:]
        for handle in handles:
            if values is not None:
                given = next(values, None)
                if given is None:
                    raise PlaygroundError(f"rows ran out after {len(pairs)} of the rows asked for")
                row = {c.name: given.get(c.name) for c in columns}
            else:
                row = {c.name: random_value(self._rng, c) for c in columns}
            pairs.append((row_key(definition, handle), encode_row_value(definition, row)))
            planned.append((handle, row))
        return pairs, planned

    def _next_free(self, definition: TableDef) -> int:
        """One above the highest handle stored in any partition of the table."""
        highest = 0
        for pid in definition.physical_ids:
            start, end = table_record_span(pid)
            last = self.cluster.mvcc.last_key(encode_key(start), encode_key(end))
            if last is not None:
                handle = decode_record_key(last).handle
                if isinstance(handle, int):
                    highest = max(highest, handle)
        return highest + 1

    def _split(self, definition: TableDef) -> None:
        if not self.cluster.auto_split:
            return
        step = self.cluster.split_keys
        for pid in definition.physical_ids:
            start, end = table_record_span(pid)
            for key in self.cluster.mvcc.keys_every(encode_key(start), encode_key(end), step):
                self.cluster.split_at_raw(key)
