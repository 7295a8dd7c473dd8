"""TiDB mode of the tikv source: tables, spans and schemas from TiDB's status API.

The schema store is filled once, on first use, from the status API as of the
first timestamp the source is asked about (the ts of
:meth:`~cdcflow.plugins.sources.tikv.TiKVSource.prepare_mounter`, a feed's
start ts, or now); later
DDL reaches it through the DDL job table writes the mounter decodes, so rows
are always decoded with the schema valid at their ``commit_ts − 1``.

A feed that starts *below* the ts the store was loaded at gets the DDL in
between (the source's DDL tracker re-reads the DDL job spans from its start
ts and applies those jobs at their commit ts). Not guaranteed: its rows
*before* such a DDL decode with the base schema the store was loaded with
(by column id: missing columns take their default), so load the store from
the smallest ts whose rows will be mounted first: the log service does, with
``prepare_mounter``, since after a restart it mounts stored rows from below
the ts its feeds resume from.
"""

from __future__ import annotations

import asyncio

from cdcflow.core.data.events import DDLEvent, Span, TableName, TableSchema, TableSetChange
from cdcflow.plugins.sources.tikv.tidb import ddl_job
from cdcflow.plugins.sources.tikv.tidb.keys import table_record_span
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBMounter
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore, TableVersion
from cdcflow.plugins.sources.tikv.tidb.status_api import StatusAPIClient, TiDBObjectNotFoundError

__all__ = ["TiDBCatalog"]


class TiDBCatalog:
    """Tables of one TiDB cluster and their schemas over time."""

    def __init__(self, status_address: str) -> None:
        self.client = StatusAPIClient(status_address)
        self.schemas = SchemaStore()
        self.loaded_at: int | None = None
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        await self.client.close()

    async def ensure_loaded(self, ts: int) -> None:
        """Load the schema store as of ``ts`` unless it is loaded already."""
        async with self._lock:
            if self.loaded_at is None:
                await self.schemas.load(self.client, ts)
                self.loaded_at = ts

    async def tables(self, ts: int) -> list[TableName]:
        """Every table with rows alive at ``ts`` (logical tables; partitions are in :meth:`spans`)."""
        await self.ensure_loaded(ts)
        out = []
        for version in self.schemas.live_tables(ts):
            table = version.table
            if table is not None and table.has_rows:
                out.append(TableName(version.db_name, table.name, table.id))
        return out

    def spans(self, table: TableName, ts: int | None = None) -> list[Span]:
        """Record spans ``[t{id}_r, t{id}_s)`` of every physical table (partition) of ``table``."""
        if table.partition_id is not None:
            ids: tuple[int, ...] = (table.partition_id,)
        else:
            version = self.schemas.logical_at(table.table_id, ts) if ts is not None else None
            if version is None:
                version = self.schemas.logical_at(table.table_id, 2**63)
            found = version.table.physical_ids() if version is not None and version.table is not None else ()
            ids = found or (table.table_id,)
        return [Span(pid, *table_record_span(pid)) for pid in ids]

    def ddl_concerns(self, ddl: DDLEvent, span: Span) -> bool:
        """Whether ``ddl`` changes the table whose rows ``span`` holds."""
        if ddl.table is None:
            return False
        if ddl.table.table_id == span.table_id:
            return True
        return any(s.table_id == span.table_id for s in self.spans(ddl.table, ddl.commit_ts))

    def table_set_change(self, ddl: DDLEvent) -> TableSetChange | None:
        """How ``ddl`` (applied to the schema store) changes the set of tables with rows, or
        None when it does not: tables dropped, truncated (old id dropped, new id created),
        renamed (old name dropped, new name created) or created, and tables whose partitions
        changed (dropped and created under one name)."""
        old, new = self.schemas.tables_changed_at(ddl.commit_ts)
        dropped = tuple(t for i, (t, ids) in sorted(old.items()) if new.get(i) != (t, ids))
        created = tuple(t for i, (t, ids) in sorted(new.items()) if old.get(i) != (t, ids))
        if not dropped and not created:
            return None
        return TableSetChange(ddl.commit_ts, dropped, created, ddl.query)

    @staticmethod
    def ddl_spans() -> list[Span]:
        """The spans of TiDB's DDL job tables: feed them to see DDL at its exact commit ts."""
        return [Span(0, start, end) for start, end in ddl_job.ddl_spans()]

    async def schema(self, table: TableName, ts: int) -> TableSchema:
        """The schema of ``table`` valid at ``ts``."""
        await self.ensure_loaded(ts)
        physical = table.partition_id if table.partition_id is not None else table.table_id

        def lookup() -> TableVersion | None:
            if table.partition_id is not None:
                return self.schemas.table_at(physical, ts)
            return self.schemas.logical_at(physical, ts)  # a partitioned table: through its partitions

        version = lookup()
        if version is None and not self.schemas.knows(physical):
            await self.schemas.resolve(self.client, physical)
            version = lookup()
        if version is None or version.table is None:
            raise TiDBObjectNotFoundError(
                f"table {table} (id {physical}) has no schema at ts {ts}: it did not exist then or was dropped",
                detail={"table": str(table), "table_id": physical, "ts": ts},
            )
        return version.table.table_schema(version.db_name, physical, version.schema_version)

    def mounter(self) -> TiDBMounter:
        return TiDBMounter(self.schemas)
