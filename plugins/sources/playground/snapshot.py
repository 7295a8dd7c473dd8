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
    start, end = table_record_span(definition.id)
    deadline = time.monotonic() + wait
    while True:
        with cluster.lock:
            oldest = cluster.mvcc.min_lock_ts(encode_bytes(start), encode_bytes(end))
            if oldest is None or oldest > ts:
                pairs = list(cluster.mvcc.scan(start, end, ts))
                break
        if time.monotonic() > deadline:
            raise PlaygroundError(
                f"snapshot of {db}.{table} at {ts} is blocked by a lock of start ts {oldest}; commit or roll it back"
            )
        time.sleep(0.01)
    return [decode_row_value(definition, key, value) for key, value in pairs]
