"""Snapshot mode through ``MERGE INTO``, for catalogs whose tables support it.

Plain Parquet tables do not (Spark raises "MERGE INTO TABLE is not supported
temporarily"); Delta Lake and Iceberg tables do, when their jars and SQL
extensions are in the session. With ``table-format: merge`` — or ``auto`` and
an existing catalog table whose provider is ``delta`` or ``iceberg`` — the
sink deduplicates the batch to the latest change per key and merges it in
one statement, which those formats commit atomically (readers see the table
before or after the batch). Merging the same batch twice gives the same
table, so a replay is harmless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["MERGE_PROVIDERS", "merge_sql", "provider_of"]

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
