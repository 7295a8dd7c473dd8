"""The Spark sink follows column DDL on local Spark: ADD (with typed origin defaults), DROP,
RENAME, MODIFY COLUMN, at the DDL's place among the rows, and across a crash mid-batch.

Rows and DDL carry upstream schemas as the tikv source gives them (``RowChange.schema``,
``DDLEvent.schema_after`` with :attr:`ColumnInfo.origin_default`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.data.events import ColumnInfo, DDLEvent, RowChange, TableName, TableSchema
from cdcflow.core.errors import DDLBlockedError, Retryable
from cdcflow.core.testing import ListSource, SimulatedCrash, delete, drive, insert, update
from cdcflow.plugins.sinks.spark import SparkSink, SparkSinkConfig, Storage, read_snapshot
from tests.integration.plugins.sinks.test_spark_sink import CrashingSparkSink

pytestmark = pytest.mark.integration

N = ColumnInfo.NULLABLE
ID = ColumnInfo("id", 8, ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY, "bigint", False, 0)
ADD_COLUMN, DROP_COLUMN, MODIFY_COLUMN, RENAME_TABLE, MULTI = 5, 6, 12, 14, 61


def table(name: str) -> TableName:
    return insert("shop", name, {}, commit_ts=1).table


def col(name: str, code: int, default: Any = None, flags: int = N) -> ColumnInfo:
    return ColumnInfo(name, code, flags, "", bool(flags & N), default)


class Upstream:
    """One upstream table: its schema over time, its rows, and the events a source would yield."""

    def __init__(self, name: str, *columns: ColumnInfo, keyed: bool = True) -> None:
        self.table = table(name)
        self.id_column = ID if keyed else col("id", 8)
        self.schema = TableSchema(self.table, (self.id_column, *columns), 1)
        self.rows: dict[int, dict[str, Any]] = {}
        self.events: list[Any] = []
        self.ts = 100

    def _next(self, ts: int | None) -> int:
        self.ts = ts if ts is not None else self.ts + 10
        return self.ts

    def _row(self, change: RowChange, key: int) -> RowChange:
        return dataclasses.replace(change, schema=self.schema, key=b"%d" % key)

    def insert(self, row: Mapping[str, Any], ts: int | None = None) -> None:
        self.rows[row["id"]] = dict(row)
        change = insert("shop", self.table.table, row, commit_ts=self._next(ts))
        self.events.append(self._row(change, row["id"]))

    def update(self, key: int, ts: int | None = None, **values: Any) -> None:
        before = self.rows[key]
        self.rows[key] = after = {**before, **values}
        change = update("shop", self.table.table, before, after, commit_ts=self._next(ts))
        self.events.append(self._row(change, key))

    def delete(self, key: int) -> None:
        change = delete("shop", self.table.table, self.rows.pop(key), commit_ts=self._next(None))
        self.events.append(self._row(change, key))

    def ddl(
        self,
        query: str,
        action: int,
        columns: Iterable[ColumnInfo],
        *,
        renames: Mapping[str, str] = {},
        cast: Mapping[str, Callable[[Any], Any]] = {},
        ts: int | None = None,
    ) -> int:
        """A DDL giving the table ``columns`` (after ``id``); existing rows follow as the upstream's do."""
        self.schema = TableSchema(self.table, (self.id_column, *columns), self.schema.version + 1)
        for key, old in self.rows.items():
            row = {renames.get(k, k): cast.get(k, lambda v: v)(v) for k, v in old.items()}
            self.rows[key] = {c.name: row.get(c.name, c.origin_default) for c in self.schema.columns}
        ts = self._next(ts)
        self.events.append(DDLEvent(ts, query, self.table, action, self.schema))
        return ts

    def rename(self, new_name: str, ts: int | None = None) -> int:
        """RENAME TABLE: the same table (id, rows, columns) under ``new_name`` from here on."""
        old = self.table
        self.table = dataclasses.replace(old, table=new_name)
        self.schema = TableSchema(self.table, self.schema.columns, self.schema.version + 1)
        ts = self._next(ts)
        query = f"RENAME TABLE `shop`.`{old.table}` TO `shop`.`{new_name}`"
        self.events.append(DDLEvent(ts, query, self.table, RENAME_TABLE, self.schema, renamed_from=old))
        return ts

    def resolve(self) -> None:
        self.events.append(ListSource.resolved(self._next(None)))


