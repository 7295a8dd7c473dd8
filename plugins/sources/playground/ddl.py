"""DDL in the playground: schema changes recorded as DDL jobs written to TiKV.

Each DDL writes what TiDB's DDL worker writes, in the format of
:mod:`cdcflow.plugins.sources.tikv.tidb.ddl_job`: first the job row of
``mysql.tidb_ddl_job`` in state *done* — its commit ts is when the new schema
takes effect (``TableDef.valid_from``), the exact DDL commit ts a TiKV reader
learns — then a second transaction deletes that row and inserts the job into
``mysql.tidb_ddl_history`` in state *synced*, with ``binlog.FinishedTS`` = the
second transaction's start ts (later than the schema went live, as in TiDB).
``/ddl/history`` serves the same job. The cluster lock is held throughout, so
no row change commits in between with the wrong schema.
"""

from __future__ import annotations

from dataclasses import replace

from cdcflow.plugins.sources.playground.catalog import Catalog, Column, DDLJob, TableDef
from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.playground.txn import Transaction
from cdcflow.plugins.sources.tikv.tidb.ddl_job import JobState, encode_history_write, encode_job_write
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType
from cdcflow.plugins.sources.tikv.tidb.keys import table_prefix

__all__ = [
    "ACTION_ADD_COLUMN",
    "ACTION_CREATE_TABLE",
    "ACTION_DROP_COLUMN",
    "ACTION_DROP_TABLE",
    "ACTION_RENAME_TABLE",
    "ACTION_TRUNCATE_TABLE",
    "DDLExecutor",
]

ACTION_CREATE_SCHEMA = 1
ACTION_CREATE_TABLE = 3
ACTION_DROP_TABLE = 4
ACTION_ADD_COLUMN = 5
ACTION_DROP_COLUMN = 6
ACTION_TRUNCATE_TABLE = 11
ACTION_RENAME_TABLE = 14


