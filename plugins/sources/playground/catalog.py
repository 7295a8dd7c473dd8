"""The playground's schema catalog: databases, tables and their versions over time.

Each table keeps every version of its definition with the TSO from which it
is valid (the commit ts of the DDL job write), so that a reader at ts ``t``
gets the definition a TiDB would have used at ``t`` (``version_at``). The JSON
the status API serves (DBInfo, TableInfo, DDL history jobs) comes from the
TiDB codec's models (``cdcflow.plugins.sources.tikv.tidb.schema`` and
``.ddl_job``), so the playground serves exactly what the TiKV source parses.

Ids (schemas, tables, jobs) come from one allocator, as in TiDB's meta.
Thread-safe through the cluster lock the catalog is given.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.tikv.tidb.ddl_job import DDLJob as TiDBJob
from cdcflow.plugins.sources.tikv.tidb.ddl_job import JobState
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, Flag
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBColumn, TiDBDatabase, TiDBIndex, TiDBTable

__all__ = ["Catalog", "Column", "DDLJob", "Database", "TableDef"]


@dataclass(frozen=True)
class Column:
    id: int
    name: str
    ft: FieldType
    default: Any = None
    origin_default: Any = None
    comment: str = ""


@dataclass(frozen=True)
class TableDef:
    """One version of a table. ``columns`` in offset order; the first is the int primary key."""

    id: int
    name: str
    columns: tuple[Column, ...]
    valid_from: int = 0  # TSO from which this version is in force
    update_timestamp: int = 0
    schema_version: int = 0
    #: High-water mark of column ids: ids are never reused, even after DROP COLUMN
    #: (rows written before still carry the dropped id).
    col_id_high: int = 0
    #: The table is gone from ``valid_from`` on (DROP TABLE, or the old id of a TRUNCATE).
    dropped: bool = False
    #: Physical ids of a ``PARTITION BY HASH (pk)`` table's partitions, in partition order;
    #: empty for a table whose rows live under its own id.
    partitions: tuple[int, ...] = ()

    @property
    def pk(self) -> Column:
        return self.columns[0]

    def physical_id(self, handle: int) -> int:
        """The id whose key range holds the row of ``handle`` (TiDB's HASH partitioning: pk mod n)."""
        return self.partitions[handle % len(self.partitions)] if self.partitions else self.id

    @property
    def physical_ids(self) -> tuple[int, ...]:
        return self.partitions or (self.id,)

    @property
    def max_col_id(self) -> int:
        return max(self.col_id_high, *(c.id for c in self.columns))

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise PlaygroundError(f"table {self.name} has no column {name!r}")


@dataclass(frozen=True)
class Database:
    id: int
    name: str


@dataclass(frozen=True)
class DDLJob:
    id: int
    type: int  # ActionType
    schema_id: int
    schema_name: str
    table_id: int
    table_name: str
    query: str
    start_ts: int  # of the transaction that made the schema live (wrote the done job)
    commit_ts: int  # of that transaction: the DDL's exact commit ts
    schema_version: int
    table: TableDef | None
    finished_ts: int = 0  # start ts of the later transaction that moved the job to history


@dataclass
class Catalog:
    lock: threading.RLock = field(default_factory=threading.RLock)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(100))
    databases: dict[str, Database] = field(default_factory=dict)
    _tables: dict[int, list[TableDef]] = field(default_factory=dict)  # id -> versions, oldest first
    _table_db: dict[int, str] = field(default_factory=dict)
    jobs: list[DDLJob] = field(default_factory=list)
    schema_version: int = 0

    def alloc_id(self) -> int:
        with self.lock:
            return next(self._ids)

    def add_database(self, name: str) -> Database:
        with self.lock:
            db = self.databases.get(name) or Database(self.alloc_id(), name)
            self.databases[name] = db
            return db

    def put_table(self, db: str, table: TableDef) -> TableDef:
        """Record a new version of ``table`` (valid from ``table.valid_from``)."""
        with self.lock:
            self.schema_version += 1
            table = replace(table, schema_version=self.schema_version)
            self._tables.setdefault(table.id, []).append(table)
            self._table_db[table.id] = db
            return table

    def record_job(self, job: DDLJob) -> None:
        with self.lock:
            self.jobs.append(job)

    # -- lookups ---------------------------------------------------------------------------------

    def tables(self, db: str, ts: int | None = None) -> list[TableDef]:
        with self.lock:
            ids = [tid for tid, name in self._table_db.items() if name == db]
            found = [self.version_at(tid, ts) for tid in ids]
            return [t for t in found if t is not None]

    def version_at(self, table_id: int, ts: int | None = None) -> TableDef | None:
        """The version in force at ``ts`` (the latest if None); None if the table did not exist yet
        or was dropped by then."""
        with self.lock:
            versions = self._tables.get(table_id, [])
            valid = [v for v in versions if ts is None or v.valid_from <= ts]
            return valid[-1] if valid and not valid[-1].dropped else None

    def find(self, db: str, table: str, ts: int | None = None) -> TableDef:
        with self.lock:
            for t in self.tables(db, ts):
                if t.name.lower() == table.lower():
                    return t
        raise PlaygroundError(f"table {db}.{table} does not exist in the playground (at ts {ts})")

    def db_of(self, table_id: int) -> Database:
        with self.lock:
            return self.databases[self._table_db[table_id]]

    # -- JSON as TiDB's status API serves it (through the TiDB codec's models) ----------------

    @staticmethod
    def tidb_database(db: Database) -> TiDBDatabase:
        return TiDBDatabase(db.id, db.name)

    @staticmethod
    def tidb_table(table: TableDef) -> TiDBTable:
        """The codec's TableInfo model of ``table`` (what TiDB would serve for it)."""
        columns = tuple(
            TiDBColumn(
                c.id,
                c.name,
                offset,
                c.ft,
                origin_default=c.origin_default,
                default=c.default,
                raw={"comment": c.comment, "default_is_expr": False, "default_bit": None},
            )
            for offset, c in enumerate(table.columns)
        )
        primary = TiDBIndex(1, "PRIMARY", ((table.pk.name, 0),), unique=True, primary=True)
        raw = {
            "auto_id_cache": 0,
            "auto_rand_id": 0,
            "common_handle_version": 0,
            # The high-water mark: ids of dropped columns are not reused.
            "max_col_id": table.max_col_id,
            "max_fk_id": 0,
            "max_cst_id": 0,
            "max_shard_row_id_bits": 0,
            "auto_random_bits": 0,
            "auto_random_range_bits": 0,
            "pre_split_regions": 0,
            "compression": "",
            "is_columnar": False,
            "policy_ref_info": None,
            "stats_options": None,
            "exchange_partition_info": None,
            "ttl_info": None,
            "revision": table.schema_version,
        }
        if table.partitions:
            raw["partition"] = _hash_partition_json(table)
        return TiDBTable(
            table.id,
            table.name,
            columns,
            (primary,),
            pk_is_handle=bool(table.pk.ft.flag & Flag.PRI_KEY),
            partition_ids=table.partitions,
            update_timestamp=table.update_timestamp,
            raw=raw,
        )

    @classmethod
    def db_json(cls, db: Database) -> dict[str, Any]:
        return cls.tidb_database(db).to_json()

    @classmethod
    def table_json(cls, table: TableDef) -> dict[str, Any]:
        return cls.tidb_table(table).to_json()

    def tidb_job(self, job: DDLJob, state: int, finished_ts: int) -> TiDBJob:
        """The codec's model of ``job`` in ``state`` (done in the job table, synced in history)."""
        return TiDBJob(
            id=job.id,
            type=job.type,
            schema_id=job.schema_id,
            table_id=job.table_id,
            state=state,
            query=job.query,
            schema_name=job.schema_name,
            table_name=job.table_name,
            schema_version=job.schema_version,
            table_info=None if job.table is None else self.tidb_table(job.table),
            start_ts=job.start_ts,
            finished_ts=finished_ts,
            raw={"seq_num": job.id, "charset": "utf8mb4", "collate": "utf8mb4_bin", "priority": 0},
        )

    def job_json(self, job: DDLJob) -> dict[str, Any]:
        return self.tidb_job(job, JobState.SYNCED, job.finished_ts).to_json()

    def history_json(self, limit: int, start_job_id: int | None) -> list[dict[str, Any]]:
        """Jobs newest first (ids <= ``start_job_id`` when given), at most ``limit``."""
        with self.lock:
            jobs: Sequence[DDLJob] = sorted(self.jobs, key=lambda j: j.id, reverse=True)
            if start_job_id is not None:
                jobs = [j for j in jobs if j.id <= start_job_id]
            return [self.job_json(j) for j in jobs[:limit]]


def _hash_partition_json(table: TableDef) -> dict[str, Any]:
    """TiDB's PartitionInfo of ``PARTITION BY HASH (pk) PARTITIONS n`` (model.PartitionType 2)."""
    return {
        "type": 2,
        "expr": f"`{table.pk.name}`",
        "columns": None,
        "enable": True,
        "is_empty_columns": False,
        "num": len(table.partitions),
        "definitions": [
            {"id": pid, "name": {"O": f"p{i}", "L": f"p{i}"}, "less_than": None, "in_values": None, "comment": ""}
            for i, pid in enumerate(table.partitions)
        ],
        "adding_definitions": None,
        "dropping_definitions": None,
        "states": None,
        "num_of_partitions_has_been_dropped": 0,
    }