def sink(root: Path, **options: Any) -> SparkSink:
    return SparkSink(SparkSinkConfig(uri=f"spark://{root}", **options))


def run(root: Path, *upstreams: Upstream, **options: Any) -> None:
    events = sorted((e for u in upstreams for e in u.events), key=_ts)
    asyncio.run(drive(ListSource.of(events), [sink(root, **options)]))


def _ts(event: Any) -> int:
    return int(getattr(event, "commit_ts", None) or event.ts)


def snapshot(spark: Any, root: Path, name: str) -> Any:
    frame = read_snapshot(spark, Storage(spark, str(root)), f"{root}/shop/{name}/snapshot")
    assert frame is not None
    return frame


def snapshot_rows(spark: Any, root: Path, name: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r.asDict() for r in snapshot(spark, root, name).collect()}


def versions(root: Path, name: str) -> list[str]:
    return sorted(p.name for p in (root / "shop" / name / "snapshot").iterdir() if (p / "_COMMITTED").exists())


# One column of each kind, added with an origin default; the value Spark reads back.
TYPED_DEFAULTS = [
    (col("price", 246, decimal.Decimal("1.50")), decimal.Decimal("1.5000000000")),
    (col("born", 10, dt.date(2020, 2, 29)), dt.date(2020, 2, 29)),
    (col("seen", 12, dt.datetime(2020, 1, 2, 3, 4, 5, 600000)), dt.datetime(2020, 1, 2, 3, 4, 5, 600000)),
    (col("stamp", 7, dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.UTC)), None),  # read back in the reader's zone
    (col("note", 15, "it's n/a"), "it's n/a"),
    (col("small", 1, -7), -7),
    (col("big", 8, 2**64 - 1, N | ColumnInfo.UNSIGNED), decimal.Decimal(2**64 - 1)),
    (col("span", 11, -dt.timedelta(hours=1, seconds=30)), "-1 day, 22:59:30"),
    (col("raw", 252, b"\x00\xff'"), b"\x00\xff'"),
    (col("ratio", 5, 0.1), 0.1),
    (col("nothing", 15), None),
    (col("zero", 3, 0, 0), 0),  # NOT NULL without a default: the type's zero value
]


def test_add_column_gives_existing_rows_the_typed_origin_default(spark: Any, tmp_path: Path) -> None:
    up = Upstream("items", col("name", 15))
    for i in range(1, 5):
        up.insert({"id": i, "name": f"n{i}"})
    up.resolve()
    added = [c for c, _ in TYPED_DEFAULTS]
    up.ddl("ALTER TABLE `shop`.`items` ADD COLUMN ... /* several */", MULTI, [col("name", 15), *added])
    up.update(1, name="m1")  # rewritten after the DDL: its image carries the defaults itself
    up.insert({"id": 5, "name": "n5", **{c.name: c.origin_default for c in added}})
    up.resolve()
    run(tmp_path, up)

    frame = snapshot(spark, tmp_path, "items")
    assert frame.columns == ["id", "name", *[c.name for c in added]]
    rows = snapshot_rows(spark, tmp_path, "items")
    assert sorted(rows) == [1, 2, 3, 4, 5]
    for column, want in TYPED_DEFAULTS:
        values = {key: row[column.name] for key, row in rows.items()}
        # Rows the sink has not rewritten read exactly what rewritten and new rows carry.
        assert len(set(values.values())) == 1, (column.name, values)
        if want is not None:
            assert values[2] == want and type(values[2]) is type(want), column.name
    stamp = spark.sql("SELECT 1").selectExpr("CAST('2020-01-02 03:04:05+00:00' AS TIMESTAMP) AS t").first()["t"]
    assert rows[3]["stamp"] == stamp

    # The change log: rows of before the DDL read NULL in the new columns, later ones their values.
    log = spark.read.option("mergeSchema", "true").parquet(str(tmp_path / "shop" / "items" / "changelog"))
    images = {(r["op"], r["after"]["id"]): r["after"].asDict() for r in log.collect()}
    assert images[("insert", 2)]["price"] is None and images[("insert", 2)]["name"] == "n2"
    assert images[("update", 1)]["price"] == decimal.Decimal("1.5000000000")


