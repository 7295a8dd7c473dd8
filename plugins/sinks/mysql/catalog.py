"""What the downstream says about its tables: columns and unique keys.

The sink asks the downstream (information_schema) rather than trusting the
upstream schema alone: WHERE clauses and conflict detection must match the
indexes that actually exist where the rows land. Results are cached per
table and forgotten after any DDL.
"""

from __future__ import annotations

from typing import Any

import pymysql

from cdcflow.plugins.sinks.mysql.dml import TableMeta
from cdcflow.plugins.sinks.mysql.errors import DownstreamRejectedError

__all__ = ["load_table_meta"]


def load_table_meta(conn: pymysql.connections.Connection[Any], schema: str, table: str) -> TableMeta:
    """Columns, handle key and unique keys of ``schema.table`` downstream."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME, IS_NULLABLE, EXTRA FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (schema, table),
        )
        columns = cur.fetchall()
        cur.execute(
            "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS"
            " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND NON_UNIQUE = 0"
            " ORDER BY INDEX_NAME = 'PRIMARY' DESC, INDEX_NAME, SEQ_IN_INDEX",
            (schema, table),
        )
        index_rows = cur.fetchall()
    conn.commit()
    if not columns:
        raise DownstreamRejectedError(
            f"MySQL sink: table `{schema}`.`{table}` does not exist downstream; create it there or replicate "
            "its CREATE TABLE DDL",
            detail={"schema": schema, "table": table},
        )
    nullable = {name: is_nullable == "YES" for name, is_nullable, _ in columns}
    generated = frozenset(name for name, _, extra in columns if "GENERATED" in str(extra).upper())
    indexes: dict[str, list[str]] = {}
    for index_name, column in index_rows:
        indexes.setdefault(index_name, []).append(column)
    unique_keys = tuple(tuple(cols) for cols in indexes.values())
    handle = next((key for key in unique_keys if not any(nullable.get(c, True) for c in key)), ())
    return TableMeta(
        schema=schema,
        table=table,
        columns=tuple(name for name, _, _ in columns),
        handle=handle,
        unique_keys=unique_keys,
        generated=generated,
    )
