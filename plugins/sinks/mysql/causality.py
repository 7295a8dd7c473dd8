"""Conflict detection: which upstream transactions may run in parallel.

A *unit* is the rows of one upstream transaction on one table (same table,
commit ts and start ts); it is applied in one downstream transaction. Two
units conflict when they touch the same value of a primary or unique key —
in the old or the new image — of the same table. Conflicting units are
chained into one *lane* (union-find over their keys) and a lane runs on one
worker in upstream order, so rows of one key keep their commit-ts order
downstream. A table without a unique key has one conflict key, the table
itself, so its units are applied serially.

Lanes are spread over the workers in contiguous runs of about equal size,
deterministically for a given batch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.data.events import RowChange, TableName
from cdcflow.plugins.sinks.mysql.dml import TableMeta

__all__ = ["Unit", "assign_lanes", "conflict_keys", "group_for_transactions", "lanes_of", "split_units"]


@dataclass(slots=True)
class Unit:
    """The rows of one upstream transaction on one table, in upstream order."""

    table: TableName
    commit_ts: int
    start_ts: int
    rows: list[RowChange] = field(default_factory=list)
    #: Position of the unit in the batch, to keep lanes in upstream order.
    seq: int = 0


def split_units(rows: Iterable[RowChange]) -> list[Unit]:
    """Rows (in batch order) grouped into units, in order of first appearance."""
    units: dict[tuple[TableName, int, int], Unit] = {}
    for row in rows:
        ident = (row.table, row.commit_ts, row.start_ts)
        unit = units.get(ident)
        if unit is None:
            unit = units[ident] = Unit(row.table, row.commit_ts, row.start_ts, seq=len(units))
        unit.rows.append(row)
    return list(units.values())


def _normal(value: Any) -> Hashable:
    # Downstream collations are usually case-insensitive: over-detecting a
    # conflict costs only parallelism, missing one could reorder a key.
    if isinstance(value, str):
        return value.casefold().rstrip(" ")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return value if isinstance(value, Hashable) else repr(value)


def conflict_keys(meta: TableMeta, unit: Unit) -> set[Hashable]:
    """Every (table, index, values) the unit's rows touch, old and new images."""
    table = (meta.schema, meta.table)
    if not meta.unique_keys:
        return {table}
    keys: set[Hashable] = set()
    for row in unit.rows:
        for image in (row.before, row.after):
            if image is None:
                continue
            for index, cols in enumerate(meta.unique_keys):
                values = tuple(image.get(c) for c in cols)
                if any(v is None for v in values):
                    continue  # NULLs never collide in a unique index
                keys.add((table, index, tuple(_normal(v) for v in values)))
    return keys or {table}


class _UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def lanes_of(units: Sequence[Unit], meta_of: Callable[[TableName], TableMeta]) -> list[list[Unit]]:
    """Units chained by shared conflict keys; each lane in upstream order."""
    uf = _UnionFind(len(units))
    owner: dict[Hashable, int] = {}
    for i, unit in enumerate(units):
        for key in conflict_keys(meta_of(unit.table), unit):
            if key in owner:
                uf.union(owner[key], i)
            else:
                owner[key] = i
    lanes: dict[int, list[Unit]] = {}
    for i, unit in enumerate(units):
        lanes.setdefault(uf.find(i), []).append(unit)
    return list(lanes.values())


def assign_lanes(lanes: Sequence[list[Unit]], workers: int) -> list[list[Unit]]:
    """Each worker's units: whole lanes, interleaved back into upstream order.

    Lanes are taken in upstream order and handed out in contiguous runs of
    about equal row counts, so that a worker's rows stay close together in
    the key space (neighbouring keys in one worker, not on every worker).
    """
    total = sum(len(u.rows) for lane in lanes for u in lane)
    share = max(1, -(-total // workers))
    assigned: list[list[Unit]] = [[] for _ in range(workers)]
    worker, load = 0, 0
    for lane in sorted(lanes, key=lambda lane: lane[0].seq):
        size = sum(len(u.rows) for u in lane)
        if load and load + size > share and worker < workers - 1:
            worker, load = worker + 1, 0
        assigned[worker].extend(lane)
        load += size
    return [sorted(mine, key=lambda u: u.seq) for mine in assigned]


def group_for_transactions(units: Sequence[Unit], max_rows: int) -> list[list[Unit]]:
    """Consecutive units packed into downstream transactions of at most
    ``max_rows`` rows; a unit larger than that stays whole (atomicity)."""
    groups: list[list[Unit]] = []
    size = 0
    for unit in units:
        if groups and size + len(unit.rows) <= max_rows:
            groups[-1].append(unit)
            size += len(unit.rows)
        else:
            groups.append([unit])
            size = len(unit.rows)
    return groups
