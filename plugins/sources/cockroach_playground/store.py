"""The playground's MVCC table store: versioned rows and descriptors under an HLC clock.

Every committed write is a version ``(hlc, row | None)`` of its key; schema
changes are descriptor versions. Commits take the store lock and an HLC from
the clock, so commit order is HLC order and the clock's ``now()`` is a valid
resolved timestamp (nothing can commit at or below it any more). The commit log
is what live changefeeds read; the version history is what cursor catch-up
scans read.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from cdcflow.plugins.sources.cockroachdb.hlc import HLC

__all__ = ["Column", "Commit", "Store", "Table", "TableDef"]


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # CockroachDB SQL type text, e.g. INT8, STRING(64), DECIMAL(12,2)
    nullable: bool = True
    default: Any = None


@dataclass(frozen=True)
class TableDef:
    """One descriptor version."""

    columns: tuple[Column, ...]
    pk: tuple[str, ...]

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)

    def project(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        """A stored row as this version reads it (added columns take their default)."""
        if row is None:
            return None
        return {c.name: row.get(c.name, c.default) if c.name in row else c.default for c in self.columns}


@dataclass
class Table:
    id: int
    name: str
    descriptors: list[tuple[HLC, TableDef | None]]
    rows: dict[tuple[Any, ...], list[tuple[HLC, dict[str, Any] | None]]] = field(default_factory=dict)
    gc_threshold: HLC = field(default_factory=lambda: HLC(0))
    gc_ttl_seconds: int = 14400

    def descriptor(self, at: HLC | None = None) -> TableDef | None:
        found: TableDef | None = None
        for ts, d in self.descriptors:
            if at is None or ts <= at:
                found = d
        return found

    def created(self) -> HLC:
        return self.descriptors[0][0]

    def value(self, key: tuple[Any, ...], at: HLC | None = None) -> dict[str, Any] | None:
        found: dict[str, Any] | None = None
        for ts, row in self.rows.get(key, ()):
            if at is None or ts <= at:
                found = row
        return found


@dataclass(frozen=True)
class Commit:
    """One committed transaction (or schema change) in the commit log."""

    hlc: HLC
    #: (table id, key, row before, row after)
    writes: tuple[tuple[int, tuple[Any, ...], dict[str, Any] | None, dict[str, Any] | None], ...] = ()
    #: table id of a descriptor change, with the versions before and after
    schema_change: tuple[int, TableDef | None, TableDef | None] | None = None


class Clock:
    """A hybrid logical clock: wall time in ns, a logical counter for ties."""

    def __init__(self) -> None:
        self._last = HLC(0)

    def now(self) -> HLC:
        wall = time.time_ns()
        last = self._last
        self._last = HLC(wall) if wall > last.wall_ns else last.next()
        return self._last


class Store:
    """Tables of one database, their versions, and the commit log."""

    def __init__(self, database: str = "shop") -> None:
        self.database = database
        self.lock = threading.RLock()
        self.clock = Clock()
        self.tables: dict[str, Table] = {}
        self.log: list[Commit] = []
        self._next_id = 104  # CockroachDB's first user descriptor ids are about here
        self.changed = threading.Condition(self.lock)

    def now(self) -> HLC:
        with self.lock:
            return self.clock.now()

    def table(self, name: str, at: HLC | None = None) -> Table:
        with self.lock:
            table = self.tables.get(name)
            if table is None or table.descriptor(at) is None:
                raise LookupError(name)
            return table

    def create_table(self, name: str, columns: tuple[Column, ...], pk: tuple[str, ...]) -> HLC:
        with self.lock:
            existing = self.tables.get(name)
            if existing is not None and existing.descriptor() is not None:
                raise KeyError(name)
            ts = self.clock.now()
            definition = TableDef(columns, pk or (columns[0].name,))
            self.tables[name] = Table(self._next_id, name, [(ts, definition)])
            self._next_id += 1
            self._append(Commit(ts, schema_change=(self.tables[name].id, None, definition)))
            return ts

    def alter(self, name: str, definition: TableDef | None) -> HLC:
        """A new descriptor version (None: the table is dropped)."""
        with self.lock:
            table = self.table(name)
            old = table.descriptor()
            ts = self.clock.now()
            table.descriptors.append((ts, definition))
            self._append(Commit(ts, schema_change=(table.id, old, definition)))
            return ts

    def add_column(self, name: str, column: Column) -> HLC:
        with self.lock:
            d = self.table(name).descriptor()
            assert d is not None
            return self.alter(name, replace(d, columns=(*d.columns, column)))

    def drop_column(self, name: str, column: str) -> HLC:
        with self.lock:
            d = self.table(name).descriptor()
            assert d is not None
            return self.alter(name, replace(d, columns=tuple(c for c in d.columns if c.name != column)))

    def commit(self, writes: list[tuple[str, tuple[Any, ...], dict[str, Any] | None]]) -> HLC | None:
        """Apply ``(table, key, row | None)`` writes atomically at one new HLC (the last write of a key wins)."""
        if not writes:
            return None
        with self.lock:
            ts = self.clock.now()
            final: dict[tuple[str, tuple[Any, ...]], dict[str, Any] | None] = {}
            for name, key, row in writes:
                final[(name, key)] = row
            entries = []
            for (name, key), row in final.items():
                table = self.table(name)
                before = table.value(key)
                if before is None and row is None:
                    continue  # deleting a row that does not exist
                table.rows.setdefault(key, []).append((ts, row))
                entries.append((table.id, key, before, row))
            self._append(Commit(ts, tuple(entries)))
            return ts

    def _append(self, commit: Commit) -> None:
        self.log.append(commit)
        self.changed.notify_all()

    def by_id(self, table_id: int) -> Table:
        with self.lock:
            return next(t for t in self.tables.values() if t.id == table_id)

    def rows_at(self, name: str, at: HLC | None = None) -> list[dict[str, Any]]:
        """Every row of ``name`` as of ``at``, in key order, read with the descriptor of ``at``."""
        with self.lock:
            table = self.table(name, at)
            definition = table.descriptor(at)
            assert definition is not None
            out = []
            for key in sorted(table.rows, key=_sortable):
                row = definition.project(table.value(key, at))
                if row is not None:
                    out.append(row)
            return out


def _sortable(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, str(type(v)), v) for v in key)
