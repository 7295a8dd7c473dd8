"""Rows and schemas for the transform tests."""

from __future__ import annotations

from typing import Any

import pytest

from cdcflow.core.data.events import ColumnInfo, OpType, RowChange, TableName, TableSchema
from cdcflow.core.data.types import TypeCode

KEY = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY


def schema(
    db: str = "shop", table: str = "orders", table_id: int = 10, extra: tuple[ColumnInfo, ...] = ()
) -> TableSchema:
    return TableSchema(
        TableName(db, table, table_id),
        (
            ColumnInfo("id", int(TypeCode.LONGLONG), KEY, "bigint", False),
            ColumnInfo("amount", int(TypeCode.LONG), ColumnInfo.NULLABLE, "int"),
            ColumnInfo("email", int(TypeCode.VARCHAR), ColumnInfo.NULLABLE, "varchar(64)"),
            *extra,
        ),
    )


def row(
    s: TableSchema, op: str, after: dict[str, Any] | None, before: dict[str, Any] | None = None, ts: int = 100
) -> RowChange:
    return RowChange(
        s.table, OpType(op), ts, ts - 1, after, before, s, key=str((after or before or {}).get("id")).encode()
    )


@pytest.fixture(autouse=True)
def _salt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDCFLOW_MASK_SALT", "pepper")
