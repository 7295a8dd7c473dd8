"""Statements of the MySQL sink: parameters, quoting, multi-row runs, safe mode."""

from __future__ import annotations

import datetime as dt

from cdcflow.core.testing import delete, insert, update
from cdcflow.plugins.sinks.mysql.dml import TableMeta, plan_statements, quote

META = TableMeta("shop", "orders", ("id", "name", "qty"), handle=("id",), unique_keys=(("id",), ("name",)))
UTC = dt.UTC


def test_identifiers_are_quoted_and_values_are_parameters() -> None:
    hostile = "x'); DROP TABLE t; --"
    meta = TableMeta("s`1", "t`2", ("id", "v`x"), handle=("id",), unique_keys=(("id",),))
    [stmt] = plan_statements(meta, [insert("s`1", "t`2", {"id": 1, "v`x": hostile}, commit_ts=5)], [False], UTC)
    assert stmt.sql == "INSERT INTO `s``1`.`t``2` (`id`, `v``x`) VALUES (%s, %s)"
    assert stmt.many == [(1, hostile)]
    assert hostile not in stmt.sql
    assert quote("a`b") == "`a``b`"


def test_consecutive_changes_of_a_kind_become_one_statement() -> None:
    rows = [
        insert("shop", "orders", {"id": 1, "name": "a", "qty": 1}, commit_ts=5),
        insert("shop", "orders", {"id": 2, "name": "b", "qty": 1}, commit_ts=5),
        delete("shop", "orders", {"id": 1, "name": "a", "qty": 1}, commit_ts=6),
        delete("shop", "orders", {"id": 2, "name": "b", "qty": 1}, commit_ts=6),
        update("shop", "orders", {"id": 3, "name": "c", "qty": 1}, {"id": 3, "name": "c", "qty": 2}, commit_ts=7),
    ]
    stmts = plan_statements(META, rows, [False] * len(rows), UTC)
    assert [s.sql.split()[0] for s in stmts] == ["INSERT", "DELETE", "UPDATE"]
    assert stmts[0].many == [(1, "a", 1), (2, "b", 1)]
    assert stmts[1].sql == "DELETE FROM `shop`.`orders` WHERE `id` IN (%s, %s)" and stmts[1].args == (1, 2)
    assert stmts[2].sql == "UPDATE `shop`.`orders` SET `id` = %s, `name` = %s, `qty` = %s WHERE `id` = %s"
    assert stmts[2].args == (3, "c", 2, 3)


def test_safe_mode_replaces_and_deletes_a_moved_key() -> None:
    rows = [
        insert("shop", "orders", {"id": 1, "name": "a", "qty": 1}, commit_ts=5),
        update("shop", "orders", {"id": 1, "name": "a", "qty": 1}, {"id": 9, "name": "a", "qty": 1}, commit_ts=6),
    ]
    stmts = plan_statements(META, rows, [True, True], UTC)
    assert [s.sql.split()[0] for s in stmts] == ["REPLACE", "DELETE", "REPLACE"]
    assert stmts[1].args == (1,) and stmts[2].many == [(9, "a", 1)]


def test_a_table_without_key_is_matched_on_every_column_with_null_safe_equality() -> None:
    meta = TableMeta("s", "log", ("msg", "n"))
    [stmt] = plan_statements(meta, [delete("s", "log", {"msg": None, "n": 1}, commit_ts=5)], [False], UTC)
    assert stmt.sql == "DELETE FROM `s`.`log` WHERE `msg` <=> %s AND `n` <=> %s LIMIT 1"
    assert stmt.args == (None, 1)


def test_aware_datetimes_are_shown_in_the_session_zone() -> None:
    meta = TableMeta("s", "t", ("id", "at"), handle=("id",))
    at = dt.datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    zone = dt.timezone(dt.timedelta(hours=8))
    [stmt] = plan_statements(meta, [insert("s", "t", {"id": 1, "at": at}, commit_ts=5)], [False], zone)
    assert stmt.many == [(1, dt.datetime(2026, 1, 1, 20, 0))]


def test_a_huge_run_is_cut_into_bounded_statements() -> None:
    from cdcflow.plugins.sinks.mysql.dml import MAX_ROWS_PER_STATEMENT

    n = MAX_ROWS_PER_STATEMENT * 2 + 1
    rows = [delete("shop", "orders", {"id": i, "name": str(i), "qty": 0}, commit_ts=5) for i in range(n)]
    stmts = plan_statements(META, rows, [False] * n, UTC)
    assert [len(s.rows) for s in stmts] == [MAX_ROWS_PER_STATEMENT, MAX_ROWS_PER_STATEMENT, 1]
    assert sum(len(s.args) for s in stmts) == n


def test_a_composite_key_is_deleted_by_or_of_ands() -> None:
    meta = TableMeta("s", "t", ("a", "b", "v"), handle=("a", "b"), unique_keys=(("a", "b"),))
    rows = [
        delete("s", "t", {"a": 1, "b": 2, "v": 0}, commit_ts=5),
        delete("s", "t", {"a": 3, "b": 4, "v": 0}, commit_ts=5),
    ]
    [stmt] = plan_statements(meta, rows, [False, False], UTC)
    assert stmt.sql == "DELETE FROM `s`.`t` WHERE (`a` = %s AND `b` = %s) OR (`a` = %s AND `b` = %s)"
    assert stmt.args == (1, 2, 3, 4)
