"""Spark sink: URI options, column types and the records of a batch (no Spark needed)."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from cdcflow.core.data.events import ColumnInfo, TableSchema, tso_from_ms
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.testing import delete, insert, update
from cdcflow.plugins.sinks.spark import SparkSink, SparkSinkConfig
from cdcflow.plugins.sinks.spark.config import describe_issues, path_of
from cdcflow.plugins.sinks.spark.frames import (
    change_records,
    changelog_records,
    decimal_ints,
    delta_records,
    image_columns,
)


def test_uri_names_the_root_directory() -> None:
    cfg = SparkSinkConfig(**SparkSink.options_from_uri("spark:///lake/cdc?mode=snapshot&keep-versions=2"))
    assert (path_of(cfg), cfg.mode, cfg.keep_versions) == ("/lake/cdc", "snapshot", 2)
    assert path_of(SparkSinkConfig(uri="spark://./data/x")) == "./data/x"
    assert path_of(SparkSinkConfig(uri="spark://")) == ""  # the warehouse directory
    with pytest.raises(ConfigInvalidError):
        path_of(SparkSinkConfig(uri="spark://host/dir"))
    assert dict(describe_issues(SparkSinkConfig(key_columns={"orders": ["id"]}))).keys() == {"key-columns"}


def test_types_from_values_and_from_the_upstream_schema() -> None:
    rows = [
        insert("s", "t", {"a": 1, "b": None, "c": decimal.Decimal("1.25"), "d": dt.datetime(2026, 1, 1)}, commit_ts=5),
        insert("s", "t", {"a": 2, "b": "x", "e": True, "f": b"\x00"}, commit_ts=6),
    ]
    assert image_columns(rows) == {
        "a": "bigint",
        "b": "string",
        "c": "decimal(38,10)",
        "d": "timestamp_ntz",
        "e": "boolean",
        "f": "binary",
    }
    schema = TableSchema(
        rows[0].table, (ColumnInfo("a", 3, ColumnInfo.UNSIGNED), ColumnInfo("b", 8, ColumnInfo.UNSIGNED))
    )
    typed = insert("s", "t", {"a": 1}, commit_ts=5)
    typed = type(typed)(typed.table, typed.op, 5, 4, {"a": 1, "b": 2**64 - 1}, None, schema)
    # INT UNSIGNED fits in bigint; only BIGINT UNSIGNED needs a decimal.
    assert image_columns([typed]) == {"a": "bigint", "b": "decimal(20,0)"}
    (coerced,) = decimal_ints([typed], image_columns([typed]))
    assert coerced.after == {"a": 1, "b": decimal.Decimal(2**64 - 1)}


def test_decimal_ints_converts_only_the_ints_of_decimal_columns() -> None:
    types = {"id": "decimal(20,0)", "price": "decimal(38,10)", "name": "string"}
    plain = insert("s", "t", {"id": decimal.Decimal(1), "price": None, "name": "x"}, commit_ts=5)
    both = update(
        "s", "t", {"id": 2, "price": decimal.Decimal("1.5"), "name": "y"}, {"id": 2, "price": 3, "name": 4}, commit_ts=6
    )
    gone = delete("s", "t", {"id": 3, "price": None, "name": "z"}, commit_ts=7)
    out = decimal_ints([plain, both, gone], types)
    assert out[0] is plain  # nothing to convert: the row itself
    assert out[1].before == {"id": decimal.Decimal(2), "price": decimal.Decimal("1.5"), "name": "y"}
    assert out[1].after == {"id": decimal.Decimal(2), "price": decimal.Decimal(3), "name": 4}
    assert (out[1].table, out[1].op, out[1].commit_ts, out[1].start_ts) == (
        both.table, both.op, both.commit_ts, both.start_ts
    )  # fmt: skip
    assert out[2].before == {"id": decimal.Decimal(3), "price": None, "name": "z"} and out[2].after is None
    assert type(both.after["price"]) is int  # the input is left alone
    assert decimal_ints([both], {"name": "string"}) == [both]


def test_changelog_records_carry_both_images_and_their_order() -> None:
    ts = tso_from_ms(1_767_225_600_000)  # 2026-01-01T00:00:00Z
    rows = [
        insert("s", "t", {"id": 1, "v": "a"}, commit_ts=ts),
        update("s", "t", {"id": 1, "v": "a"}, {"id": 1, "v": "b"}, commit_ts=ts + 1),
        delete("s", "t", {"id": 1, "v": "b"}, commit_ts=ts + 2),
    ]
    records = changelog_records(rows, ["id", "v"], batch_id=7)
    assert [r[0] for r in records] == ["insert", "update", "delete"]
    assert records[1][4:6] == ((1, "a"), (1, "b"))
    assert records[0][6] == dt.date(2026, 1, 1) and {r[7] for r in records} == {7}
    assert [r[3] for r in records] == [0, 1, 2]


def test_records_write_time_values_as_text_and_byte_arrays_as_bytes() -> None:
    """Cells are converted only where a value needs it; a column an image lacks is NULL."""
    price = decimal.Decimal("1.50")
    row = update(
        "s", "t", {"id": 1, "t": dt.timedelta(hours=-1, seconds=-30), "p": price},
        {"id": 1, "t": None, "b": bytearray(b"\x00\xff"), "p": price}, commit_ts=9,
    )  # fmt: skip
    (record,) = changelog_records([row], ["id", "t", "b", "p"], batch_id=1)
    assert record[4] == (1, "-1 day, 22:59:30", None, price)
    assert record[5] == (1, None, b"\x00\xff", price) and type(record[5][2]) is bytes
    assert change_records([row], ["id", "t"], ["id"]) == [(1, None, False, 9, 1)]
    assert delta_records([row], ["t", "b"]) == [("-1 day, 22:59:30", None, -1), (None, b"\x00\xff", 1)]


def test_change_records_split_a_key_move_into_delete_then_upsert() -> None:
    rows = [update("s", "t", {"id": 1, "v": "a"}, {"id": 2, "v": "a"}, commit_ts=9)]
    assert change_records(rows, ["id", "v"], ["id"]) == [(1, "a", True, 9, 0), (2, "a", False, 9, 1)]
    assert delta_records(rows, ["id", "v"]) == [(1, "a", -1), (2, "a", 1)]


def test_merge_statement_deletes_updates_and_inserts_by_null_safe_key() -> None:
    from cdcflow.plugins.sinks.spark.merge import merge_sql

    sql = merge_sql("cdc.`shop__orders`", "v", ["id"], ["id", "na`me"])
    assert sql == (
        "MERGE INTO cdc.`shop__orders` AS t USING `v` AS s ON t.`id` <=> s.`id` "
        "WHEN MATCHED AND s._deleted THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET t.`id` = s.`id`, t.`na``me` = s.`na``me` "
        "WHEN NOT MATCHED AND NOT s._deleted THEN INSERT (`id`, `na``me`) VALUES (s.`id`, s.`na``me`)"
    )
    issues = dict(describe_issues(SparkSinkConfig(table_format="merge")))
    assert "table-format" in issues
