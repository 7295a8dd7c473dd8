"""The built-in transforms on rows, schemas and DDL, without Spark."""

from __future__ import annotations

import hashlib
import pickle

import pytest

from cdcflow.core.data.events import ColumnInfo, DDLEvent, OpType, TableName
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.transform import TransformChain, TransformStep
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.plugins.transforms.filter import FilterConfig, FilterTransform
from cdcflow.plugins.transforms.mask import MaskConfig, MaskTransform
from cdcflow.plugins.transforms.project import ProjectConfig, ProjectTransform
from cdcflow.plugins.transforms.python import PythonConfig, PythonTransform
from cdcflow.plugins.transforms.route import RouteConfig, RouteTransform
from tests.unit.plugins.transforms.conftest import row, schema


def chain(*transforms, scopes=None):
    scopes = scopes or [["*.*"]] * len(transforms)
    steps = [
        TransformStep(f"transforms[{i}]", t, TableFilter(s))
        for i, (t, s) in enumerate(zip(transforms, scopes, strict=True))
    ]
    return TransformChain(steps)


# -- filter -----------------------------------------------------------------------------


def test_filter_keeps_matching_inserts_and_deletes():
    s = schema()
    f = FilterTransform(FilterConfig(where="amount > 100 AND email LIKE '%@example.com'"))
    rows = [
        row(s, "insert", {"id": 1, "amount": 150, "email": "a@example.com"}),
        row(s, "insert", {"id": 2, "amount": 50, "email": "b@example.com"}),
        row(s, "insert", {"id": 3, "amount": None, "email": "c@example.com"}),  # NULL: not TRUE
        row(s, "delete", None, {"id": 4, "amount": 500, "email": "d@example.com"}),
        row(s, "delete", None, {"id": 5, "amount": 5, "email": "e@example.com"}),
    ]
    assert [r.image()["id"] for r in f.apply(rows)] == [1, 4]


def test_an_update_entering_the_filter_is_an_insert_and_one_leaving_it_a_delete():
    s = schema()
    f = FilterTransform(FilterConfig(where="amount >= 100"))
    stays = row(s, "update", {"id": 1, "amount": 200, "email": None}, {"id": 1, "amount": 150, "email": None})
    enters = row(s, "update", {"id": 2, "amount": 200, "email": None}, {"id": 2, "amount": 10, "email": None})
    leaves = row(s, "update", {"id": 3, "amount": 1, "email": None}, {"id": 3, "amount": 150, "email": None})
    outside = row(s, "update", {"id": 4, "amount": 1, "email": None}, {"id": 4, "amount": 2, "email": None})
    out = f.apply([stays, enters, leaves, outside])
    assert [(r.op, r.image()["id"]) for r in out] == [(OpType.UPDATE, 1), (OpType.INSERT, 2), (OpType.DELETE, 3)]
    assert out[1].before is None and out[1].after == enters.after
    assert out[2].after is None and out[2].before == leaves.before


def test_filter_sees_op_commit_ts_and_the_old_image():
    s = schema()
    f = FilterTransform(
        FilterConfig(
            where="_op != 'delete' AND _commit_ts > 50 AND (_before.amount IS NULL OR _before.amount <> amount)"
        )
    )
    rows = [
        row(s, "insert", {"id": 1, "amount": 1, "email": None}, ts=60),
        row(s, "insert", {"id": 2, "amount": 1, "email": None}, ts=40),
        row(s, "update", {"id": 3, "amount": 1, "email": "x"}, {"id": 3, "amount": 1, "email": "y"}, ts=60),
        row(s, "delete", None, {"id": 4, "amount": 1, "email": None}, ts=60),
    ]
    assert [r.image()["id"] for r in f.apply(rows)] == [1]


def test_an_update_without_old_image_that_fails_the_filter_deletes_its_key():
    s = schema()
    f = FilterTransform(FilterConfig(where="amount > 0"))
    out = f.apply([row(s, "update", {"id": 7, "amount": 0, "email": None})])
    assert [(r.op, r.before) for r in out] == [(OpType.DELETE, {"id": 7, "amount": 0, "email": None})]


