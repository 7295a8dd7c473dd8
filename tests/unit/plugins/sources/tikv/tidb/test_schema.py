"""TableInfo JSON → models → core TableSchema (Open Protocol flags) and defaults."""

import datetime as dt
import decimal

from cdcflow.core.data.events import ColumnInfo
from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBColumn, TiDBTable, parse_default

from . import tidb_json as tj


def test_table_info_parses_tidb_json():
    t = TiDBTable.from_json(tj.users_table())
    assert (t.id, t.name, t.pk_is_handle, t.is_common_handle) == (100, "users", True, False)
    assert [c.name for c in t.public_columns()] == ["id", "name", "score", "ts", "email"]
    assert t.pk_handle_column().name == "id"
    assert t.physical_ids() == (100,)
    assert t.indices[1].unique and not t.indices[1].primary


def test_open_protocol_flags():
    schema = TiDBTable.from_json(tj.users_table()).table_schema("shop")
    cols = {c.name: c for c in schema.columns}
    assert schema.table.schema == "shop" and schema.table.table == "users" and schema.table.table_id == 100
    assert cols["id"].flags == ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY | ColumnInfo.BINARY
    assert cols["id"].type_code == 8 and not cols["id"].nullable
    assert cols["name"].flags == ColumnInfo.MULTIPLE_KEY
    assert cols["score"].flags & ColumnInfo.NULLABLE and cols["score"].sql_type == "decimal(10,2)"
    assert cols["email"].flags == ColumnInfo.UNIQUE_KEY
    assert schema.handle_key_columns() == ("id",)


def test_handle_key_falls_back_to_first_not_null_unique_index():
    data = tj.users_table()
    data["pk_is_handle"] = False
    data["cols"][0]["type"]["Flag"] = tj.NOT_NULL
    schema = TiDBTable.from_json(data).table_schema("shop")
    assert schema.handle_key_columns() == ("email",)


def test_common_handle_primary_index_is_the_handle_key():
    cols = [
        tj.column(1, "region", 0, tj.field_type(15, tj.NOT_NULL | tj.PRI, 8, **tj.UTF8)),
        tj.column(2, "seq", 1, tj.field_type(3, tj.NOT_NULL | tj.PRI, 11)),
        tj.column(3, "v", 2, tj.field_type(15, 0, 8, **tj.UTF8)),
    ]
    t = TiDBTable.from_json(
        tj.table(
            7,
            "events",
            cols,
            [tj.index(1, "PRIMARY", "events", [("region", 0), ("seq", 1)], primary=True)],
            common=True,
        )
    )
    assert t.table_schema("s").handle_key_columns() == ("region", "seq")


def test_partitioned_table_physical_ids():
    partition = {
        "type": 1,
        "expr": "`id`",
        "columns": None,
        "enable": True,
        "is_empty_columns": False,
        "definitions": [
            {"id": 201, "name": ci("p0"), "less_than": ["10"]},
            {"id": 202, "name": ci("p1"), "less_than": ["MAXVALUE"]},
        ],
        "adding_definitions": None,
        "dropping_definitions": None,
        "states": None,
        "num": 2,
    }
    data = tj.users_table(200)
    data["partition"] = partition
    t = TiDBTable.from_json(data)
    assert t.physical_ids() == (201, 202)
    assert t.table_schema("shop", 202).table.partition_id == 202


def ci(n):
    return tj.ci(n)


def test_views_have_no_rows():
    data = tj.users_table()
    data["view"] = {"view_algorithm": 0, "view_select": "select 1"}
    assert TiDBTable.from_json(data).physical_ids() == ()


def test_origin_defaults():
    col = TiDBColumn.from_json(tj.users_table()["cols"][4])
    assert col.origin_default_value() == "none"
    assert parse_default(FieldType(TypeCode.TIMESTAMP), "2020-01-02 03:04:05.5") == dt.datetime(
        2020, 1, 2, 3, 4, 5, 500000, tzinfo=dt.UTC
    )
    assert parse_default(FieldType(TypeCode.DATE), "2020-01-02") == dt.date(2020, 1, 2)
    assert parse_default(FieldType(TypeCode.NEWDECIMAL), "1.50") == decimal.Decimal("1.50")
    assert parse_default(FieldType(TypeCode.ENUM, elems=("a", "b")), "b") == 2
    assert parse_default(FieldType(TypeCode.SET, elems=("a", "b", "c")), "a,c") == 5
    assert parse_default(FieldType(TypeCode.DURATION), "-01:00:30") == -dt.timedelta(hours=1, seconds=30)
    nullable = TiDBColumn(9, "x", 0, FieldType(TypeCode.LONG))
    assert nullable.origin_default_value() is None
    not_null = TiDBColumn(9, "x", 0, FieldType(TypeCode.ENUM, 1, elems=("a",)))
    assert not_null.origin_default_value() == 1


def test_table_schema_carries_typed_origin_defaults():
    data = tj.users_table()
    data["cols"][2]["origin_default"] = "2.50"  # score decimal(10,2): added later with a default
    data["cols"][3]["origin_default"] = "2020-01-02 03:04:05"  # ts TIMESTAMP
    data["cols"][1]["type"]["Flag"] = tj.NOT_NULL  # name: NOT NULL without a default
    cols = {c.name: c for c in TiDBTable.from_json(data).table_schema("shop").columns}
    assert cols["email"].origin_default == "none"  # the value rows written before ADD COLUMN read
    assert cols["score"].origin_default == decimal.Decimal("2.50")
    assert str(cols["score"].origin_default) == "2.50"
    assert cols["ts"].origin_default == dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert cols["name"].origin_default == ""  # NOT NULL, no origin default: the type's zero value
    assert cols["id"].origin_default == 0
    data["cols"][2]["origin_default"] = "not a number"
    assert TiDBTable.from_json(data).table_schema("shop").columns[2].origin_default is None


def test_round_trip_through_to_json():
    t = TiDBTable.from_json(tj.users_table())
    assert TiDBTable.from_json(t.to_json()) == t
