"""The catalog tables the playground serves (as of a timestamp): what the source's queries read."""

from __future__ import annotations

from typing import Any

from cdcflow.plugins.sources.cockroach_playground.store import Store
from cdcflow.plugins.sources.cockroachdb.hlc import HLC

__all__ = ["catalog_relation"]

_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "crdb_internal.tables": [
        ("table_id", "INT8"),
        ("database_name", "STRING"),
        ("schema_name", "STRING"),
        ("name", "STRING"),
        ("state", "STRING"),
        ("mod_time", "TIMESTAMP"),
    ],
    "information_schema.tables": [
        ("table_catalog", "STRING"),
        ("table_schema", "STRING"),
        ("table_name", "STRING"),
        ("table_type", "STRING"),
    ],
    "information_schema.columns": [
        ("table_catalog", "STRING"),
        ("table_schema", "STRING"),
        ("table_name", "STRING"),
        ("column_name", "STRING"),
        ("ordinal_position", "INT8"),
        ("data_type", "STRING"),
        ("crdb_sql_type", "STRING"),
        ("is_nullable", "STRING"),
        ("column_default", "STRING"),
        ("is_hidden", "STRING"),
    ],
    "information_schema.table_constraints": [
        ("table_schema", "STRING"),
        ("table_name", "STRING"),
        ("constraint_name", "STRING"),
        ("constraint_type", "STRING"),
    ],
    "information_schema.key_column_usage": [
        ("table_schema", "STRING"),
        ("table_name", "STRING"),
        ("constraint_name", "STRING"),
        ("column_name", "STRING"),
        ("ordinal_position", "INT8"),
    ],
}


def catalog_relation(
    store: Store, name: str, at: HLC | None
) -> tuple[list[tuple[str, str]], list[dict[str, Any]]] | None:
    """Columns and rows of catalog table ``name`` as of ``at``, or None when it is not one."""
    columns = _COLUMNS.get(name)
    if columns is None:
        return None
    rows: list[dict[str, Any]] = []
    db = store.database
    with store.lock:
        for table in sorted(store.tables.values(), key=lambda t: t.id):
            d = table.descriptor(at)
            if d is None:
                continue
            base = {"table_schema": "public", "table_name": table.name}
            if name == "crdb_internal.tables":
                rows.append(
                    {
                        "table_id": table.id,
                        "database_name": db,
                        "schema_name": "public",
                        "name": table.name,
                        "state": "PUBLIC",
                        "mod_time": None,
                    }
                )
            elif name == "information_schema.tables":
                rows.append({**base, "table_catalog": db, "table_type": "BASE TABLE"})
            elif name == "information_schema.columns":
                for i, c in enumerate(d.columns, 1):
                    rows.append(
                        {
                            **base,
                            "table_catalog": db,
                            "column_name": c.name,
                            "ordinal_position": i,
                            "data_type": c.type.split("(")[0].lower(),
                            "crdb_sql_type": c.type,
                            "is_nullable": "YES" if c.nullable else "NO",
                            "column_default": None if c.default is None else str(c.default),
                            "is_hidden": "NO",
                        }
                    )
            elif name == "information_schema.table_constraints":
                rows.append({**base, "constraint_name": f"{table.name}_pkey", "constraint_type": "PRIMARY KEY"})
            else:
                for i, k in enumerate(d.pk, 1):
                    rows.append(
                        {**base, "constraint_name": f"{table.name}_pkey", "column_name": k, "ordinal_position": i}
                    )
    return columns, rows
