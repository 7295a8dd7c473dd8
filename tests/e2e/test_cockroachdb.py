"""End to end: the CockroachDB playground's shop workload through ``cdcflow run`` into MariaDB, Kafka, Spark.

One CockroachDB playground (a real pgwire server with sinkless changefeeds) and one Kafka mock
cluster in this process, one private MariaDB, and one ``cdcflow run`` capture process for the
module; the ``cockroachdb`` source reads the playground through its DSN, the Spark pipeline runs
the batches, and the MySQL sink, the Kafka sink (Open Protocol) and the Spark table sink
(snapshot tables under a tmp warehouse) receive them.

Each test runs the workload (multi-row transactions of inserts, updates and deletes), stops it,
waits (REST API) until the changefeed checkpoint passes its last commit, then compares every row
of every shop table in MariaDB, in the Spark snapshot tables and in the tables rebuilt from the
topic by the Open Protocol consumer recipe with the playground's snapshot at that ts. The tests
run in order on the same changefeed: a run with ADD COLUMN (kept) and ADD then DROP COLUMN
mid-run, the feed connections dropped and failed with retryable errors mid-run, a table created
(rows, update, delete) then dropped while running, and last the SIGKILL of the capture's process
group mid-run and its restart (a new process). Apart, on a cluster of two ``cdcflow server``
captures: a table moved from one to the other while the workload runs.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcflow.plugins.sinks.kafka.mock import mock_cluster
from cdcflow.plugins.sources.cockroach_playground import CockroachPlayground
from cdcflow.plugins.sources.cockroachdb.hlc import HLC, cursor_for
from cdcflow.plugins.sources.cockroachdb.types import map_type
from tests.e2e.e2e_kafka import replicate, table_rows
from tests.e2e.e2e_shop import CHANGEFEED, TABLES, RunProcess, mysql_rows, server_settings, spark_rows
from tests.fixtures.mariadb import MariaDB, start_mariadb

pytestmark = pytest.mark.integration

RATE = 20.0  # workload transactions per second
CATCH_UP = 180.0  # seconds the capture may take to pass the last commit


@dataclass
class Shop:
    pg: CockroachPlayground
    db: MariaDB
    run: RunProcess
    bootstrap: str
    topic: str
    lake: Path
    #: The session that reads the Spark sink's snapshot tables.
    spark: Any


def mysql_create_table(pg: CockroachPlayground, table: str) -> str:
    """The downstream table, typed by the source's type mapping (the source replicates no CREATE TABLE)."""
    definition = pg.store.table(table).descriptor()
    assert definition is not None
    columns = [
        f"`{c.name}` {map_type(c.type).sql_type}{'' if c.nullable and c.name not in definition.pk else ' NOT NULL'}"
        for c in definition.columns
    ]
    pk = ", ".join(f"`{name}`" for name in definition.pk)
    return f"CREATE TABLE `{table}` ({', '.join(columns)}, PRIMARY KEY ({pk}))"


def write_connectors(tmp: Path, dsn: str, start_ts: int, mysql_uri: str, kafka: str, api_port: int) -> Path:
    path = tmp / "connectors.yaml"
    server = server_settings(tmp, api_port)
    server["spark"]["trigger-interval"] = 0.3
    connector = {
        "name": CHANGEFEED,
        "source": {"type": "cockroachdb", "dsn": dsn, "resolved-interval": 0.3, "table-poll-interval": 0.3},
        # lz4: the mock cluster keeps only the last few MiB of each partition.
        "sinks": [
            {"uri": mysql_uri},
            {"uri": f"{kafka}?partition-num=3&max-batch-size=16&compression=lz4"},
            {"uri": "spark://?mode=snapshot"},
        ],
        "filter": {"rules": ["shop.*"]},
        "start-ts": start_ts,
    }
    path.write_text(yaml.safe_dump({"server": server, "connectors": [connector]}))
    return path


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    from cdcflow.plugins.sinks.spark.session import spark_session

    tmp = tmp_path_factory.mktemp("e2e-crdb")
    # Before the playground's server thread runs in this process: launching Spark's JVM forks.
    reader = spark_session("local[1]", str(tmp / "reader"), {"spark.ui.enabled": "false"})
    cluster = mock_cluster(3)
    topic = f"crdb-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 3, 3)
    with CockroachPlayground(rate=0, seed=11) as pg, start_mariadb(local=True) as db:
        conn = db.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE DATABASE shop")
                cur.execute("USE shop")
                for table in TABLES:
                    cur.execute(mysql_create_table(pg, table))
            conn.commit()
        finally:
            conn.close()
        start_ts = pg.now().commit_ts
        port = 0  # the capture takes a free port and logs it (RunProcess reads it)
        kafka = f"kafka://{cluster.bootstrap_servers}/{topic}"
        run = RunProcess(write_connectors(tmp, pg.dsn, start_ts, db.uri, kafka, port), port, tmp / "run.log")
        run.start()
        try:
            yield Shop(pg, db, run, cluster.bootstrap_servers, topic, tmp / "lake", reader)
        finally:
            pg.stop_workload()
            run.stop()