def test_drop_rename_and_modify_column(spark: Any, tmp_path: Path) -> None:
    up = Upstream("items", col("name", 15), col("qty", 2), col("code", 3), col("gone", 15))
    for i in range(1, 6):
        up.insert({"id": i, "name": f"n{i}", "qty": i * 10, "code": 100 + i, "gone": "x"})
    up.resolve()
    kept = [col("name", 15), col("qty", 2), col("code", 3)]
    up.ddl("ALTER TABLE `shop`.`items` DROP COLUMN `gone`", DROP_COLUMN, kept)
    up.update(5, qty=55)
    up.resolve()
    up.ddl(
        "ALTER TABLE items RENAME COLUMN `name` TO `title`, CHANGE COLUMN qty amount BIGINT",
        MULTI,
        [col("title", 15), col("amount", 8), col("code", 3)],
        renames={"name": "title", "qty": "amount"},
    )
    up.update(4, amount=2**40)
    up.ddl(
        "ALTER TABLE items MODIFY code VARCHAR(10)",
        MODIFY_COLUMN,
        [col("title", 15), col("amount", 8), col("code", 15)],
        cast={"code": str},
    )
    up.update(3, code="c3")
    up.delete(2)
    up.resolve()
    run(tmp_path, up)

    frame = snapshot(spark, tmp_path, "items")
    assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
        ("id", "bigint"),
        ("title", "string"),
        ("amount", "bigint"),
        ("code", "string"),
    ]
    assert snapshot_rows(spark, tmp_path, "items") == up.rows
    assert up.rows[1] == {"id": 1, "title": "n1", "amount": 10, "code": "101"}


def test_rows_at_the_ddl_commit_ts_come_after_it(spark: Any, tmp_path: Path) -> None:
    up = Upstream("items", col("name", 15), col("qty", 3))
    up.insert({"id": 1, "name": "a", "qty": 1})
    up.insert({"id": 2, "name": "b", "qty": 2})
    # Same batch: rows below the DDL use the old names, the row at its commit ts the new ones.
    ts = up.ddl(
        "ALTER TABLE items RENAME COLUMN name TO title, DROP COLUMN qty, ADD COLUMN note varchar(8) DEFAULT 'd'",
        MULTI,
        [col("title", 15), col("note", 15, "d")],
        renames={"name": "title"},
    )
    up.insert({"id": 3, "title": "c", "note": "x"}, ts=ts)
    up.resolve()
    run(tmp_path, up)
    assert snapshot(spark, tmp_path, "items").columns == ["id", "title", "note"]
    assert snapshot_rows(spark, tmp_path, "items") == up.rows
    assert up.rows[1]["note"] == "d" and up.rows[3]["note"] == "x"