def test_filter_rejects_an_unknown_column_for_the_schema():
    f = FilterTransform(FilterConfig(where="amout > 1"))
    with pytest.raises(ConfigInvalidError, match="unknown column 'amout'") as info:
        f.schema(schema())
    assert info.value.detail["field"] == "where"


# -- project ----------------------------------------------------------------------------


def test_project_keeps_drops_renames_and_computes():
    s = schema()
    p = ProjectTransform(
        ProjectConfig(
            drop=["email"],
            rename={"amount": "total"},
            computed=[{"name": "big", "expr": "amount * 2 > 100", "type": "tinyint"},
                      {"name": "label", "expr": "concat('order-', id)", "type": "varchar(32)"}],
        )
    )  # fmt: skip
    out = p.apply([row(s, "update", {"id": 1, "amount": 60, "email": "a"}, {"id": 1, "amount": 10, "email": "a"})])
    assert out[0].after == {"id": 1, "total": 60, "big": 1, "label": "order-1"}
    assert out[0].before == {"id": 1, "total": 10, "big": 0, "label": "order-1"}
    assert [c.name for c in out[0].schema.columns] == ["id", "total", "big", "label"]
    assert out[0].schema.columns[0].is_handle_key
    assert out[0].schema.columns[3].sql_type == "varchar(32)"


def test_project_column_list_always_keeps_the_key_and_refuses_to_drop_it():
    s = schema()
    p = ProjectTransform(ProjectConfig(columns=["amount"]))
    assert [c.name for c in p.schema(s).columns] == ["id", "amount"]
    with pytest.raises(ConfigInvalidError, match="'id' is a key column"):
        ProjectTransform(ProjectConfig(drop=["id"])).schema(s)
    assert ProjectTransform(ProjectConfig(rename={"nope": "x"})).schema(s) == s  # absent here: ignored
    with pytest.raises(ConfigInvalidError, match=r"computed\.0\.expr: unknown column 'nope'"):
        ProjectTransform(ProjectConfig(computed=[{"name": "x", "expr": "nope + 1"}])).schema(s)


# -- mask -------------------------------------------------------------------------------


def test_mask_hashes_with_the_salt_stably_across_batches_and_pickling():
    s = schema()
    m = MaskTransform(MaskConfig(columns=["email"]))
    first = m.apply([row(s, "insert", {"id": 1, "amount": 1, "email": "a@x.org"})])
    again = pickle.loads(pickle.dumps(m)).apply([row(s, "insert", {"id": 2, "amount": 1, "email": "a@x.org"})])
    want = hashlib.sha256(b"pepper\0a@x.org").hexdigest()
    assert first[0].after["email"] == again[0].after["email"] == want
    assert m.apply([row(s, "insert", {"id": 3, "amount": 1, "email": None})])[0].after["email"] is None
    column = first[0].schema.columns[2]
    assert (column.sql_type, column.type_code) == ("char(64)", TypeCode.VARCHAR)


def test_mask_null_and_its_limits(monkeypatch):
    s = schema()
    m = MaskTransform(MaskConfig(columns=["amount"], method="null"))
    out = m.apply([row(s, "delete", None, {"id": 1, "amount": 5, "email": "e"})])
    assert out[0].before == {"id": 1, "amount": None, "email": "e"}
    with pytest.raises(ConfigInvalidError, match="key column"):
        MaskTransform(MaskConfig(columns=["id"], method="null")).schema(s)
    monkeypatch.delenv("CDCFLOW_MASK_SALT")
    with pytest.raises(ConfigInvalidError, match="CDCFLOW_MASK_SALT"):
        MaskTransform(MaskConfig(columns=["email"]))


# -- route ------------------------------------------------------------------------------


