"""The playground's transactional workload on the ``shop`` tables.

A :class:`WorkloadPlanner` decides, from a seed alone, every transaction:
single-row inserts, updates and deletes, multi-row transactions over several
tables (hence over several regions), occasional large transactions, and now
and then a DDL (ADD COLUMN, later DROP COLUMN of it). The same seed gives the
same sequence of plans, values included; only timestamps differ between runs.
:class:`Workload` executes plans as Percolator transactions, either on demand
(``run(n)``) or in a thread at a rate in transactions per second.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.sources.playground.catalog import Catalog, Column
from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.ddl import DDLExecutor
from cdcflow.plugins.sources.playground.mvcc import TxnError
from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key
from cdcflow.plugins.sources.playground.shop import SHOP_DB, SHOP_TABLES, random_value
from cdcflow.plugins.sources.playground.txn import Transaction
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType

__all__ = ["DDLPlan", "RowOp", "TxnPlan", "Workload", "WorkloadPlanner", "WorkloadStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowOp:
    table: str
    kind: str  # insert | update | delete
    handle: int
    values: dict[str, Any] | None  # full row for insert/update (without the primary key)


@dataclass(frozen=True)
class DDLPlan:
    table: str
    kind: str  # add_column | drop_column
    column: str


@dataclass(frozen=True)
class TxnPlan:
    ops: tuple[RowOp, ...] = ()
    ddl: DDLPlan | None = None


_EXTRA_FT = FieldType(int(TypeCode.VARCHAR), flen=32, charset="utf8mb4", collate="utf8mb4_bin")
_EXTRA_DEFAULT = "n/a"


@dataclass
class WorkloadPlanner:
    """Deterministic plans from ``seed`` (see the module docstring)."""

    seed: int = 0
    ddl_every: int = 200
    large_rows: tuple[int, int] = (100, 400)
    _rng: random.Random = field(init=False)
    _columns: dict[str, list[Column]] = field(init=False)
    _rows: dict[str, dict[int, dict[str, Any]]] = field(init=False)
    _live: dict[str, list[int]] = field(init=False)
    _next_handle: dict[str, int] = field(init=False)
    _count: int = 0
    _extra: dict[str, str] = field(init=False)  # table -> added column awaiting drop

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._columns = {t: [Column(i + 1, n, ft) for i, (n, ft) in enumerate(cols)] for t, cols in SHOP_TABLES.items()}
        self._rows = {t: {} for t in SHOP_TABLES}
        self._live = {t: [] for t in SHOP_TABLES}
        self._next_handle = dict.fromkeys(SHOP_TABLES, 1)
        self._extra = {}

    def next_plan(self) -> TxnPlan:
        self._count += 1
        if self.ddl_every > 0 and self._count % self.ddl_every == 0:
            return TxnPlan(ddl=self._ddl())
        r = self._rng.random()
        if r < 0.40:
            return TxnPlan((self._insert(self._table()),))
        if r < 0.70:
            return TxnPlan((self._update_or_insert(self._table()),))
        if r < 0.80:
            return TxnPlan((self._delete_or_insert(self._table()),))
        if r < 0.98 or self.large_rows[1] <= 0:
            return TxnPlan(tuple(self._any_op() for _ in range(self._rng.randrange(2, 7))))
        table = self._table()
        return TxnPlan(tuple(self._insert(table) for _ in range(self._rng.randrange(*self.large_rows))))

    def reserve(self, table: str, count: int, at_least: int = 1) -> int:
        """Take ``count`` consecutive handles of ``table`` (from ``at_least`` or above) for rows
        written outside the workload; return the first. Tables the workload does not know
        start at ``at_least``."""
        first = max(self._next_handle.get(table, 1), at_least)
        if table in self._next_handle:
            self._next_handle[table] = first + count
        return first

    def adopt(self, table: str, handle: int, row: dict[str, Any]) -> None:
        """Let the workload update and delete a row written outside it."""
        if table in self._rows:
            self._rows[table][handle] = dict(row)
            self._live[table].append(handle)

    def _table(self) -> str:
        return self._rng.choice(sorted(SHOP_TABLES))

    def _row(self, table: str) -> dict[str, Any]:
        return {c.name: random_value(self._rng, c) for c in self._columns[table][1:]}

    def _insert(self, table: str) -> RowOp:
        handle = self._next_handle[table]
        self._next_handle[table] += 1
        row = self._row(table)
        self._rows[table][handle] = row
        self._live[table].append(handle)
        return RowOp(table, "insert", handle, dict(row))

    def _update_or_insert(self, table: str) -> RowOp:
        if not self._live[table]:
            return self._insert(table)
        handle = self._rng.choice(self._live[table])
        row = self._rows[table][handle]
        for column in self._rng.sample(self._columns[table][1:], k=self._rng.randrange(1, 3)):
            row[column.name] = random_value(self._rng, column)
        return RowOp(table, "update", handle, dict(row))

    def _delete_or_insert(self, table: str) -> RowOp:
        live = self._live[table]
        if not live:
            return self._insert(table)
        i = self._rng.randrange(len(live))
        handle = live[i]
        live[i] = live[-1]
        live.pop()
        del self._rows[table][handle]
        return RowOp(table, "delete", handle, None)

    def _any_op(self) -> RowOp:
        table, r = self._table(), self._rng.random()
        if r < 0.5:
            return self._insert(table)
        return self._update_or_insert(table) if r < 0.85 else self._delete_or_insert(table)

    def _ddl(self) -> DDLPlan:
        table = self._table()
        if table in self._extra:
            column = self._extra.pop(table)
            self._columns[table] = [c for c in self._columns[table] if c.name != column]
            for row in self._rows[table].values():
                row.pop(column, None)
            return DDLPlan(table, "drop_column", column)
        column = f"extra_{self._count}"
        self._extra[table] = column
        new_id = max(c.id for c in self._columns[table]) + 1
        self._columns[table].append(Column(new_id, column, _EXTRA_FT, _EXTRA_DEFAULT, _EXTRA_DEFAULT))
        for row in self._rows[table].values():
            row[column] = _EXTRA_DEFAULT
        return DDLPlan(table, "add_column", column)


@dataclass
class WorkloadStats:
    transactions: int = 0
    rows: int = 0  # row operations planned
    keys: int = 0  # keys written (a transaction writing a key twice writes it once)
    ddls: int = 0
    retries: int = 0
    last_commit_ts: int = 0


class Workload:
    """Runs :class:`WorkloadPlanner` plans against the cluster. ``run`` and the thread are exclusive."""

    def __init__(self, cluster: Cluster, catalog: Catalog, ddl: DDLExecutor, *, seed: int = 0, **planner: Any) -> None:
        self.cluster, self.catalog, self.ddl = cluster, catalog, ddl
        self.planner = WorkloadPlanner(seed, **planner)
        self.stats = WorkloadStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Held while plans run; whoever changes the planner from outside holds it too.
        self.run_lock = self._run_lock = threading.Lock()

    def create_tables(self) -> None:
        """CREATE TABLE for every shop table that does not exist yet."""
        existing = {t.name for t in self.catalog.tables(SHOP_DB)}
        for name, columns in SHOP_TABLES.items():
            if name not in existing:
                self.ddl.create_table(SHOP_DB, name, list(columns))

    def run(self, count: int) -> WorkloadStats:
        """Execute the next ``count`` plans now (blocking)."""
        with self._run_lock:
            for _ in range(count):
                self._execute(self.planner.next_plan())
        return self.stats

    def start(self, rate: float) -> None:
        """Run plans in a thread at ``rate`` transactions per second (until :meth:`stop`)."""
        if rate <= 0 or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, args=(rate,), name="cdcflow-playground-workload", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def _loop(self, rate: float) -> None:
        interval, due = 1.0 / rate, time.monotonic()
        while not self._stop.is_set():
            self.run(1)
            due += interval
            delay = due - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                due = time.monotonic()  # behind: do not burst to catch up

    def _execute(self, plan: TxnPlan) -> None:
        if plan.ddl is not None:
            d = plan.ddl
            if d.kind == "add_column":
                self.ddl.add_column(SHOP_DB, d.table, d.column, _EXTRA_FT, _EXTRA_DEFAULT)
            else:
                self.ddl.drop_column(SHOP_DB, d.table, d.column)
            self.stats.ddls += 1
            return
        for attempt in range(10):
            txn = Transaction(self.cluster)
            for op in plan.ops:
                table = self.catalog.find(SHOP_DB, op.table)
                key = row_key(table, op.handle)
                if op.values is None:
                    txn.delete(key)
                else:
                    txn.put(key, encode_row_value(table, op.values))
            try:
                self.stats.last_commit_ts = txn.commit()
                self.stats.keys += len(txn.keys)
                break
            except TxnError as exc:  # a test's own transaction holds a key: retry shortly
                txn.rollback()
                self.stats.retries += 1
                log.debug("workload transaction retried (%s)", exc)
                time.sleep(0.01 * (attempt + 1))
        else:
            raise TxnError(f"workload transaction failed 10 times: {plan}")
        self.stats.transactions += 1
        self.stats.rows += len(plan.ops)