# -- comparison ---------------------------------------------------------------------------------


def normalise(value: Any, crdb_type: str) -> Any:
    """``value`` of a column of CockroachDB type ``crdb_type`` as upstream, MariaDB and Kafka agree on it:
    DECIMAL at its scale, BOOL as bool, TIMESTAMP(TZ) naive UTC, JSONB parsed, BYTES as bytes."""
    if value is None:
        return None
    t = crdb_type.upper()
    if t.startswith("DECIMAL"):
        scale = re.search(r",\s*(\d+)\)", t)
        return decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-int(scale.group(1) if scale else 0)))
    if t.startswith("BOOL"):
        return value if isinstance(value, bool) else str(value).lower() in ("1", "t", "true")
    if t.startswith("INT"):
        return int(value)
    if t.startswith("FLOAT"):
        return float(value)
    if t.startswith("TIMESTAMP"):
        value = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
        return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value
    if t == "DATE":
        return value.date() if isinstance(value, dt.datetime) else dt.date.fromisoformat(str(value))
    if t.startswith("JSON"):
        return json.loads(value) if isinstance(value, str | bytes) else value
    if t.startswith("BYTES"):
        return bytes(value) if not isinstance(value, str) else value.encode()
    return str(value)


def upstream(shop: Shop, table: str, ts: int) -> tuple[dict[str, str], dict[Any, dict[str, Any]]]:
    """The columns (name → CockroachDB type) and rows of ``table`` at cdcflow ts ``ts``."""
    at: HLC = cursor_for(ts)
    definition = shop.pg.store.table(table, at).descriptor(at)
    assert definition is not None
    types = {c.name: c.type for c in definition.columns}
    return types, typed(shop.pg.snapshot(table, at), types)


def typed(rows: list[dict[str, Any]], types: dict[str, str]) -> dict[Any, dict[str, Any]]:
    return {int(row["id"]): {c: normalise(row.get(c), t) for c, t in types.items()} for row in rows}


def diff(want: dict[Any, dict[str, Any]], got: dict[Any, dict[str, Any]], limit: int = 3) -> str:
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    changed = [k for k in sorted(set(want) & set(got)) if want[k] != got[k]]
    if not (missing or extra or changed):
        return ""
    return (
        f"{len(want)} rows wanted, {len(got)} got: missing {missing[:10]}, extra {extra[:10]}, "
        f"differ {[(got[k], want[k]) for k in changed[:limit]]}"
    )


def settle(shop: Shop) -> int:
    """Stop the workload and wait until the checkpoint passes its last commit; return the checkpoint."""
    stats = shop.pg.stop_workload()
    assert stats.rows > stats.transactions  # multi-row transactions
    return shop.run.wait_checkpoint(shop.pg.now().commit_ts, CATCH_UP)


def assert_downstream_equals_snapshot(shop: Shop, checkpoint: int) -> None:
    """Every row of every shop table, in MariaDB at the checkpoint and rebuilt from Kafka at its resolved ts."""
    problems = []
    for table in TABLES:
        types, want = upstream(shop, table, checkpoint)
        assert want, f"the workload left shop.{table} empty: nothing to compare"
        for name, read in (("MariaDB", mysql_rows), ("Spark", spark_rows)):
            names, rows = read(shop, table)
            if set(names) != set(types):
                problems.append(f"{name} shop.{table}: columns {sorted(names)}, upstream {sorted(types)}")
                continue
            found = diff(want, typed(rows, types))
            if found:
                problems.append(f"{name} shop.{table} at {checkpoint}: {found}")
    replica = replicate(shop.bootstrap, shop.topic, at_least=checkpoint)
    assert replica.resolved_ts >= checkpoint, f"Kafka's resolved ts {replica.resolved_ts} < {checkpoint}"
    for table in TABLES:
        types, want = upstream(shop, table, replica.resolved_ts)
        found = diff(want, typed(list(table_rows(replica, table).values()), types))
        if found:
            problems.append(f"Kafka shop.{table} at {replica.resolved_ts}: {found}")
    assert not problems, "\n".join(problems) + "\nlog: " + shop.run.log_tail()


