"""Consistent snapshot reads of playground tables at a TSO, decoded into rows."""

from __future__ import annotations

import time
from typing import Any

from cdcflow.plugins.sources.playground.catalog import Catalog
from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.playground.rows import decode_row_value
from cdcflow.plugins.sources.tikv.tidb.keys import encode_bytes, table_record_span

__all__ = ["read_snapshot"]


def read_snapshot(
    cluster: Cluster, catalog: Catalog, db: str, table: str, ts: int, *, wait: float = 10.0
) -> list[dict[str, Any]]:
    """Every row of ``db.table`` as of ``ts``, decoded with the schema in force at ``ts``, by handle.

    Consistent: like a TiKV reader, it waits while a lock with start ts <= ``ts``
    is in the table's range (its commit ts might still be <= ``ts``); raises
    :class:`PlaygroundError` if such a lock outlives ``wait`` seconds.
    """
    definition = catalog.find(db, table, ts)
    spans = [table_record_span(pid) for pid in definition.physical_ids]  # a partitioned table: one per partition
    deadline = time.monotonic() + wait
    while True:
        with cluster.lock:
            locks = [cluster.mvcc.min_lock_ts(encode_bytes(start), encode_bytes(end)) for start, end in spans]
            oldest = min((ts_ for ts_ in locks if ts_ is not None), default=None)
            if oldest is None or oldest > ts:
                pairs = [pair for start, end in spans for pair in cluster.mvcc.scan(start, end, ts)]
                break
        if time.monotonic() > deadline:
            raise PlaygroundError(
                f"snapshot of {db}.{table} at {ts} is blocked by a lock of start ts {oldest}; commit or roll it back"
            )
        time.sleep(0.01)
    rows = [decode_row_value(definition, key, value) for key, value in pairs]
    if len(spans) > 1:
        rows.sort(key=lambda row: row[definition.pk.name])
    return rows
