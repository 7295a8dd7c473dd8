"""The catalog queries of the ``cockroachdb`` source: tables, columns, keys, time, GC TTL."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import psycopg

from cdcflow.core.data.events import TableName, TableSchema
from cdcflow.plugins.sources.cockroachdb.hlc import HLC
from cdcflow.plugins.sources.cockroachdb.options import quote_ident, quote_literal
from cdcflow.plugins.sources.cockroachdb.types import column_info

__all__ = ["Catalog"]

_TABLES = (
    "SELECT table_id, name FROM crdb_internal.tables{aost} WHERE database_name = current_database() "
    "AND schema_name = %s AND state = 'PUBLIC' ORDER BY table_id"
)
_COLUMNS = (
    "SELECT column_name, crdb_sql_type, is_nullable FROM information_schema.columns{aost} "
    "WHERE table_schema = %s AND table_name = %s AND is_hidden = 'NO' ORDER BY ordinal_position"
)
_PK_NAME = (
    "SELECT constraint_name FROM information_schema.table_constraints{aost} "
    "WHERE table_schema = %s AND table_name = %s AND constraint_type = 'PRIMARY KEY'"
)
_PK_COLUMNS = (
    "SELECT column_name FROM information_schema.key_column_usage{aost} "
    "WHERE table_schema = %s AND table_name = %s AND constraint_name = %s ORDER BY ordinal_position"
)
_GC_TTL = re.compile(r"gc\.ttlseconds\s*=\s*(\d+)")


class Catalog:
    """Catalog reads over one connection (opened on first use, reopened after an error)."""

    def __init__(self, dsn: str, *, sql_schema: str, connect_timeout: float) -> None:
        self._dsn = dsn
        self._schema = sql_schema
        self._timeout = connect_timeout
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.database = ""

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, connect_timeout=int(self._timeout)
            )
            cur = await self._conn.execute("SELECT current_database()")
            row = await cur.fetchone()
            self.database = str(row[0]) if row else ""
        return self._conn

    async def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = await self._connection()
        try:
            cur = await conn.execute(sql, params or None)
            return list(await cur.fetchall())
        except psycopg.OperationalError:
            await self.close()
            raise

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def tables(self, at: HLC | None = None) -> list[TableName]:
        """The tables of the SQL schema as of ``at`` (``AS OF SYSTEM TIME``; None: now), with descriptor ids."""
        aost = f" AS OF SYSTEM TIME {quote_literal(str(at))}" if at is not None else ""
        rows = await self._query(_TABLES.format(aost=aost), (self._schema,))
        return [TableName(self.database, str(name), int(table_id)) for table_id, name in rows]

    async def schema(self, table: TableName, at: HLC | None) -> TableSchema:
        """The columns and primary key of ``table`` as of ``at`` (``AS OF SYSTEM TIME``; None: now)."""
        aost = f" AS OF SYSTEM TIME {quote_literal(str(at))}" if at is not None else ""
        names = (self._schema, table.table)
        columns = await self._query(_COLUMNS.format(aost=aost), names)
        if not columns:
            raise LookupError(f"CockroachDB has no table {self._schema}.{table.table} at {at}")
        pk_rows = await self._query(_PK_NAME.format(aost=aost), names)
        pk: list[str] = []
        if pk_rows:
            pk = [str(r[0]) for r in await self._query(_PK_COLUMNS.format(aost=aost), (*names, pk_rows[0][0]))]
        infos = tuple(
            column_info(str(name), str(sql_type), nullable=str(nullable).upper() == "YES", primary_key=name in pk)
            for name, sql_type, nullable in columns
        )
        version = at.commit_ts if at is not None else 0
        return TableSchema(table, infos, version)

    async def now(self) -> HLC:
        """``cluster_logical_timestamp()``."""
        rows = await self._query("SELECT cluster_logical_timestamp()")
        return HLC.parse(str(rows[0][0]))

    async def gc_ttl_seconds(self, table: str) -> int | None:
        """The table's ``gc.ttlseconds`` from its zone configuration, None when it cannot be read."""
        try:
            rows = await self._query(
                f"SHOW ZONE CONFIGURATION FROM TABLE {quote_ident(self._schema)}.{quote_ident(table)}"
            )
        except psycopg.Error:
            return None
        for row in rows:
            match = _GC_TTL.search(" ".join(str(v) for v in row))
            if match:
                return int(match.group(1))
        return None
