"""Conflict detection of the MySQL sink: which transactions share a lane."""

from __future__ import annotations

from cdcflow.core.testing import insert, update
from cdcflow.plugins.sinks.mysql.causality import assign_lanes, group_for_transactions, lanes_of, split_units
from cdcflow.plugins.sinks.mysql.dml import TableMeta

ORDERS = TableMeta("s", "orders", ("id", "name"), handle=("id",), unique_keys=(("id",), ("name",)))
LOG = TableMeta("s", "log", ("msg",))
METAS = {"orders": ORDERS, "log": LOG}


def meta_of(table: object) -> TableMeta:
    return METAS[table.table]  # type: ignore[attr-defined]


def test_rows_of_one_transaction_and_table_form_one_unit() -> None:
    rows = [
        insert("s", "orders", {"id": 1, "name": "a"}, commit_ts=5),
        insert("s", "log", {"msg": "x"}, commit_ts=5),
        insert("s", "orders", {"id": 2, "name": "b"}, commit_ts=5),
        insert("s", "orders", {"id": 3, "name": "c"}, commit_ts=6),
    ]
    units = split_units(rows)
    assert [(u.table.table, u.commit_ts, len(u.rows)) for u in units] == [
        ("orders", 5, 2),
        ("log", 5, 1),
        ("orders", 6, 1),
    ]


def test_a_unique_key_freed_by_an_update_orders_the_next_insert() -> None:
    # id 1 moves name "a" → "z"; a later insert takes name "a": only the OLD image links them.
    rows = [
        update("s", "orders", {"id": 1, "name": "a"}, {"id": 1, "name": "z"}, commit_ts=5),
        insert("s", "orders", {"id": 2, "name": "a"}, commit_ts=6),
        insert("s", "orders", {"id": 3, "name": "c"}, commit_ts=7),
    ]
    lanes = lanes_of(split_units(rows), meta_of)
    assert sorted([u.commit_ts for u in lane] for lane in lanes) == [[5, 6], [7]]


def test_string_keys_conflict_case_insensitively() -> None:
    rows = [
        insert("s", "orders", {"id": 1, "name": "Ab"}, commit_ts=5),
        insert("s", "orders", {"id": 2, "name": "aB"}, commit_ts=6),
    ]
    assert len(lanes_of(split_units(rows), meta_of)) == 1


def test_a_table_without_key_is_one_lane_and_lanes_spread_over_workers() -> None:
    rows = [insert("s", "log", {"msg": str(i)}, commit_ts=5 + i) for i in range(4)]
    rows += [insert("s", "orders", {"id": i, "name": str(i)}, commit_ts=20 + i) for i in range(4)]
    lanes = lanes_of(split_units(rows), meta_of)
    assert len(lanes) == 5
    workers = assign_lanes(lanes, 3)
    assert sum(len(w) for w in workers) == 8
    log_workers = [i for i, w in enumerate(workers) if any(u.table.table == "log" for u in w)]
    assert len(log_workers) == 1
    for units in workers:
        assert [u.seq for u in units] == sorted(u.seq for u in units)


def test_transactions_pack_units_of_one_table_and_never_split_one() -> None:
    big = [insert("s", "orders", {"id": i, "name": str(i)}, commit_ts=5) for i in range(5)]
    small = [insert("s", "orders", {"id": 10 + i, "name": f"x{i}"}, commit_ts=6 + i) for i in range(3)]
    groups = group_for_transactions(split_units(big + small), 4)
    assert [[len(u.rows) for u in g] for g in groups] == [[5], [1, 1, 1]]
