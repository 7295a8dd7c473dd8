"""Feed rows → RowChange: a pure function of the rows and the catalog schemas."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.events import ColumnInfo, OpType, TableName, TableSchema
from cdcflow.core.errors import CdcflowError
from cdcflow.plugins.sources.cockroachdb.convert import FeedRow, Resolved, convert_row, convert_rows
from cdcflow.plugins.sources.cockroachdb.ddl import column_ddl
from cdcflow.plugins.sources.cockroachdb.hlc import HLC
from cdcflow.plugins.sources.cockroachdb.types import column_info, map_type

TABLE = TableName("shop", "products", 105)
SCHEMA = TableSchema(
    TABLE,
    (
        column_info("id", "INT8", nullable=False, primary_key=True),
        column_info("price", "DECIMAL(10,2)", nullable=False, primary_key=False),
        column_info("weight", "FLOAT8", nullable=True, primary_key=False),
        column_info("updated_at", "TIMESTAMPTZ", nullable=False, primary_key=False),
        column_info("image", "BYTES", nullable=True, primary_key=False),
        column_info("profile", "JSONB", nullable=True, primary_key=False),
        column_info("vip", "BOOL", nullable=True, primary_key=False),
        column_info("placed_on", "DATE", nullable=True, primary_key=False),
    ),
)
TS = HLC(1_700_000_000_123_456_789, 2)


def _row(after: object, before: object = None) -> FeedRow:
    value = {"after": after, "before": before, "updated": str(TS), "mvcc_timestamp": str(TS)}
    return FeedRow("products", b"[1]", json.dumps(value).encode())


AFTER = {
    "id": 1,
    "price": 12.50,
    "weight": 1.5,
    "updated_at": "2024-05-01T12:34:56.123456Z",
    "image": "\\x0102ff",
    "profile": {"level": 2.5},
    "vip": True,
    "placed_on": "2024-06-20",
}


def test_insert_is_typed_from_the_catalog() -> None:
    change = convert_row(_row(AFTER), {"products": SCHEMA})
    assert not isinstance(change, Resolved)
    assert change.op is OpType.INSERT
    assert (change.commit_ts, change.start_ts) == (TS.commit_ts, TS.start_ts)
    assert change.after == {
        "id": 1,
        "price": Decimal("12.5"),
        "weight": 1.5,
        "updated_at": dt.datetime(2024, 5, 1, 12, 34, 56, 123456),
        "image": b"\x01\x02\xff",
        "profile": '{"level":2.5}',
        "vip": 1,
        "placed_on": dt.date(2024, 6, 20),
    }
    assert change.schema is SCHEMA and change.table == TABLE and change.key == b"[1]"


def test_decimal_keeps_its_digits() -> None:
    row = FeedRow("products", b"[1]", b'{"after": {"id": 1, "price": 0.10}, "before": null, "updated": "5.0000000000"}')
    change = convert_row(row, {"products": SCHEMA})
    assert not isinstance(change, Resolved)
    assert change.after is not None and str(change.after["price"]) == "0.10"


def test_update_delete_and_resolved() -> None:
    rows = [
        _row({**AFTER, "weight": 2.0}, AFTER),
        _row(None, AFTER),
        FeedRow(None, None, b'{"resolved": "1700000000123456789.0000000003"}'),
    ]
    update, delete, resolved = convert_rows(rows, {"products": SCHEMA})
    assert not isinstance(update, Resolved) and update.op is OpType.UPDATE and update.before is not None
    assert not isinstance(delete, Resolved) and delete.op is OpType.DELETE and delete.after is None
    assert resolved == Resolved(HLC(1_700_000_000_123_456_789, 3))


def test_column_missing_from_the_row_reads_null_and_unknown_fields_are_dropped() -> None:
    change = convert_row(_row({"id": 1, "dropped_col": 5}), {"products": SCHEMA})
    assert not isinstance(change, Resolved) and change.after is not None
    assert change.after["weight"] is None and "dropped_col" not in change.after


def test_unknown_table_is_an_error() -> None:
    with pytest.raises(CdcflowError):
        convert_row(FeedRow("nope", b"[1]", b'{"after": {}}'), {"products": SCHEMA})


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1), st.text(), st.booleans())
def test_values_round_trip(i: int, s: str, b: bool) -> None:
    schema = TableSchema(
        TABLE,
        (
            column_info("i", "INT8", nullable=False, primary_key=True),
            column_info("s", "STRING", nullable=True, primary_key=False),
            column_info("b", "BOOL", nullable=True, primary_key=False),
        ),
    )
    value = json.dumps({"after": {"i": i, "s": s, "b": b}, "before": None, "updated": "1.0000000000"})
    change = convert_row(FeedRow("products", b"", value.encode()), {"products": schema})
    assert not isinstance(change, Resolved)
    assert change.after == {"i": i, "s": s, "b": int(b)}


@pytest.mark.parametrize(
    ("crdb", "code", "sql"),
    [
        ("INT8", 8, "bigint"),
        ("INT4", 3, "int"),
        ("INT2", 2, "smallint"),
        ("FLOAT8", 5, "double"),
        ("DECIMAL(12,2)", 246, "decimal(12,2)"),
        ("STRING(64)", 15, "varchar(64)"),
        ("STRING", 15, "text"),
        ("BYTES", 252, "longblob"),
        ("BOOL", 1, "tinyint(1)"),
        ("DATE", 10, "date"),
        ("TIMESTAMP", 12, "datetime(6)"),
        ("TIMESTAMPTZ", 7, "timestamp(6)"),
        ("JSONB", 245, "json"),
        ("UUID", 15, "char(36)"),
        ("INT8[]", 15, "text"),
    ],
)
def test_type_mapping(crdb: str, code: int, sql: str) -> None:
    mapped = map_type(crdb)
    assert (mapped.type_code, mapped.sql_type) == (code, sql)


def test_key_flags() -> None:
    col = column_info("id", "INT8", nullable=False, primary_key=True)
    assert col.is_handle_key and col.flags & ColumnInfo.PRIMARY_KEY and not col.nullable


def test_column_ddl() -> None:
    new = TableSchema(TABLE, (*SCHEMA.columns[1:], column_info("note", "STRING(10)", nullable=True, primary_key=False)))
    assert column_ddl(SCHEMA, new) == [
        "ALTER TABLE `shop`.`products` DROP COLUMN `id`",
        "ALTER TABLE `shop`.`products` ADD COLUMN `note` varchar(10)",
    ]
