"""Snapshot mode through ``MERGE INTO``, for catalogs whose tables support it.

Plain Parquet tables do not (Spark raises "MERGE INTO TABLE is not supported
temporarily"); Delta Lake and Iceberg tables do, when their jars and SQL
extensions are in the session. With ``table-format: merge`` — or ``auto`` and
an existing catalog table whose provider is ``delta`` or ``iceberg`` — the
sink deduplicates the batch to the latest change per key and merges it in
one statement, which those formats commit atomically (readers see the table
before or after the batch). Merging the same batch twice gives the same
table, so a replay is harmless.

Column DDL (see :mod:`.evolve`) becomes ``ALTER TABLE`` statements on the
catalog table: DROP COLUMNS, RENAME COLUMN, ALTER COLUMN … TYPE, ADD COLUMNS
and, for a new column with an origin default, an ``UPDATE`` that gives it to
the existing rows. Each statement commits on its own: a reader may see the
table between two of them, and a crash between ADD COLUMNS and its UPDATE
leaves NULL in the rows that existed then. Whether a statement is allowed is
the format's business (Delta Lake needs column mapping for DROP and RENAME
COLUMN and type widening for type changes; Iceberg allows only widening type
changes); a refused one stops the sink with
:class:`~cdcflow.core.errors.DDLBlockedError` saying which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdcflow.core.data.events import TableName
from cdcflow.core.errors import DDLBlockedError, Retryable, Severity
from cdcflow.plugins.sinks.spark.evolve import ColumnPlan, sql_literal

__all__ = ["MERGE_PROVIDERS", "alter_sql", "alter_table", "merge_sql", "provider_of"]

#: Table providers known to support MERGE INTO.
MERGE_PROVIDERS = frozenset({"delta", "iceberg"})


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def provider_of(spark: Any, table: str) -> str | None:
    """The catalog table's provider (``parquet``, ``delta`` …), None when it does not exist."""
    if not spark.catalog.tableExists(table.replace("`", "")):
        return None
    for row in spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect():
        if str(row[0]).strip().lower() == "provider":
            return str(row[1]).strip().lower()
    return ""


def merge_sql(target: str, source_view: str, keys: Sequence[str], columns: Sequence[str]) -> str:
    """MERGE of the deduplicated changes in ``source_view`` (with ``_deleted``) into ``target``."""
    on = " AND ".join(f"t.{_q(k)} <=> s.{_q(k)}" for k in keys)
    sets = ", ".join(f"t.{_q(c)} = s.{_q(c)}" for c in columns)
    cols = ", ".join(_q(c) for c in columns)
    values = ", ".join(f"s.{_q(c)}" for c in columns)
    return (
        f"MERGE INTO {target} AS t USING {_q(source_view)} AS s ON {on} "
        "WHEN MATCHED AND s._deleted THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND NOT s._deleted THEN INSERT ({cols}) VALUES ({values})"
    )


def alter_sql(target: str, plan: ColumnPlan) -> list[str]:
    """The statements that give the catalog table ``target`` the columns of ``plan``."""
    statements = []
    if plan.dropped:
        statements.append(f"ALTER TABLE {target} DROP COLUMNS ({', '.join(_q(c) for c in plan.dropped)})")
    statements += [f"ALTER TABLE {target} RENAME COLUMN {_q(old)} TO {_q(new)}" for old, new in plan.renamed]
    statements += [f"ALTER TABLE {target} ALTER COLUMN {_q(c.name)} TYPE {c.spark_type}" for c in plan.cast]
    for column in plan.added:
        statements.append(f"ALTER TABLE {target} ADD COLUMNS ({_q(column.name)} {column.spark_type})")
        if column.default is not None:
            value = sql_literal(column.default, column.spark_type)
            statements.append(f"UPDATE {target} SET {_q(column.name)} = {value}")
    return statements


def alter_table(spark: Any, target: str, plan: ColumnPlan, table: TableName) -> None:
    """Run :func:`alter_sql`; a statement the table's format refuses raises DDLBlockedError."""
    for statement in alter_sql(target, plan):
        try:
            spark.sql(statement)
        except Exception as exc:
            if not type(exc).__module__.startswith(("py4j", "pyspark.errors")):
                raise
            raise DDLBlockedError(
                f"Spark sink: catalog table {target} refused {statement!r} for DDL {plan.ddl.query!r} of {table}: "
                f"{str(exc).splitlines()[0]}. Enable what the format needs (Delta Lake: "
                "'delta.columnMapping.mode' = 'name' for DROP/RENAME COLUMN, 'delta.enableTypeWidening' = 'true' "
                "for type changes), or write the table with table-format: versioned; then resume the changefeed",
                detail={"table": str(table), "statement": statement, "ddl": plan.ddl.query},
                severity=Severity.ERROR,
                retryable=Retryable.NONE,
            ) from exc
