"""DDL in the playground: schema changes recorded as DDL jobs written to TiKV.

Each DDL is one transaction that writes the finished job (JSON) as a row of
TiDB's ``tidb_ddl_job`` table; its commit ts is when the new schema takes
effect (``TableDef.valid_from``), which is how a TiKV reader learns the exact
DDL commit ts. The status API shows the job in ``/ddl/history`` with
``binlog.FinishedTS`` = the job transaction's start ts (earlier than the
commit ts, as in TiDB — see reference §0). The cluster lock is held across
the job's transaction and the catalog update, so no row change commits in
between with the wrong schema.
"""

from __future__ import annotations

import json
from dataclasses import replace

from cdcflow.plugins.sources.playground.catalog import Catalog, Column, DDLJob, TableDef
from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.playground.txn import Transaction
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, TypeCode
from cdcflow.plugins.sources.tikv.tidb.keys import record_key, table_prefix
from cdcflow.plugins.sources.tikv.tidb.rowcodec import encode_row

__all__ = ["ACTION_ADD_COLUMN", "ACTION_CREATE_TABLE", "ACTION_DROP_COLUMN", "DDL_JOB_TABLE_ID", "DDLExecutor"]

ACTION_CREATE_SCHEMA = 1
ACTION_CREATE_TABLE = 3
ACTION_ADD_COLUMN = 5
ACTION_DROP_COLUMN = 6

#: ``mysql.tidb_ddl_job``: MaxInt48 - 1.
DDL_JOB_TABLE_ID = (1 << 48) - 1 - 1
# tidb_ddl_job(job_id bigint primary key, reorg int, schema_ids text, table_ids text,
#              job_meta longblob, type int, processing int): column ids 1..7.
_JOB_COLUMNS = {
    3: FieldType(int(TypeCode.BLOB), charset="utf8mb4", collate="utf8mb4_bin"),
    4: FieldType(int(TypeCode.BLOB), charset="utf8mb4", collate="utf8mb4_bin"),
    5: FieldType(int(TypeCode.LONG_BLOB), charset="binary", collate="binary"),
    6: FieldType(int(TypeCode.LONG)),
    7: FieldType(int(TypeCode.LONG)),
}


class DDLExecutor:
    def __init__(self, cluster: Cluster, catalog: Catalog) -> None:
        self.cluster, self.catalog = cluster, catalog

    def create_table(self, db: str, name: str, columns: list[tuple[str, FieldType]]) -> TableDef:
        """CREATE TABLE: a new table id, its own region (TiDB splits at new tables), a job."""
        with self.cluster.lock:
            database = self.catalog.add_database(db)
            table_id = self.catalog.alloc_id()
            cols = tuple(Column(i + 1, n, ft) for i, (n, ft) in enumerate(columns))
            self.cluster.split_at_raw(table_prefix(table_id))
            table = TableDef(table_id, name, cols)
            query = f"CREATE TABLE `{db}`.`{name}` (...)"
            return self._run(ACTION_CREATE_TABLE, database.id, db, table, query)

    def add_column(self, db: str, name: str, column: str, ft: FieldType, default: str | None) -> TableDef:
        with self.cluster.lock:
            table = self.catalog.find(db, name)
            col = Column(table.max_col_id + 1, column, ft, default=default, origin_default=default)
            new = replace(table, columns=(*table.columns, col), col_id_high=col.id)
            query = f"ALTER TABLE `{db}`.`{name}` ADD COLUMN `{column}` {ft.sql_type()}"
            return self._run(ACTION_ADD_COLUMN, self.catalog.databases[db].id, db, new, query)

    def drop_column(self, db: str, name: str, column: str) -> TableDef:
        with self.cluster.lock:
            table = self.catalog.find(db, name)
            if column == table.pk.name or all(c.name != column for c in table.columns):
                raise PlaygroundError(f"cannot drop column {column!r} of {db}.{name}")
            kept = tuple(c for c in table.columns if c.name != column)
            new = replace(table, columns=kept, col_id_high=table.max_col_id)
            query = f"ALTER TABLE `{db}`.`{name}` DROP COLUMN `{column}`"
            return self._run(ACTION_DROP_COLUMN, self.catalog.databases[db].id, db, new, query)

    def _run(self, action: int, schema_id: int, db: str, table: TableDef, query: str) -> TableDef:
        job_id = self.catalog.alloc_id()
        txn = Transaction(self.cluster)
        job = DDLJob(job_id, action, schema_id, db, table.id, table.name, query, txn.start_ts, 0, 0, table)
        # The job row carries the TableInfo after the DDL; the schema version is known up front.
        version = self.catalog.schema_version + 1
        staged = replace(job, schema_version=version, table=replace(table, schema_version=version))
        txn.put(record_key(DDL_JOB_TABLE_ID, job_id), self._job_value(staged, schema_id, table.id))
        commit_ts = txn.commit()
        stored = self.catalog.put_table(db, replace(table, valid_from=commit_ts, update_timestamp=commit_ts))
        self.catalog.record_job(replace(staged, commit_ts=commit_ts, table=stored))
        return stored

    def _job_value(self, job: DDLJob, schema_id: int, table_id: int) -> bytes:
        meta = json.dumps(self.catalog.job_json(job)).encode()
        values = {3: str(schema_id), 4: str(table_id), 5: meta, 6: job.type, 7: 0}
        return encode_row({cid: (_JOB_COLUMNS[cid], values[cid]) for cid in _JOB_COLUMNS})