# -- the tests, in order ------------------------------------------------------------------------


def test_run_with_add_and_drop_column_mid_run(shop: Shop) -> None:
    pg = shop.pg
    pg.start_workload(RATE)
    time.sleep(3)
    pg.execute("ALTER TABLE orders ADD COLUMN note STRING(20)")  # kept: rows below it read NULL
    pg.execute("ALTER TABLE customers ADD COLUMN tier INT4")
    time.sleep(1)
    pg.execute("UPDATE orders SET note = 'gift' WHERE id <= 5")
    pg.execute("UPDATE customers SET tier = 3 WHERE id <= 5")
    time.sleep(2)
    pg.execute("ALTER TABLE customers DROP COLUMN tier")
    time.sleep(2)
    checkpoint = settle(shop)
    _, orders = upstream(shop, "orders", checkpoint)
    assert any(row["note"] == "gift" for row in orders.values())
    assert_downstream_equals_snapshot(shop, checkpoint)
    replica = replicate(shop.bootstrap, shop.topic)
    ddl = " ".join(query for _, query in replica.ddl)
    assert "ADD COLUMN" in ddl and "DROP COLUMN" in ddl, replica.ddl


def test_feed_connections_dropped_and_failed_mid_run(shop: Shop) -> None:
    pg = shop.pg
    pg.start_workload(RATE)
    time.sleep(2)
    assert pg.drop_feed_connections() == len(TABLES)
    time.sleep(2)
    pg.fail_feeds("XXUUU", "RangeFeedRetryError: REASON_SLOW_CONSUMER")
    time.sleep(2)
    pg.drop_feed_connections()
    time.sleep(1)
    checkpoint = settle(shop)
    assert_downstream_equals_snapshot(shop, checkpoint)
    log = shop.run.log_path.read_text(errors="replace")
    assert "reconnecting from" in log
    assert "Duplicate entry" not in log  # rows a reconnect repeats are not applied twice


def test_a_table_created_then_dropped_while_running(shop: Shop) -> None:
    """Found by polling the catalog: its CREATE TABLE and rows reach MariaDB and Kafka, then its DROP."""
    pg = shop.pg
    pg.execute("CREATE TABLE late (id INT8 PRIMARY KEY, note STRING(10), amount DECIMAL(8,2))")
    pg.execute("INSERT INTO late (id, note, amount) VALUES (1, 'a', 1.50), (2, 'b', 2), (3, 'c', NULL), (4, 'd', 4)")
    pg.execute("UPDATE late SET note = 'x' WHERE id = 2")
    pg.execute("DELETE FROM late WHERE id = 3")
    checkpoint = shop.run.wait_checkpoint(pg.now().commit_ts, CATCH_UP)
    types, want = upstream(shop, "late", checkpoint)
    assert sorted(want) == [1, 2, 4] and want[2]["note"] == "x"
    names, rows = mysql_rows(shop, "late")
    assert sorted(names) == sorted(types) and typed(rows, types) == want
    replica = replicate(shop.bootstrap, shop.topic, at_least=checkpoint)
    assert replica.resolved_ts >= checkpoint, f"Kafka's resolved ts {replica.resolved_ts} < {checkpoint}"
    assert typed(list(table_rows(replica, "late").values()), types) == want
    assert any(query.startswith("CREATE TABLE `shop`.`late`") for _, query in replica.ddl), replica.ddl

    pg.execute("DROP TABLE late")
    shop.run.wait_checkpoint(pg.now().commit_ts, CATCH_UP)
    conn = shop.db.connect("shop")
    try:
        with conn.cursor() as cur:
            assert cur.execute("SHOW TABLES LIKE 'late'") == 0
    finally:
        conn.close()


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


