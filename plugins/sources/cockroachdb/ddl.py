"""The DDL a column change becomes: MySQL-dialect text (the MySQL sink runs it) from two schemas."""

from __future__ import annotations

from cdcflow.core.data.events import TableSchema

__all__ = ["column_ddl", "create_table_ddl", "drop_table_ddl"]


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def column_ddl(old: TableSchema, new: TableSchema) -> list[str]:
    """``ALTER TABLE … DROP COLUMN`` / ``ADD COLUMN`` statements turning ``old`` into ``new``.

    CockroachDB does not stream DDL text; the source compares the catalog
    before and after the change. A column whose type changed is dropped and
    added again (sinks then see its new type). Empty when nothing differs.
    """
    target = f"{_q(new.table.schema)}.{_q(new.table.table)}"
    before = {c.name: c for c in old.columns}
    after = {c.name: c for c in new.columns}
    queries: list[str] = []
    for name, col in before.items():
        if name not in after or after[name].sql_type != col.sql_type:
            queries.append(f"ALTER TABLE {target} DROP COLUMN {_q(name)}")
    for name, col in after.items():
        if name not in before or before[name].sql_type != col.sql_type:
            null = "" if col.nullable else " NOT NULL"
            queries.append(f"ALTER TABLE {target} ADD COLUMN {_q(name)} {col.sql_type}{null}")
    return queries


def _target(schema: TableSchema) -> str:
    return f"{_q(schema.table.schema)}.{_q(schema.table.table)}"


def create_table_ddl(schema: TableSchema) -> str:
    """``CREATE TABLE`` of a table created while a changefeed runs, from its catalog schema."""
    columns = [f"{_q(c.name)} {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in schema.columns]
    keys = [_q(c.name) for c in schema.columns if c.flags & c.PRIMARY_KEY]
    if keys:
        columns.append(f"PRIMARY KEY ({', '.join(keys)})")
    return f"CREATE TABLE {_target(schema)} ({', '.join(columns)})"


def drop_table_ddl(table_schema: str, table: str) -> str:
    """``DROP TABLE`` of a table dropped while a changefeed runs."""
    return f"DROP TABLE {_q(table_schema)}.{_q(table)}"