def test_route_merges_shards_with_a_source_column():
    r = RouteTransform(
        RouteConfig(routes=[{"source": r"shard_(\d+)\.users", "target": "all.users"}], source_column="_src")
    )
    one, two, other = schema("shard_1", "users", 1), schema("shard_2", "users", 2), schema("shop", "orders", 3)
    out = r.apply([row(one, "insert", {"id": 1, "amount": 1, "email": None}), row(other, "insert", {"id": 2})])
    # Rows of every shard go to one and the same table (sinks keep state per TableName).
    out += r.apply([row(two, "insert", {"id": 1, "amount": 1, "email": None})])
    assert out[0].table == out[2].table == TableName("all", "users") and out[0].after["_src"] == "shard_1.users"
    assert out[0].schema.table == out[2].schema.table == TableName("all", "users")
    assert out[0].schema.columns[-1].name == "_src"
    assert out[1].table == other.table
    assert r.merges(one.table) and r.table(two.table) == TableName("all", "users")


def test_routing_tables_of_different_columns_into_one_is_refused():
    r = RouteTransform(RouteConfig(routes=[{"source": r"shard_(\d+)\.users", "target": "all.users"}]))
    extra = (ColumnInfo("note", int(TypeCode.VARCHAR), 0, "text"),)
    problems = chain(r).check([schema("shard_1", "users", 1), schema("shard_2", "users", 2, extra)])
    assert len(problems) == 1 and problems[0][1] == "routes"
    assert "shard_1.users and shard_2.users both go to all.users with different columns" in problems[0][2]
    assert chain(r).check([schema("shard_1", "users", 1), schema("shard_2", "users", 2)]) == []


def test_route_without_merging_renames_a_schema():
    r = RouteTransform(RouteConfig(routes=[{"source": r"shop\.(\w+)", "target": r"lake.\1"}]))
    assert not r.merges(TableName("shop", "orders")) and r.table(TableName("shop", "orders", 7)) == TableName(
        "lake", "orders", 7
    )


# -- python -----------------------------------------------------------------------------