# -- a table moved between two captures of a cluster ---------------------------------------------


def file_rows(out: Path, table: str, types: dict[str, str]) -> dict[Any, dict[str, Any]]:
    """``table`` rebuilt from the file sink's JSON lines: every version applied in (commit ts, start ts) order
    (a replayed batch repeats versions; applying one twice changes nothing)."""
    paths = (out / "shop" / table).glob("*.jsonl")
    docs = [json.loads(line) for path in paths for line in path.read_text().splitlines()]
    rows: dict[Any, dict[str, Any]] = {}
    for doc in sorted((d for d in docs if d.get("type") == "row"), key=lambda d: (d["commit_ts"], d["start_ts"])):
        if doc["op"] == "delete":
            rows.pop(int(doc["before"]["id"]), None)
        else:
            rows[int(doc["after"]["id"])] = {c: normalise(doc["after"].get(c), t) for c, t in types.items()}
    return rows


def test_a_table_moved_between_two_captures(tmp_path: Path) -> None:
    """Two ``cdcflow server`` captures on etcd, the two-phase scheduler, the workload running: orders'
    span moves to the other capture; the files then hold every row of the playground, no gap, no loss."""
    from cdcflow.core.testing import until_sync
    from tests.etcd_server import EtcdServer
    from tests.integration.control.cluster import REST_POLL, Server, cli, env_with_plugin

    etcd = EtcdServer(tmp_path)
    env = env_with_plugin(tmp_path / "plugins")
    metastore = f"etcd://{etcd.endpoint}/crdb"
    out = tmp_path / "out"
    with CockroachPlayground(rate=0, seed=23) as pg:
        servers = [Server(tmp_path, f"capture-{i}", metastore, env) for i in range(2)]
        try:
            ids = [s.status()["id"] for s in servers]  # type: ignore[index]
            until_sync(lambda: servers[0].get("/api/v2/captures")["total"] == 2, interval=REST_POLL, message="captures")
            config = tmp_path / "cf.yaml"
            source = {"type": "cockroachdb", "dsn": pg.dsn, "resolved-interval": 0.3, "table-poll-interval": 0.3}
            sink = {"type": "file", "path": str(out), "protocol": "json"}
            config.write_text(yaml.safe_dump({"source": source, "sinks": [sink], "scheduler": {"type": "two-phase"}}))
            cli(servers[0], env, "changefeed", "create", "-c", "cf-crdb", "--config", str(config))
            pg.start_workload(RATE)  # after the changefeed's start ts: the tables start empty

            def placed() -> dict[int, str] | None:
                items = servers[0].get("/api/v2/changefeeds/cf-crdb/tables")["items"]
                if len(items) < len(TABLES) or any(i["state"] != "replicating" for i in items):
                    return None
                return {i["table_id"]: i["primary"] for i in items}

            spans = until_sync(placed, timeout=120, interval=REST_POLL, message="spans replicating")
            assert set(spans.values()) == set(ids), spans  # spread over both captures
            orders = pg.store.table("orders").id
            target = next(c for c in ids if c != spans[orders])
            time.sleep(2)
            cli(servers[1], env, "changefeed", "move-table", "-c", "cf-crdb", "--table-id", str(orders),
                "--target-capture", target)  # fmt: skip
            until_sync(lambda: (placed() or {}).get(orders) == target, timeout=60, interval=REST_POLL, message="moved")
            time.sleep(2)  # commits replicated by the new capture
            pg.stop_workload()
            final = pg.now().commit_ts

            def past_final() -> int | None:
                checkpoint = int(servers[0].get("/api/v2/changefeeds/cf-crdb")["checkpoint_tso"])
                return checkpoint if checkpoint >= final else None

            checkpoint = until_sync(past_final, timeout=CATCH_UP, interval=REST_POLL, message="checkpoint past the end")
            for table in ("orders", "customers"):
                at = cursor_for(checkpoint)
                definition = pg.store.table(table, at).descriptor(at)
                assert definition is not None
                types = {c.name: c.type for c in definition.columns}
                want = typed(pg.snapshot(table, at), types)
                assert want and file_rows(out, table, types) == want, diff(want, file_rows(out, table, types))
        finally:
            pg.stop_workload()
            for server in servers:
                if server.alive:
                    server.terminate()
            etcd.stop()