class DDLExecutor:
    def __init__(self, cluster: Cluster, catalog: Catalog) -> None:
        self.cluster, self.catalog = cluster, catalog

    def create_table(
        self, db: str, name: str, columns: list[tuple[str, FieldType]], *, partitions: int = 0
    ) -> TableDef:
        """CREATE TABLE: a new table id, its own region (TiDB splits at new tables), a job.

        ``partitions`` > 0: ``PARTITION BY HASH (pk) PARTITIONS n`` — each partition gets
        an id and a region of its own, and rows live under the partition ids."""
        with self.cluster.lock:
            database = self.catalog.add_database(db)
            table_id = self.catalog.alloc_id()
            cols = tuple(Column(i + 1, n, ft) for i, (n, ft) in enumerate(columns))
            parts = self._new_partitions(partitions)
            self.cluster.split_at_raw(table_prefix(table_id))
            table = TableDef(table_id, name, cols, col_id_high=len(cols), partitions=parts)
            query = create_table_sql(db, name, cols, partitions)
            return self._run(ACTION_CREATE_TABLE, database.id, db, table, query)

    def _new_partitions(self, count: int) -> tuple[int, ...]:
        """Ids (and regions) for ``count`` partitions; called with the cluster lock held."""
        ids = tuple(self.catalog.alloc_id() for _ in range(count))
        for pid in ids:
            self.cluster.split_at_raw(table_prefix(pid))
        return ids

    def add_column(self, db: str, name: str, column: str, ft: FieldType, default: str | None) -> TableDef:
        with self.cluster.lock:
            table = self.catalog.find(db, name)
            col = Column(table.max_col_id + 1, column, ft, default=default, origin_default=default)
            new = replace(table, columns=(*table.columns, col), col_id_high=col.id)
            query = f"ALTER TABLE `{db}`.`{name}` ADD COLUMN `{column}` {ft.sql_type()}"
            if default is not None:  # existing rows read the default: a replaying sink must fill it too
                query += " DEFAULT '" + default.replace("'", "''") + "'"
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

    def drop_table(self, db: str, name: str) -> TableDef:
        """DROP TABLE: the table is gone from the job's commit ts on; the job records its last
        definition, as TiDB's does. Returns that definition, valid from the drop."""
        with self.cluster.lock:
            table = self.catalog.find(db, name)
            query = f"DROP TABLE `{db}`.`{name}`"
            gone = replace(table, dropped=True)
            return self._run(ACTION_DROP_TABLE, self.catalog.databases[db].id, db, table, query, stored=gone)

    def truncate_table(self, db: str, name: str) -> TableDef:
        """TRUNCATE TABLE: the same definition under a new table id (in a region of its own);
        the old id is gone from the job's commit ts on, as in TiDB."""
        with self.cluster.lock:
            old = self.catalog.find(db, name)
            table_id = self.catalog.alloc_id()
            self.cluster.split_at_raw(table_prefix(table_id))
            new = replace(old, id=table_id, partitions=self._new_partitions(len(old.partitions)))
            query = f"TRUNCATE TABLE `{db}`.`{name}`"
            job_table = (old.id, replace(old, dropped=True))
            return self._run(ACTION_TRUNCATE_TABLE, self.catalog.databases[db].id, db, new, query, job_table=job_table)

    def rename_table(self, db: str, name: str, new_name: str) -> TableDef:
        """RENAME TABLE within ``db``: the same table id and rows under ``new_name`` from the
        job's commit ts on; the old name is gone."""
        with self.cluster.lock:
            table = self.catalog.find(db, name)
            if any(t.name.lower() == new_name.lower() for t in self.catalog.tables(db)):
                raise PlaygroundError(f"cannot rename {db}.{name}: table {db}.{new_name} exists")
            query = f"RENAME TABLE `{db}`.`{name}` TO `{db}`.`{new_name}`"
            renamed = replace(table, name=new_name)
            return self._run(ACTION_RENAME_TABLE, self.catalog.databases[db].id, db, renamed, query)

    def _run(
        self,
        action: int,
        schema_id: int,
        db: str,
        table: TableDef,
        query: str,
        *,
        stored: TableDef | None = None,
        job_table: tuple[int, TableDef] | None = None,
    ) -> TableDef:
        """Two transactions, as TiDB's DDL worker does: the job row in state *done* (the
        schema goes live at its commit ts), then the job moved to history (*synced*).

        ``table`` is the TableInfo the job records and the version stored from the
        commit ts, unless ``stored`` says otherwise; ``job_table`` is the job's table id
        when it is not ``table``'s (TRUNCATE: the old id) and that id's version from the
        commit ts."""
        job_id = self.catalog.alloc_id()
        version = self.catalog.schema_version + 1
        live = Transaction(self.cluster)
        job_table_id = job_table[0] if job_table is not None else table.id
        job = DDLJob(job_id, action, schema_id, db, job_table_id, table.name, query, live.start_ts, 0, version, table)
        key, value = encode_job_write(self.catalog.tidb_job(job, JobState.DONE, 0))
        live.put(key, value)
        commit_ts = live.commit()
        if job_table is not None:
            self.catalog.put_table(db, replace(job_table[1], valid_from=commit_ts, update_timestamp=commit_ts))
        kept = stored if stored is not None else table
        result = self.catalog.put_table(db, replace(kept, valid_from=commit_ts, update_timestamp=commit_ts))
        done = replace(job, commit_ts=commit_ts, table=result)
        finish = Transaction(self.cluster)
        finished = replace(done, finished_ts=finish.start_ts)
        history_key, history_value = encode_history_write(
            self.catalog.tidb_job(finished, JobState.SYNCED, finish.start_ts)
        )
        finish.delete(key)
        finish.put(history_key, history_value)
        finish.commit()
        self.catalog.record_job(finished)
        return result


def create_table_sql(db: str, name: str, columns: tuple[Column, ...], partitions: int = 0) -> str:
    """The CREATE TABLE text TiDB would record for the job, so DDL-aware sinks can replay it.

    The first column is the clustered primary key (as every playground table has).
    """
    defs = [f"`{c.name}` {c.ft.sql_type()}{' NOT NULL' if c.ft.not_null else ''}" for c in columns]
    query = f"CREATE TABLE `{db}`.`{name}` ({', '.join(defs)}, PRIMARY KEY (`{columns[0].name}`))"
    if partitions:
        query += f" PARTITION BY HASH (`{columns[0].name}`) PARTITIONS {partitions}"
    return query
