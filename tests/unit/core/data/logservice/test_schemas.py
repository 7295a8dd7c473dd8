"""Schemas in the event store: column defaults survive a restart exactly; older stores still load."""

import datetime as dt
import decimal
import pickle
import shutil
from pathlib import Path

import pytest

from cdcflow.core.data.events import ColumnInfo, DDLEvent, OpType, RowChange, Span, TableName, TableSchema
from cdcflow.core.data.logservice import EventStore
from cdcflow.core.data.logservice.records import SchemaRegistry, loads_pickled

from .test_store import published_events

#: A store written by cdcflow 0.1.0 (commit b9b8660), before ColumnInfo had ``origin_default``: one row
#: change of shop.orders (schema version 7) published up to ts 115, and an ADD COLUMN
#: at ts 120 whose schema_after has a fourth column ``note``.
OLD_STORE = Path(__file__).parent / "stores" / "0.1.0"

TABLE = TableName("shop", "orders", 42)

#: One default of each kind of value row images hold.
DEFAULTS = {
    "i": (8, 7),
    "u": (8, 2**64 - 1),
    "f": (5, 0.1),
    "d": (246, decimal.Decimal("1.50")),
    "s": (15, "n/a"),
    "b": (15, b"\x00\xff"),
    "day": (10, dt.date(2026, 1, 2)),
    "zero_day": (10, "0000-00-00"),
    "at": (12, dt.datetime(2026, 1, 2, 3, 4, 5, 600000)),
    "ts": (7, dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)),
    "t": (11, -dt.timedelta(hours=1, seconds=30)),
    "null": (3, None),
}


def typed_schema(version: int = 1) -> TableSchema:
    return TableSchema(
        TABLE, tuple(ColumnInfo(n, code, origin_default=v) for n, (code, v) in DEFAULTS.items()), version
    )


def assert_same_defaults(got: TableSchema, want: TableSchema) -> None:
    assert got == want
    for g, w in zip(got.columns, want.columns, strict=True):
        # Equal is not enough: 1.50 == 1.5 and a naive datetime is not an aware one.
        assert type(g.origin_default) is type(w.origin_default) and repr(g.origin_default) == repr(w.origin_default)


def test_schema_registry_round_trips_typed_defaults(tmp_path: Path) -> None:
    schema = typed_schema()
    registry = SchemaRegistry(tmp_path / "schemas.pkl")
    assert registry.id_of(schema) == 0
    assert registry.id_of(typed_schema()) == 0  # the same schema again: the same id
    other = TableSchema(TABLE, (ColumnInfo("i", 8, origin_default=8),), 1)
    assert registry.id_of(other) == 1  # differs only in a default: another schema
    reopened = SchemaRegistry(tmp_path / "schemas.pkl")
    assert_same_defaults(reopened.get(0), schema)
    assert reopened.get(1) == other
    assert reopened.id_of(schema) == 0


def test_rows_and_ddl_keep_their_schemas_across_a_restart(tmp_path: Path) -> None:
    store = EventStore(tmp_path / "store", "cf", fsync=False)
    span = Span(42, b"a", b"b")
    store.add_span(span, 0, replicating=True)
    row = RowChange(TABLE, OpType.INSERT, 10, 9, {"i": 1}, None, typed_schema(), b"k")
    store.put(span, row)
    ddl = DDLEvent(20, "ALTER TABLE `shop`.`orders` ADD COLUMN ...", TABLE, 5, typed_schema(2))
    assert store.put_ddl(ddl)
    store.resolve(span, 15)
    del store

    again = EventStore(tmp_path / "store", "cf", fsync=False)
    [got] = published_events(again, 0, 15)
    assert got == row
    assert_same_defaults(got.schema, row.schema)
    [got_ddl] = again.ddl_between(15, 20)
    assert got_ddl == ddl
    assert_same_defaults(got_ddl.schema_after, typed_schema(2))


def test_a_store_written_before_column_defaults_still_loads(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    shutil.copytree(OLD_STORE, directory)
    store = EventStore(directory, "cf-0.1.0", fsync=False)
    [row] = published_events(store, 0, 115)
    assert row.after == {"id": 1, "price": decimal.Decimal("9.50"), "at": dt.datetime(2026, 1, 2, 3, 4, 5)}
    assert [(c.name, c.sql_type, c.origin_default) for c in row.schema.columns] == [
        ("id", "bigint(20)", None),
        ("price", "decimal(10,2)", None),
        ("at", "datetime", None),
    ]
    assert row.schema.handle_key_columns() == ("id",)
    [ddl] = store.ddl_between(115, 120)
    assert ddl.action_type == 5
    assert [c.name for c in ddl.schema_after.columns] == ["id", "price", "at", "note"]
    assert all(c.origin_default is None for c in ddl.schema_after.columns)
    # The old schemas keep their ids; a schema with defaults is added after them.
    assert store.schemas.id_of(row.schema) == 0
    assert store.schemas.id_of(typed_schema()) == 1
    assert_same_defaults(SchemaRegistry(directory / "schemas.pkl").get(1), typed_schema())


def test_column_state_with_more_values_than_fields_is_refused() -> None:
    column = ColumnInfo.__new__(ColumnInfo)
    with pytest.raises(ValueError, match="more than its"):
        column.__setstate__(["a", 1, 0, "", True, None, "from a newer cdcflow"])


def test_a_row_image_pickled_under_an_earlier_module_name_still_loads() -> None:
    """Images go through the C unpickler first; one naming a class by the module an earlier
    release kept it in (``cdcflow.core.events``) is loaded by the store's own unpickler."""
    image = {"table": TABLE, "price": decimal.Decimal("9.50")}
    now = pickle.dumps(image, protocol=0)
    assert b"cdcflow.core.data.events" in now
    earlier = now.replace(b"cdcflow.core.data.events", b"cdcflow.core.events")
    assert loads_pickled(now) == image
    assert loads_pickled(earlier) == image
