"""End to end: the playground through ``cdcflow run`` with a filter + project + mask + route
chain into MariaDB and Spark tables, across ADD COLUMNs.

The expected downstream is worked out here, in plain Python, from the playground's snapshot
at the checkpoint — not with cdcflow's transform code: orders with ``quantity >= 50000``,
without ``note``, ``amount`` renamed ``total``, ``qty2 = quantity * 2``; customers' ``email``
the hex SHA-256 of salt, NUL and the address; the two shards ``users_0`` and ``users_1``
merged into ``users`` with ``_shard`` naming the source (part of the key: ids repeat);
products untouched. The ADD COLUMNs (one per table, the shards' both merged into one) come
between two workload runs, so their DDL goes through the chain into MariaDB (rewritten,
``IF NOT EXISTS`` on the merged table) and into the Spark snapshot tables' schemas.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcflow.core.testing.compare import diff, normalise
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key
from cdcflow.plugins.sources.playground.shop import SHOP_TABLES
from tests.e2e.e2e_shop import (
    CHANGEFEED,
    RunProcess,
    mysql_rows,
    server_settings,
    spark_rows,
)
from tests.fixtures.mariadb import MariaDB, start_mariadb

pytestmark = pytest.mark.integration

SALT = "e2e-pepper"
CATCH_UP = 180.0
USERS = 30
THRESHOLD = 50_000  # quantity is uniform in [0, 100000): about half the orders pass

#: The transforms, as a user writes them.
TRANSFORMS: list[dict[str, Any]] = [
    {"type": "filter", "tables": ["shop.orders"], "where": f"quantity >= {THRESHOLD}"},
    {
        "type": "project",
        "tables": ["shop.orders"],
        "drop": ["note"],
        "rename": {"amount": "total"},
        "computed": [{"name": "qty2", "expr": "quantity * 2", "type": "bigint"}],
    },
    {"type": "mask", "tables": ["shop.customers"], "columns": ["email"]},
    {
        "type": "route",
        "tables": ["shop.users_*"],
        "routes": [{"source": r"shop\.users_(\d+)", "target": "shop.users"}],
        "source-column": "_shard",
        "source-column-in-key": True,
    },
]

#: The column every table gets half-way (nullable, with a default rows before it read).
ADDED = {"orders": "gift", "customers": "tier", "products": "origin", "users_0": "score", "users_1": "score"}


@dataclass
class Shop:
    pg: Playground
    db: MariaDB
    run: RunProcess
    lake: Path
    spark: Any


def write_connectors(tmp: Path, pd: str, status: str, start_ts: int, mysql_uri: str, api_port: int) -> Path:
    path = tmp / "connectors.yaml"
    connector = {
        "name": CHANGEFEED,
        "source": {"type": "tikv", "playground": False, "pd": [pd], "tidb-status": status},
        "sinks": [{"uri": mysql_uri}, {"uri": "spark://"}],
        "filter": {"rules": ["shop.*"]},
        "start-ts": start_ts,
        "transforms": TRANSFORMS,
    }
    path.write_text(yaml.safe_dump({"server": server_settings(tmp, api_port), "connectors": [connector]}))
    return path


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    from cdcflow.plugins.sinks.spark.session import spark_session

    tmp = tmp_path_factory.mktemp("e2e-transforms")
    # Spark's JVM before the playground's gRPC threads (see test_playground_to_db).
    reader = spark_session("local[1]", str(tmp / "reader"), {"spark.ui.enabled": "false"})
    saved = os.environ.get("CDCFLOW_MASK_SALT")
    os.environ["CDCFLOW_MASK_SALT"] = SALT  # the capture's process inherits it
    try:
        with Playground(stores=1, seed=11, ddl_every=0, create_tables=False) as pg, start_mariadb(local=True) as db:
            start_ts = pg.now()
            pg.workload.create_tables()
            name_ft = SHOP_TABLES["customers"][1][1]
            for shard in ("users_0", "users_1"):
                pg.ddl.create_table("shop", shard, [("id", SHOP_TABLES["orders"][0][1]), ("name", name_ft)])
            port = 0  # the capture takes a free port and logs it (RunProcess reads it)
            run = RunProcess(write_connectors(tmp, pg.pd_address, pg.status_address, start_ts, db.uri, port), port,
                             tmp / "run.log")  # fmt: skip
            run.start()
            try:
                yield Shop(pg, db, run, tmp / "lake", reader)
            finally:
                run.stop()
    finally:
        if saved is None:
            os.environ.pop("CDCFLOW_MASK_SALT", None)
        else:
            os.environ["CDCFLOW_MASK_SALT"] = saved
        reader.stop()


def write_users(shop: Shop, ids: range, suffix: str, extra: dict[str, Any] | None = None) -> None:
    """Rows of both shards with the same ids (a merge must keep them apart), in one transaction."""
    txn = shop.pg.begin()
    for shard in ("users_0", "users_1"):
        table = shop.pg.catalog.find("shop", shard)
        for i in ids:
            txn.put(row_key(table, i), encode_row_value(table, {"name": f"{shard}-{i}{suffix}", **(extra or {})}))
    txn.commit()


def delete_users(shop: Shop, shard: str, ids: range) -> None:
    table = shop.pg.catalog.find("shop", shard)
    txn = shop.pg.begin()
    for i in ids:
        txn.delete(row_key(table, i))
    txn.commit()


# -- the expected downstream, from the upstream snapshot ------------------------------------


def source_types(shop: Shop, table: str, ts: int) -> dict[str, Any]:
    return {c.name: c.ft for c in shop.pg.catalog.find("shop", table, ts).columns}


def expected(shop: Shop, ts: int) -> dict[str, tuple[dict[str, Any], dict[Any, dict[str, Any]]]]:
    """Per downstream table: its columns (name → the upstream type to normalise by, None:
    compared as is) and its rows by key."""
    out: dict[str, tuple[dict[str, Any], dict[Any, dict[str, Any]]]] = {}

    types = source_types(shop, "orders", ts)
    columns = {("total" if c == "amount" else c): ft for c, ft in types.items() if c != "note"}
    columns["qty2"] = None
    rows = {}
    for row in shop.pg.snapshot("orders", ts):
        if row["quantity"] < THRESHOLD:
            continue
        image = {("total" if c == "amount" else c): v for c, v in row.items() if c != "note"}
        image["qty2"] = row["quantity"] * 2
        rows[row["id"]] = {c: normalise(image[c], ft) if ft is not None else image[c] for c, ft in columns.items()}
    out["orders"] = (columns, rows)

    types = source_types(shop, "customers", ts)
    columns = {c: (None if c == "email" else ft) for c, ft in types.items()}
    rows = {}
    for row in shop.pg.snapshot("customers", ts):
        email = row["email"]
        hashed = None if email is None else hashlib.sha256(SALT.encode() + b"\0" + email.encode()).hexdigest()
        image = {**row, "email": hashed}
        rows[row["id"]] = {c: normalise(image[c], ft) if ft is not None else image[c] for c, ft in columns.items()}
    out["customers"] = (columns, rows)

    types = source_types(shop, "products", ts)
    out["products"] = (
        types,
        {r["id"]: {c: normalise(r[c], ft) for c, ft in types.items()} for r in shop.pg.snapshot("products", ts)},
    )

    types = source_types(shop, "users_0", ts)
    assert types.keys() == source_types(shop, "users_1", ts).keys()
    columns = {**types, "_shard": None}
    rows = {}
    for shard in ("users_0", "users_1"):
        for row in shop.pg.snapshot(shard, ts):
            image = {**row, "_shard": f"shop.{shard}"}
            rows[(row["id"], image["_shard"])] = {
                c: normalise(image[c], ft) if ft is not None else image[c] for c, ft in columns.items()
            }
    out["users"] = (columns, rows)
    return out


# -- what the sinks hold -------------------------------------------------------------------


def key_of(table: str, row: dict[str, Any]) -> Any:
    return (row["id"], row["_shard"]) if table == "users" else row["id"]


def test_a_transform_chain_reaches_mariadb_and_spark_tables_across_add_column(shop: Shop) -> None:
    write_users(shop, range(USERS), "")
    shop.pg.run_workload(120)
    write_users(shop, range(0, USERS, 3), "-updated")
    delete_users(shop, "users_1", range(1, USERS, 5))

    for table, column in ADDED.items():
        shop.pg.ddl.add_column("shop", table, column, SHOP_TABLES["orders"][6][1], "none")
    write_users(shop, range(USERS, USERS + 10), "", {"score": "high"})
    write_users(shop, range(0, USERS, 4), "-again")  # rows of before the ADD, rewritten after it
    shop.pg.run_workload(120)

    checkpoint = shop.run.wait_checkpoint(shop.pg.now(), CATCH_UP)
    want_all = expected(shop, checkpoint)
    assert all(column in want_all[t.split("_")[0]][0] for t, column in ADDED.items())
    problems = []
    for table, (columns, want) in want_all.items():
        assert want, f"nothing upstream for {table}: nothing to compare"
        for name, read in (("MariaDB", mysql_rows), ("Spark", spark_rows)):
            names, rows = read(shop, table)
            if set(names) != set(columns):
                problems.append(f"{name} shop.{table}: columns {sorted(names)}, want {sorted(columns)}")
                continue
            got = {
                key_of(table, r): {c: normalise(r[c], ft) if ft is not None else r[c] for c, ft in columns.items()}
                for r in rows
            }
            found = diff(want, got)
            if found:
                problems.append(f"{name} shop.{table} at {checkpoint}: {found}")
    assert not problems, "\n".join(problems)
    # The filter left orders out, and both shards have rows with the same ids.
    assert 0 < len(want_all["orders"][1]) < len(shop.pg.snapshot("orders", checkpoint))
    assert {i for i, s in want_all["users"][1] if s == "shop.users_0"} & {
        i for i, s in want_all["users"][1] if s == "shop.users_1"
    }
    conn = shop.db.connect("shop")
    try:
        with conn.cursor() as cur:
            # The merged table's key is (id, _shard); no table of the shards' own names.
            cur.execute(
                "SELECT column_name FROM information_schema.key_column_usage WHERE table_schema = 'shop'"
                " AND table_name = 'users' AND constraint_name = 'PRIMARY' ORDER BY ordinal_position"
            )
            assert [r[0] for r in cur.fetchall()] == ["id", "_shard"]
            for gone in ("users_0", "users_1"):
                assert cur.execute(f"SHOW TABLES LIKE '{gone}'") == 0
    finally:
        conn.close()