def test_a_ddl_without_rows_is_a_version_and_one_that_changes_no_column_is_none(spark: Any, tmp_path: Path) -> None:
    up = Upstream("items", col("name", 15))
    up.insert({"id": 1, "name": "a"})
    up.resolve()
    up.ddl("CREATE INDEX i_name ON items (name)", 7, [col("name", 15)])
    up.resolve()
    up.ddl("ALTER TABLE items ADD COLUMN n int DEFAULT 3", ADD_COLUMN, [col("name", 15), col("n", 3, 3)])
    up.resolve()
    run(tmp_path, up)
    assert len(versions(tmp_path, "items")) == 2  # the rows, then the ADD COLUMN; not the CREATE INDEX
    assert snapshot_rows(spark, tmp_path, "items") == {1: {"id": 1, "name": "a", "n": 3}}

    # A table without a key (a multiset of rows) follows too.
    bag = Upstream("bag", col("v", 15), keyed=False)
    for v in ("a", "a", "b"):
        bag.insert({"id": 0, "v": v})
    bag.resolve()
    bag.ddl("ALTER TABLE bag ADD COLUMN w varchar(4) DEFAULT 'w'", ADD_COLUMN, [col("v", 15), col("w", 15, "w")])
    bag.insert({"id": 1, "v": "c", "w": "x"})
    bag.resolve()
    run(tmp_path / "bag", bag)
    rows = sorted(tuple(r) for r in snapshot(spark, tmp_path / "bag", "bag").collect())
    assert rows == [(0, "a", "w"), (0, "a", "w"), (0, "b", "w"), (1, "c", "x")]


def test_a_type_change_spark_cannot_cast_stops_with_a_clear_error(spark: Any, tmp_path: Path) -> None:
    up = Upstream("items", col("born", 10), col("code", 15))
    up.insert({"id": 1, "born": dt.date(2020, 1, 1), "code": "12"})
    up.resolve()
    run(tmp_path, up)
    before = versions(tmp_path, "items")

    up.ddl("ALTER TABLE items MODIFY born INT", MODIFY_COLUMN, [col("born", 3), col("code", 15)])
    up.resolve()
    with pytest.raises(DDLBlockedError) as caught:
        run(tmp_path, up)
    err = caught.value
    assert "shop.items" in err.message and "'born'" in err.message and "MODIFY born INT" in err.message
    assert "date to bigint" in err.message and "resume the changefeed" in err.message
    assert err.retryable is Retryable.NONE and err.detail["column"] == "born"
    assert versions(tmp_path, "items") == before

    # A cast Spark allows but a value refuses (ANSI): found when the version is written.
    other = Upstream("codes", col("code", 15))
    other.insert({"id": 1, "code": "12"})
    other.insert({"id": 2, "code": "1e3"})
    other.resolve()
    other.ddl("ALTER TABLE codes MODIFY code INT", MODIFY_COLUMN, [col("code", 3)])
    other.resolve()
    with pytest.raises(DDLBlockedError, match=r"'code' from string to bigint: .*CAST_INVALID_INPUT"):
        run(tmp_path / "codes", other)


