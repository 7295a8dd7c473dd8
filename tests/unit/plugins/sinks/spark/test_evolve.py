"""Column DDL plans of the Spark sink: renames from the statement, the plan from the schema, literals."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from cdcflow.core.data.events import ColumnInfo, DDLEvent, TableName, TableSchema
from cdcflow.core.testing import insert
from cdcflow.plugins.sinks.spark.evolve import TargetColumn, column_plan, cut_at_ddl, renamed_columns, sql_literal
from cdcflow.plugins.sinks.spark.merge import alter_sql

T = TableName("shop", "items", 7)
N = ColumnInfo.NULLABLE


def ddl(query: str, *columns: ColumnInfo) -> DDLEvent:
    return DDLEvent(50, query, T, 0, TableSchema(T, columns, 2))


@pytest.mark.parametrize(
    ("query", "renames"),
    [
        ("ALTER TABLE t RENAME COLUMN a TO b", [("a", "b")]),
        ("alter table `s`.`t` rename column `we``ird` to `new name`", [("we`ird", "new name")]),
        ("ALTER TABLE t CHANGE COLUMN qty amount BIGINT NOT NULL DEFAULT '0'", [("qty", "amount")]),
        ("ALTER TABLE t CHANGE qty qty BIGINT", []),  # the same name: a type change only
        ("ALTER TABLE t ADD COLUMN c INT, RENAME COLUMN a TO b, CHANGE d e DECIMAL(10, 2)", [("a", "b"), ("d", "e")]),
        ("ALTER TABLE t RENAME TO t2", []),
        ("ALTER TABLE t RENAME INDEX i TO j", []),
        ("ALTER TABLE t ADD COLUMN `change` INT COMMENT 'RENAME COLUMN x TO y'", []),
        ("ALTER TABLE t /* RENAME COLUMN a TO b */ ADD COLUMN c INT", []),
        ("ALTER TABLE t MODIFY c VARCHAR(10)", []),
    ],
)
def test_renames_named_by_the_statement(query: str, renames: list[tuple[str, str]]) -> None:
    assert renamed_columns(query) == renames


def test_plan_adds_drops_renames_and_casts_by_name() -> None:
    current = [("id", "bigint"), ("Name", "string"), ("qty", "int"), ("gone", "string")]
    event = ddl(
        "ALTER TABLE items RENAME COLUMN name TO title, MODIFY qty BIGINT, DROP gone, ADD note TEXT DEFAULT 'x'",
        ColumnInfo("id", 8, ColumnInfo.HANDLE_KEY),
        ColumnInfo("note", 15, N, origin_default="x"),
        ColumnInfo("title", 15, N),
        ColumnInfo("qty", 3, N),
    )
    plan = column_plan(current, event)
    assert plan is not None
    assert plan.columns == (
        TargetColumn("id", "bigint", "id"),
        TargetColumn("note", "string", None, "x"),
        TargetColumn("title", "string", "Name"),
        TargetColumn("qty", "bigint", "qty", cast_from="int"),
    )
    assert plan.dropped == ("gone",)
    assert plan.renamed == (("Name", "title"),)
    assert [c.name for c in plan.added] == ["note"] and [c.name for c in plan.cast] == ["qty"]


def test_plan_is_none_when_the_columns_stay() -> None:
    current = [("id", "bigint"), ("v", "string")]
    same = ddl("CREATE INDEX i ON items (v)", ColumnInfo("id", 8), ColumnInfo("v", 15))
    assert column_plan(current, same) is None
    assert column_plan(current, DDLEvent(50, "TRUNCATE TABLE items", T)) is None  # no schema: nothing to follow
    reordered = ddl("ALTER TABLE items MODIFY v TEXT FIRST", ColumnInfo("v", 15), ColumnInfo("id", 8))
    plan = column_plan(current, reordered)
    assert plan is not None and [c.name for c in plan.columns] == ["v", "id"] and not plan.dropped
    # A rename whose target the schema lacks (the statement failed over, say) is ignored.
    ghost = ddl("ALTER TABLE items RENAME COLUMN v TO w", ColumnInfo("id", 8), ColumnInfo("v", 15))
    assert column_plan(current, ghost) is None


def test_unsigned_bigint_and_unknown_types() -> None:
    event = ddl(
        "ALTER TABLE items ADD COLUMN u BIGINT UNSIGNED DEFAULT 1, ADD COLUMN g GEOMETRY",
        ColumnInfo("u", 8, ColumnInfo.UNSIGNED, origin_default=1),
        ColumnInfo("g", 255),
    )
    plan = column_plan([], event)
    assert plan is not None
    assert [(c.name, c.spark_type) for c in plan.columns] == [("u", "decimal(20,0)"), ("g", "string")]


@pytest.mark.parametrize(
    ("value", "kind", "sql"),
    [
        (None, "bigint", "CAST(NULL AS bigint)"),
        (7, "bigint", "CAST('7' AS bigint)"),
        (2**64 - 1, "decimal(20,0)", "CAST('18446744073709551615' AS decimal(20,0))"),
        (decimal.Decimal("1.50"), "decimal(38,10)", "CAST('1.50' AS decimal(38,10))"),
        (0.1, "double", "CAST('0.1' AS double)"),
        (True, "boolean", "CAST(TRUE AS boolean)"),
        ("it's a \\ test", "string", "CAST('it\\'s a \\\\ test' AS string)"),
        (b"\x00\xff", "binary", "CAST(X'00ff' AS binary)"),
        (b"abc", "string", "CAST('abc' AS string)"),
        (dt.date(2020, 2, 29), "date", "CAST('2020-02-29' AS date)"),
        (dt.datetime(2020, 1, 2, 3, 4, 5, 6), "timestamp_ntz", "CAST('2020-01-02 03:04:05.000006' AS timestamp_ntz)"),
        (
            dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
            "timestamp",
            "CAST('2020-01-02 03:04:05+00:00' AS timestamp)",
        ),
        (-dt.timedelta(hours=1, seconds=30), "string", "CAST('-1 day, 22:59:30' AS string)"),
        ("0000-00-00", "date", "CAST(NULL AS date)"),
        ("0000-00-00 00:00:00", "timestamp_ntz", "CAST(NULL AS timestamp_ntz)"),
        (2, "string", "CAST('2' AS string)"),  # an ENUM's index, as the change records hold it
    ],
)
def test_sql_literals(value: object, kind: str, sql: str) -> None:
    assert sql_literal(value, kind) == sql


def test_alter_statements_for_merge_tables() -> None:
    current = [("id", "bigint"), ("a", "string"), ("qty", "int"), ("old", "string")]
    event = ddl(
        "ALTER TABLE items DROP old, RENAME COLUMN a TO b, MODIFY qty BIGINT, "
        "ADD c DATE DEFAULT '2020-01-01', ADD d INT",
        ColumnInfo("id", 8),
        ColumnInfo("b", 15),
        ColumnInfo("qty", 3),
        ColumnInfo("c", 10, origin_default=dt.date(2020, 1, 1)),
        ColumnInfo("d", 3),
    )
    plan = column_plan(current, event)
    assert plan is not None
    assert alter_sql("cdc.`shop__items`", plan) == [
        "ALTER TABLE cdc.`shop__items` DROP COLUMNS (`old`)",
        "ALTER TABLE cdc.`shop__items` RENAME COLUMN `a` TO `b`",
        "ALTER TABLE cdc.`shop__items` ALTER COLUMN `qty` TYPE bigint",
        "ALTER TABLE cdc.`shop__items` ADD COLUMNS (`c` date)",
        "UPDATE cdc.`shop__items` SET `c` = CAST('2020-01-01' AS date)",
        "ALTER TABLE cdc.`shop__items` ADD COLUMNS (`d` bigint)",
    ]


def test_rows_are_cut_at_each_ddl_commit_ts() -> None:
    rows = [insert("shop", "items", {"id": i}, commit_ts=ts) for i, ts in enumerate((10, 19, 20, 25, 30, 31))]
    first, second = DDLEvent(30, "B", T), DDLEvent(20, "A", T)
    steps = cut_at_ddl(rows, [first, second])
    assert [([r.commit_ts for r in part], event) for part, event in steps] == [
        ([10, 19], second),
        ([20, 25], first),
        ([30, 31], None),
    ]
    assert cut_at_ddl(rows, []) == [(rows, None)]