def test_python_transform_over_arrow_batches(tmp_path, monkeypatch):
    (tmp_path / "my_udf.py").write_text(
        "import pyarrow as pa, pyarrow.compute as pc\n"
        "def double(batch):\n"
        "    keep = pc.not_equal(batch.column('_op'), 'delete')\n"
        "    batch = batch.filter(keep)\n"
        "    i = batch.schema.get_field_index('amount')\n"
        "    batch = batch.set_column(i, 'amount', pc.multiply(batch.column(i), 2))\n"
        "    return batch.append_column('flag', pa.array([True] * batch.num_rows, pa.bool_()))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    s = schema()
    p = PythonTransform(PythonConfig(function="my_udf:double"))
    out = p.apply(
        [
            row(s, "insert", {"id": 1, "amount": 2, "email": None}),
            row(s, "update", {"id": 2, "amount": 3, "email": "x"}, {"id": 2, "amount": 1, "email": "x"}),
            row(s, "delete", None, {"id": 3, "amount": 1, "email": None}),
        ]
    )
    assert [r.after for r in out] == [{"id": 1, "amount": 4, "email": None, "flag": True},
                                      {"id": 2, "amount": 6, "email": "x", "flag": True}]  # fmt: skip
    assert out[1].before == {"id": 2, "amount": 2, "email": "x", "flag": True}
    assert out[0].schema.columns[-1].sql_type == "tinyint(1)"
    errors = PythonTransform.check_config(PythonConfig(function="no_such_module:f"), None)  # type: ignore[arg-type]
    assert errors and errors[0][0] == "function" and "cannot import no_such_module" in errors[0][1]


# -- the chain: scopes, order, DDL ------------------------------------------------------------


def test_the_chain_applies_in_order_within_scopes_and_keeps_row_order():
    orders, users = schema("shop", "orders", 1), schema("shop", "users", 2)
    c = chain(
        FilterTransform(FilterConfig(where="amount > 1")),
        RouteTransform(RouteConfig(routes=[{"source": r"shop\.(\w+)", "target": r"lake.\1"}])),
        MaskTransform(MaskConfig(columns=["email"])),
        scopes=[["shop.orders"], ["*.*"], ["lake.users"]],
    )
    rows = [
        row(orders, "insert", {"id": 1, "amount": 1, "email": "a"}),
        row(users, "insert", {"id": 2, "amount": 1, "email": "b"}),
        row(orders, "insert", {"id": 3, "amount": 5, "email": "c"}),
    ]
    out = pickle.loads(pickle.dumps(c)).apply(rows)
    assert [(str(r.table), r.after["id"]) for r in out] == [("lake.users", 2), ("lake.orders", 3)]
    assert out[0].after["email"] == hashlib.sha256(b"pepper\0b").hexdigest() and out[1].after["email"] == "c"


def test_ddl_passes_through_the_transforms():
    c = chain(
        ProjectTransform(ProjectConfig(drop=["note"], rename={"amount": "total"})),
        MaskTransform(MaskConfig(columns=["email"])),
        RouteTransform(RouteConfig(routes=[{"source": r"shop\.(\w+)", "target": r"lake.\1"}])),
    )
    note = ColumnInfo("note", int(TypeCode.VARCHAR), 0, "varchar(20)")
    s = schema(extra=(note,))
    create = DDLEvent(100, "CREATE TABLE `shop`.`orders` (`id` bigint, ...)", s.table, 3, s)
    out = c.ddl(create)
    assert out is not None and out.table.schema == "lake"
    assert out.query == (
        "CREATE TABLE `lake`.`orders` (`id` bigint NOT NULL, `total` int, `email` char(64), PRIMARY KEY (`id`))"
    )
    assert [col.name for col in out.schema_after.columns] == ["id", "total", "email"]
    add_dropped = DDLEvent(101, "ALTER TABLE `shop`.`orders` ADD COLUMN `note` varchar(20)", s.table, 5, s)
    assert c.ddl(add_dropped) is None
    s2 = schema(extra=(ColumnInfo("amount2", int(TypeCode.LONG), 0, "int"),))
    add = DDLEvent(102, "ALTER TABLE `shop`.`orders` ADD COLUMN `amount2` int DEFAULT '0'", s2.table, 5, s2)
    assert c.ddl(add).query == "ALTER TABLE `lake`.`orders` ADD COLUMN `amount2` int DEFAULT '0'"
    rename_col = DDLEvent(103, "ALTER TABLE `shop`.`orders` MODIFY COLUMN `amount` bigint", s.table, 0, s)
    assert c.ddl(rename_col).query == "ALTER TABLE `lake`.`orders` MODIFY COLUMN `total` bigint"
    s3 = schema(extra=(ColumnInfo("email2", int(TypeCode.VARCHAR), 0, "varchar(9)"),))
    masked_c = chain(MaskTransform(MaskConfig(columns=["email2"])))
    add_masked = DDLEvent(
        104, "ALTER TABLE `shop`.`orders` ADD COLUMN `email2` varchar(9) DEFAULT 'x'", s3.table, 5, s3
    )
    assert masked_c.ddl(add_masked).query == "ALTER TABLE `shop`.`orders` ADD COLUMN `email2` char(64)"


def test_ddl_of_merged_tables():
    c = chain(RouteTransform(RouteConfig(routes=[{"source": r"shard_\d+\.users", "target": "all.users"}])))
    s = schema("shard_1", "users", 1)
    create = c.ddl(DDLEvent(1, "CREATE TABLE `shard_1`.`users` (`id` bigint)", s.table, 3, s))
    assert create.query.startswith("CREATE TABLE IF NOT EXISTS `all`.`users` (")
    add = c.ddl(DDLEvent(2, "ALTER TABLE `shard_1`.`users` ADD COLUMN `x` int", s.table, 5, s))
    assert add.query == "ALTER TABLE `all`.`users` ADD COLUMN IF NOT EXISTS `x` int"
    assert c.ddl(DDLEvent(3, "DROP TABLE `shard_1`.`users`", s.table, 4, None)) is None
