from cdcflow.core.config.settings import ColumnSelectorSettings
from cdcflow.core.data.events import ColumnInfo, TableSchema
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.testing import insert, update


def selection(*selectors):
    return ColumnSelection([ColumnSelectorSettings(matcher=m, columns=c) for m, c in selectors])


def test_first_matching_selector_applies_and_last_pattern_decides():
    sel = selection((["shop.orders"], ["*", "!secret*"]), (["shop.*"], ["id"]))
    row = insert("shop", "orders", {"id": 1, "Secret_note": "x", "qty": 2}, commit_ts=10)
    assert sel.apply(row).after == {"id": 1, "qty": 2}
    other = update("shop", "items", {"id": 1, "name": "a"}, {"id": 1, "name": "b"}, commit_ts=10)
    got = sel.apply(other)
    assert got.after == {"id": 1} and got.before == {"id": 1}


def test_tables_without_selector_and_handle_keys_are_kept():
    sel = selection((["shop.orders"], ["qty"]))
    row = insert("audit", "log", {"id": 1, "x": 2}, commit_ts=10)
    assert sel.apply(row) is row
    schema = TableSchema(
        row.table, (ColumnInfo("id", 3, ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY), ColumnInfo("qty", 3))
    )
    keyed = insert("shop", "orders", {"id": 7, "qty": 1, "note": "n"}, commit_ts=10)
    keyed = type(keyed)(keyed.table, keyed.op, 10, 9, keyed.after, None, schema)
    got = sel.apply(keyed)
    assert got.after == {"id": 7, "qty": 1}
    assert [c.name for c in got.schema.columns] == ["id", "qty"]
    assert not selection()