def test_replay_after_a_crash_mid_batch_across_ddl(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = Upstream("a", col("v", 15)), Upstream("b", col("v", 15))
    for up in (a, b):
        for i in range(1, 4):
            up.insert({"id": i, "v": f"{up.table.table}{i}"})
        up.resolve()
        up.ts = 200
    # One batch ends at ts 210 with both tables' ADD COLUMN; a second at 250 with a DROP.
    for up in (a, b):
        name = up.table.table
        up.update(1, v="u", ts=205)
        up.ddl(f"ALTER TABLE {name} ADD COLUMN w int DEFAULT 7", ADD_COLUMN, [col("v", 15), col("w", 3, 7)], ts=210)
        up.update(2, w=8, ts=215)
        up.ddl(f"ALTER TABLE {name} DROP COLUMN v", DROP_COLUMN, [col("w", 3, 7)], ts=250)
        up.insert({"id": 9, "w": 9}, ts=255)
        up.resolve()
    events = sorted([*a.events, *b.events], key=_ts)
    crashing = CrashingSparkSink(SparkSinkConfig(uri=f"spark://{tmp_path}"))
    crashing.crash_on = 1  # batch 0: the inserts; batch 1: the updates and both ADD COLUMNs
    with pytest.raises(SimulatedCrash):
        asyncio.run(drive(ListSource.of(events), [crashing]))
    done = json.loads((tmp_path / "_cdcflow" / "test" / "checkpoint.json").read_text())
    assert done["batch-id"] == 0
    # One table of the batch was written before the crash, the other not.
    assert sorted(len(versions(tmp_path, name)) for name in ("a", "b")) == [1, 2]

    # The resumed run also fails once between writing a version and committing it.
    commit, failed = Storage.commit_version, []

    def commit_once(self: Storage, snapshot_dir: str, version: str, detail: dict[str, Any]) -> None:
        if not failed and detail["batch-id"] == 2:
            failed.append(snapshot_dir)
            raise OSError("disk full")
        commit(self, snapshot_dir, version, detail)

    monkeypatch.setattr(Storage, "commit_version", commit_once)
    with pytest.raises(Exception, match="disk full"):
        asyncio.run(drive(ListSource.of(events), [sink(tmp_path)], start_ts=done["resolved-ts"], first_batch_id=1))
    # Readers of the table whose commit failed still see the state after the ADD COLUMN (the
    # other table, written at the same time, may have moved on: each table is its own).
    (name,) = (up.table.table for up in (a, b) if failed[0].endswith(f"/shop/{up.table.table}/snapshot"))
    assert set(snapshot(spark, tmp_path, name).columns) == {"id", "v", "w"}
    done = json.loads((tmp_path / "_cdcflow" / "test" / "checkpoint.json").read_text())
    asyncio.run(drive(ListSource.of(events), [sink(tmp_path)], start_ts=done["resolved-ts"], first_batch_id=2))
    for up in (a, b):
        assert snapshot_rows(spark, tmp_path, up.table.table) == up.rows
    assert a.rows == {1: {"id": 1, "w": 7}, 2: {"id": 2, "w": 8}, 3: {"id": 3, "w": 7}, 9: {"id": 9, "w": 9}}

    # Replaying everything (the sink's checkpoint gone) changes nothing.
    (tmp_path / "_cdcflow" / "test" / "checkpoint.json").unlink()
    asyncio.run(drive(ListSource.of(events), [sink(tmp_path)]))
    for up in (a, b):
        assert snapshot_rows(spark, tmp_path, up.table.table) == up.rows
    log = spark.read.option("mergeSchema", "true").parquet(str(tmp_path / "shop" / "a" / "changelog"))
    assert log.count() == sum(1 for e in a.events if isinstance(e, RowChange))


@pytest.mark.parametrize("crash_after", [None, "a", "b"], ids=["no-crash", "crash-after-old", "crash-after-new"])
def test_rename_table_moves_the_snapshot_and_keeps_the_change_logs(
    spark: Any, tmp_path: Path, crash_after: str | None
) -> None:
    up = Upstream("a", col("v", 15))
    for i in range(1, 4):
        up.insert({"id": i, "v": f"a{i}"})
    up.resolve()
    up.ts = 200
    up.update(1, v="before-rename", ts=205)
    up.insert({"id": 4, "v": "a4"}, ts=206)
    up.rename("b", ts=210)  # one batch ends here: the old name's rows below it, then the RENAME
    up.insert({"id": 5, "v": "b5"}, ts=215)
    up.update(2, v="after-rename", ts=216)
    up.resolve()
    events = sorted(up.events, key=_ts)
    if crash_after is None:
        asyncio.run(drive(ListSource.of(events), [sink(tmp_path, mode="both")]))
    else:
        crashing = CrashingSparkSink(SparkSinkConfig(uri=f"spark://{tmp_path}", mode="both"))
        crashing.crash_on, crashing.crash_after = 1, crash_after
        with pytest.raises(SimulatedCrash):
            asyncio.run(drive(ListSource.of(events), [crashing]))
        done = json.loads((tmp_path / "_cdcflow" / "test" / "checkpoint.json").read_text())
        assert done["batch-id"] == 0
        resumed = sink(tmp_path, mode="both")
        asyncio.run(drive(ListSource.of(events), [resumed], start_ts=done["resolved-ts"], first_batch_id=1))

    assert snapshot_rows(spark, tmp_path, "b") == up.rows
    assert up.rows[1]["v"] == "before-rename" and up.rows[2]["v"] == "after-rename" and len(up.rows) == 5
    # The old name is gone upstream: its current version is empty (with the old columns).
    assert snapshot(spark, tmp_path, "a").count() == 0
    assert set(snapshot(spark, tmp_path, "a").columns) == {"id", "v"}
    # Each change stays in the change log of the name it was made under.
    for name, count in (("a", 5), ("b", 2)):
        log = spark.read.parquet(str(tmp_path / "shop" / name / "changelog"))
        assert log.count() == count, name


def test_a_batchs_tables_are_written_from_threads_unless_it_renames_one(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[tuple[int, str, str]] = []
    write_table = SparkSink._write_table

    def recording(self: SparkSink, storage: Any, table: TableName, *args: Any, **kw: Any) -> None:
        batch = args[2]
        threads.append((batch.batch_id, table.table, threading.current_thread().name))
        write_table(self, storage, table, *args, **kw)

    monkeypatch.setattr(SparkSink, "_write_table", recording)
    a, b = Upstream("a", col("v", 15)), Upstream("b", col("v", 15))
    for i in range(1, 4):
        a.insert({"id": i, "v": f"a{i}"}, ts=100 + i)
        b.insert({"id": i, "v": f"b{i}"}, ts=100 + i)
    a.resolve()
    b.update(1, v="b1*", ts=205)
    a.rename("c", ts=210)  # the second batch renames a table: its tables one after the other
    a.resolve()
    run(tmp_path, a, b, mode="both")

    first = {name: thread for batch, name, thread in threads if batch == 0}
    assert set(first) == {"a", "b"} and len(set(first.values())) == 2
    assert all(thread.startswith("cdcflow-spark") for thread in first.values())
    second = {(name, thread) for batch, name, thread in threads if batch == 1}
    assert {name for name, _ in second} == {"b", "c"}
    assert {thread for _, thread in second} == {threading.current_thread().name}
    assert snapshot_rows(spark, tmp_path, "c") == a.rows and snapshot_rows(spark, tmp_path, "b") == b.rows


def test_catalog_tables_follow_the_columns(spark: Any, tmp_path: Path) -> None:
    up = Upstream("items", col("name", 15), col("qty", 2))
    up.insert({"id": 1, "name": "a", "qty": 1})
    up.resolve()
    up.ddl("ALTER TABLE items MODIFY qty BIGINT", MODIFY_COLUMN, [col("name", 15), col("qty", 8)])
    up.ddl("ALTER TABLE items ADD COLUMN note text", ADD_COLUMN, [col("name", 15), col("qty", 8), col("note", 252)])
    up.insert({"id": 2, "name": "b", "qty": 2**40, "note": b"x"})
    up.resolve()
    run(tmp_path, up, catalog_database="cdc_ddl_test")
    try:
        rows = spark.sql("SELECT id, name, qty, note FROM cdc_ddl_test.shop__items ORDER BY id").collect()
        assert [tuple(r) for r in rows] == [(1, "a", 1, None), (2, "b", 2**40, b"x")]
        log = spark.sql("SELECT after.id, after.qty, after.note FROM cdc_ddl_test.shop__items__changelog")
        assert sorted(tuple(r) for r in log.collect()) == [(1, 1, None), (2, 2**40, b"x")]
    finally:
        spark.sql("DROP DATABASE cdc_ddl_test CASCADE")
