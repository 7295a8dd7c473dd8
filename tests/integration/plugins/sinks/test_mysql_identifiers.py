"""Identifiers the driver's %-formatting would misread: a table ``50%off``, a column
``a%b`` (and backticks) replicate into a real MariaDB like any other."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cdcflow.core.data.events import DDLEvent
from cdcflow.core.testing import ListSource, delete, drive, insert, update
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from tests.fixtures.mariadb import MariaDB

pytestmark = pytest.mark.integration

KEYED = "CREATE TABLE `50%off` (`id` INT PRIMARY KEY, `a%b` VARCHAR(20), `c``d` INT)"
KEYLESS = "CREATE TABLE `100%s` (`a%b` VARCHAR(20), `%s` INT)"


def fetch(server: MariaDB, sql: str) -> list[tuple[Any, ...]]:
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return sorted(tuple(r) for r in cur.fetchall())
    finally:
        conn.close()


@pytest.mark.parametrize("safe_mode", ["false", "true"])
def test_tables_and_columns_with_percent_and_backticks_replicate(
    mariadb: MariaDB, mysql_database: str, safe_mode: str
) -> None:
    db = mysql_database
    ddl = [
        DDLEvent(10, KEYED, insert(db, "50%off", {}, commit_ts=10).table),
        DDLEvent(11, KEYLESS, insert(db, "100%s", {}, commit_ts=11).table),
    ]
    events = [
        *ddl,
        insert(db, "50%off", {"id": 1, "a%b": "x%sy", "c`d": 1}, commit_ts=20),
        insert(db, "50%off", {"id": 2, "a%b": "%(z)s", "c`d": 2}, commit_ts=20),
        insert(db, "50%off", {"id": 3, "a%b": "gone", "c`d": 3}, commit_ts=20),
        insert(db, "100%s", {"a%b": "k%", "%s": 5}, commit_ts=20),
        insert(db, "100%s", {"a%b": "drop", "%s": 6}, commit_ts=20),
        ListSource.resolved(25),
        update(db, "50%off", {"id": 1, "a%b": "x%sy", "c`d": 1}, {"id": 1, "a%b": "50%", "c`d": 10}, commit_ts=30),
        delete(db, "50%off", {"id": 3, "a%b": "gone", "c`d": 3}, commit_ts=30),
        update(db, "100%s", {"a%b": "k%", "%s": 5}, {"a%b": "k%%", "%s": 50}, commit_ts=30),
        delete(db, "100%s", {"a%b": "drop", "%s": 6}, commit_ts=30),
        ListSource.resolved(40),
    ]
    uri = f"{mariadb.uri}?safe-mode={safe_mode}&checkpoint-schema=ck%25{db[-6:]}"
    sink = MySQLSink(MySQLSinkConfig(**MySQLSink.options_from_uri(uri)))
    result = asyncio.run(drive(ListSource.of(events), [sink], changefeed_id=f"pct-{safe_mode}"))
    assert result.checkpoint_ts == 40
    assert fetch(mariadb, f"SELECT `id`, `a%b`, `c``d` FROM `{db}`.`50%off`") == [(1, "50%", 10), (2, "%(z)s", 2)]
    assert fetch(mariadb, f"SELECT `a%b`, `%s` FROM `{db}`.`100%s`") == [("k%%", 50)]
