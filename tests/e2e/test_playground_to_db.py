"""End to end: the playground's shop workload through ``cdcflow run`` into MariaDB and Spark tables.

One playground (PD + a TiKV store + TiDB status API, real gRPC/HTTP), one private MariaDB and
one ``cdcflow run`` capture process for the module; the tikv source reads the playground through
its pd / tidb-status addresses, the Spark pipeline runs the batches, and both the MySQL sink and
the Spark table sink (snapshot tables under a tmp warehouse) receive them. The workload has
inserts, updates, deletes, multi-row transactions, the CREATE TABLEs and ADD/DROP COLUMN DDLs.

Each test stops the workload, waits (REST API) until the changefeed checkpoint passes the last
commit, then compares every row of every shop table in MariaDB and in the Spark snapshot tables
with ``Playground.snapshot(table, checkpoint)`` (typed: see ``e2e_shop`` for the normalisation).
The tests run in order on the same changefeed: a plain run, the Spark snapshot across the
ADD/DROP COLUMNs, a table created mid-run (its CREATE TABLE and its rows reach MariaDB),
that table renamed (MariaDB and the Spark snapshot keep its rows under the new name),
a hash-partitioned table (three spans, one table downstream),
MariaDB stopped for 30 s mid-run (Warning 2001, then Normal by itself), and last the SIGKILL
of the capture's process group mid-run and restart (a new process).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.testing.compare import diff, typed_rows
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key
from cdcflow.plugins.sources.playground.shop import SHOP_TABLES
from tests.e2e.e2e_shop import TABLES, RunProcess, mysql_rows, spark_rows, write_connectors
from tests.fixtures.mariadb import MariaDB, start_mariadb

pytestmark = pytest.mark.integration

RATE = 15.0  # workload transactions per second
CATCH_UP = 180.0  # seconds the capture may take to pass the last commit
OUTAGE = 30.0  # seconds MariaDB stays down
# The workload's rate while MariaDB is down. Every DDL ends a batch, and the catch-up after the
# outage writes one Spark snapshot version per DDL batch (seconds each on two busy cores): at
# RATE, 30 s of workload hold ~24 DDLs, and on a busy machine the catch-up passed CATCH_UP. This test is
# about the recovery (Warning 2001, then Normal by itself, nothing lost), not catch-up speed.
OUTAGE_RATE = 5.0


@dataclass
class Shop:
    pg: Playground
    db: MariaDB
    run: RunProcess
    lake: Path
    #: The session that reads the Spark sink's snapshot tables.
    spark: Any


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    from cdcflow.plugins.sinks.spark.session import spark_session

    tmp = tmp_path_factory.mktemp("e2e-db")
    # Before the playground's gRPC servers run in this process: launching Spark's JVM forks,
    # and a fork while gRPC threads are busy can abort the child (JAVA_GATEWAY_EXITED).
    reader = spark_session("local[1]", str(tmp / "reader"), {"spark.ui.enabled": "false"})
    with Playground(stores=1, seed=5, ddl_every=20, create_tables=False) as pg, start_mariadb(local=True) as db:
        start_ts = pg.now()
        pg.workload.create_tables()  # after start_ts: the CREATE TABLEs are replicated too
        port = 0  # the capture takes a free port and logs it (RunProcess reads it)
        run = RunProcess(write_connectors(tmp, pg.pd_address, pg.status_address, start_ts, db.uri, port), port,
                         tmp / "run.log")  # fmt: skip
        run.start()
        try:
            yield Shop(pg, db, run, tmp / "lake", reader)
        finally:
            pg.stop_workload()
            run.stop()
    reader.stop()  # later modules start sessions of their own, with other masters


def settle(shop: Shop) -> int:
    """Stop the workload and wait until the checkpoint passes its last commit; return the checkpoint."""
    stats = shop.pg.stop_workload()
    assert stats.last_commit_ts > 0 and stats.rows > stats.transactions  # multi-row transactions
    final = shop.pg.now()
    return shop.run.wait_checkpoint(final, CATCH_UP)


def columns_at(shop: Shop, table: str, ts: int) -> list[Any]:
    return list(shop.pg.catalog.find("shop", table, ts).columns)


def assert_downstream_equals_snapshot(shop: Shop, checkpoint: int) -> None:
    """Every row of every shop table, in MariaDB and in the Spark snapshot tables."""
    problems = []
    for table in TABLES:
        columns = columns_at(shop, table, checkpoint)
        types = {c.name: c.ft for c in columns}
        want = typed_rows(shop.pg.snapshot(table, checkpoint), types)
        assert want, f"the workload left shop.{table} empty: nothing to compare"
        for name, read in (("MariaDB", mysql_rows), ("Spark", spark_rows)):
            names, rows = read(shop, table)
            if set(names) != set(types):
                problems.append(f"{name} shop.{table}: columns {sorted(names)}, upstream {sorted(types)}")
                continue
            got = typed_rows(rows, types)
            found = diff(want, got)
            if found:
                problems.append(f"{name} shop.{table} at {checkpoint}: {found}")
    assert not problems, "\n".join(problems)


def test_run_then_every_downstream_table_equals_the_snapshot(shop: Shop) -> None:
    shop.pg.start_workload(RATE)
    time.sleep(4)
    checkpoint = settle(shop)
    assert shop.pg.workload.stats.ddls >= 1
    assert_downstream_equals_snapshot(shop, checkpoint)


def test_spark_snapshot_follows_add_and_drop_column_exactly(shop: Shop) -> None:
    """Past the first run's ADD/DROP COLUMNs: the Spark snapshot has exactly the upstream's
    columns, and rows it has not rewritten since an ADD COLUMN hold the column's default."""
    checkpoint = shop.run.wait_checkpoint(shop.pg.now(), CATCH_UP)
    assert shop.pg.workload.stats.ddls >= 1
    assert_downstream_equals_snapshot(shop, checkpoint)


def test_a_table_created_while_running_is_replicated(shop: Shop) -> None:
    late = shop.pg.ddl.create_table("shop", "late", [("id", SHOP_TABLES["orders"][0][1])])
    for ids in (range(1, 4), range(4, 9)):  # rows committed after the CREATE TABLE
        txn = shop.pg.begin()
        for i in ids:
            txn.put(row_key(late, i), encode_row_value(late, {}))
        txn.commit()
    shop.run.wait_checkpoint(shop.pg.now(), CATCH_UP)
    conn = shop.db.connect("shop")
    try:
        with conn.cursor() as cur:
            assert cur.execute("SHOW TABLES LIKE 'late'") == 1
            cur.execute("SELECT id FROM late ORDER BY id")
            assert [row[0] for row in cur.fetchall()] == list(range(1, 9))
    finally:
        conn.close()


def test_a_renamed_table_keeps_its_rows_under_the_new_name(shop: Shop) -> None:
    late = shop.pg.catalog.find("shop", "late")
    txn = shop.pg.begin()
    txn.delete(row_key(late, 1))  # just below the RENAME
    txn.commit()
    renamed = shop.pg.ddl.rename_table("shop", "late", "renamed")
    txn = shop.pg.begin()
    for i in range(9, 12):
        txn.put(row_key(renamed, i), encode_row_value(renamed, {}))
    txn.commit()
    shop.run.wait_checkpoint(shop.pg.now(), CATCH_UP)
    want = list(range(2, 12))
    conn = shop.db.connect("shop")
    try:
        with conn.cursor() as cur:
            assert cur.execute("SHOW TABLES LIKE 'late'") == 0
            cur.execute("SELECT id FROM renamed ORDER BY id")
            assert [row[0] for row in cur.fetchall()] == want
    finally:
        conn.close()
    _, rows = spark_rows(shop, "renamed")
    assert sorted(row["id"] for row in rows) == want
    assert spark_rows(shop, "late")[1] == []  # gone upstream: an empty current version


def test_a_partitioned_table_is_one_table_downstream(shop: Shop) -> None:
    """PARTITION BY HASH: rows live under three partition ids (three spans), downstream in one table."""
    columns = [("id", SHOP_TABLES["orders"][0][1]), ("note", SHOP_TABLES["customers"][1][1])]
    parted = shop.pg.ddl.create_table("shop", "parted", columns, partitions=3)
    txn = shop.pg.begin()
    for i in range(1, 13):
        txn.put(row_key(parted, i), encode_row_value(parted, {"note": f"n{i}"}))
    txn.commit()
    txn = shop.pg.begin()
    txn.put(row_key(parted, 4), encode_row_value(parted, {"note": "updated"}))
    txn.delete(row_key(parted, 5))
    txn.commit()
    checkpoint = shop.run.wait_checkpoint(shop.pg.now(), CATCH_UP)
    want = {row["id"]: row["note"] for row in shop.pg.snapshot("parted", checkpoint)}
    assert len(want) == 11 and want[4] == "updated"
    conn = shop.db.connect("shop")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, note FROM parted")
            assert dict(cur.fetchall()) == want
    finally:
        conn.close()
    _, rows = spark_rows(shop, "parted")
    assert {row["id"]: row["note"] for row in rows} == want


# After the checks that need a healthy changefeed: a failed recovery leaves it stuck.
def test_downstream_stopped_for_30s_then_restarted(shop: Shop) -> None:
    shop.pg.start_workload(OUTAGE_RATE)
    time.sleep(2)
    shop.db.stop()
    down = time.monotonic()
    try:
        warning = shop.run.wait_for(
            "went Warning 2001", lambda c: c["state"] == "warning" and (c["error"] or {}).get("code") == 2001, OUTAGE
        )
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - down)))
    finally:
        shop.db.start()
    assert "MySQL" in str(warning["error"])
    checkpoint = settle(shop)
    cf = shop.run.wait_for("went back to Normal", lambda c: c["state"] == "normal", CATCH_UP)
    assert cf["checkpoint_tso"] >= checkpoint
    assert_downstream_equals_snapshot(shop, checkpoint)


# Last: the capture that survives it is a new process.
def test_sigkill_of_the_capture_mid_run_then_restart(shop: Shop) -> None:
    shop.pg.start_workload(RATE)
    time.sleep(3)
    shop.run.kill()
    time.sleep(2)  # commits while no capture runs
    shop.run.start()
    time.sleep(2)
    checkpoint = settle(shop)
    assert_downstream_equals_snapshot(shop, checkpoint)
