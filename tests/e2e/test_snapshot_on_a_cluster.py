"""End to end: an initial snapshot shared by two ``cdcflow server`` captures (etcd, the Spark executor).

The playground's shop tables are filled with ``bulk_load`` so that they span several
regions. A changefeed with ``initial-snapshot`` starts while both captures are alive: its
maintainer places one snapshot range per region on the captures with the two-phase
scheduler, each capture reads the ranges it is given (its ``snapshot/ranges/<range>/reads.log``
says which) and delivers them to the file sink and a MariaDB, and only then are the tables'
spans placed, streaming the workload that ran meanwhile. At the final checkpoint the files
replay to the playground's tables there, and MariaDB's tables equal them (each capture writes
its own ranges and spans with batch ids of its own).

Then the same with the stores answering ServerIsBusy until both captures are reading: the
capture not running the maintainer is SIGKILLed, its ranges are placed on the other, which
reads them and completes the snapshot.

Then the capture running the maintainer is SIGKILLed after some ranges were delivered (the
leaders of one table's regions are on a store answering ServerIsBusy, the others' reads
go through): the maintainer started on the other capture finds the ranges delivered in the
metastore and places only the others; no range delivered by the dead capture is read again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from cdcflow.core.control.metastore import open_metastore
from cdcflow.core.data.pipeline.spark_executor import changefeed_dir
from cdcflow.core.data.snapshot_ranges import SnapshotRecord
from cdcflow.core.data.types import TypeCode
from cdcflow.core.testing import until_sync
from cdcflow.core.testing.compare import diff, typed_rows
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground._keys import encode_key
from cdcflow.plugins.sources.tikv.tidb.keys import table_record_span
from tests.e2e.e2e_shop import mysql_rows
from tests.etcd_server import EtcdServer
from tests.fixtures.mariadb import MariaDB, start_mariadb
from tests.integration.control.cluster import REST_POLL, Server, cli, env_with_plugin

pytestmark = pytest.mark.integration

LOADED = {"customers": 1200, "orders": 900}
SPLIT_KEYS = 400  # about six regions
RATE = 10.0
CATCH_UP = 300.0
CF = "cf-snapshot"


@dataclass
class Env:
    pg: Playground
    etcd: EtcdServer
    db: MariaDB
    tmp: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("snapshot-cluster")
    etcd = EtcdServer(tmp)
    try:
        with (
            Playground(stores=2, seed=5, ddl_every=0, split_keys=SPLIT_KEYS) as pg,
            start_mariadb(local=True) as db,
        ):
            for table, count in LOADED.items():
                pg.bulk_load(table, count)
            pg.run_workload(40)  # some rows changed before T
            yield Env(pg, etcd, db, tmp, env_with_plugin(tmp / "plugins"))
    finally:
        etcd.stop()


def start_cluster(env: Env, name: str, master: str = "local[1]") -> list[Server]:
    base = env.tmp / name
    base.mkdir()
    settings = base / "server.yaml"
    spark = {"master": master, "conf": {"spark.sql.shuffle.partitions": 2, "spark.ui.enabled": False}}
    settings.write_text(yaml.safe_dump({"server": {"spark": spark}}))
    metastore = f"etcd://{env.etcd.endpoint}/{name}"
    extra = ("--executor", "spark", "--config", str(settings))
    servers = [Server(base, f"capture-{i}", metastore, env.env, extra=extra) for i in range(2)]
    until_sync(lambda: servers[0].get("/api/v2/captures")["total"] == 2, interval=REST_POLL, message="two captures")
    return servers


def create_changefeed(env: Env, server: Server, out: Path, start_ts: int, *, mysql: bool = False) -> None:
    config = out.parent / "cf.yaml"
    source = {"type": "tikv", "playground": False, "pd": [env.pg.pd_address], "tidb-status": env.pg.status_address}
    sinks: list[dict[str, Any]] = [{"type": "file", "path": str(out), "protocol": "json"}]
    if mysql:
        sinks.append({"uri": env.db.uri})
    doc = {
        "source": source,
        "sinks": sinks,
        "filter": {"rules": ["shop.*"]},
        "scheduler": {"type": "two-phase"},
    }
    config.write_text(yaml.safe_dump(doc))
    cli(server, env.env, "changefeed", "create", "-c", CF, "--config", str(config), "--start-ts", str(start_ts),
        "--initial-snapshot")  # fmt: skip


def ranges_read(server: Server) -> set[str]:
    """The snapshot ranges a capture started reading (a reads.log in the range's directory)."""
    ranges = changefeed_dir(server.log_path.parent / server.name, CF) / "snapshot" / "ranges"
    return {p.parent.name for p in ranges.glob("*/reads.log") if p.read_text().strip()}


def ranges_delivered(server: Server) -> set[str]:
    """The snapshot ranges a capture delivered to every sink (a ``done`` file in the range's directory)."""
    ranges = changefeed_dir(server.log_path.parent / server.name, CF) / "snapshot" / "ranges"
    return {p.parent.name for p in ranges.glob("*/done")}


def stored_record(env: Env, name: str) -> SnapshotRecord | None:
    """The changefeed's snapshot record in the cluster's metastore."""

    async def read() -> dict[str, Any] | None:
        store = open_metastore(f"etcd://{env.etcd.endpoint}/{name}")
        try:
            return (await store.list_snapshot_records()).get(CF)
        finally:
            await store.close()

    data = asyncio.run(read())
    return SnapshotRecord.from_json(data) if data is not None else None


def maintainer_of(servers: list[Server]) -> Server:
    return next(s for s in servers if f"maintainer of {CF} epoch" in s.log_path.read_text(errors="replace"))


def wait_checkpoint(env: Env, servers: list[Server], final: int) -> int:
    def past() -> int | None:
        for server in servers:
            if not server.alive:
                continue
            try:
                checkpoint = int(server.get(f"/api/v2/changefeeds/{CF}")["checkpoint_tso"])
            except OSError:
                continue
            return checkpoint if checkpoint >= final else None
        return None

    return until_sync(past, timeout=CATCH_UP, interval=0.5, message="checkpoint past the end")  # type: ignore[no-any-return]


def file_rows(out: Path, table: str, types: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    """The table the files replay to: rows in commit order, the snapshot's at T first."""
    docs = [
        json.loads(line)
        for path in (out / "shop" / table).glob("*.jsonl")
        if not path.name.startswith("ddl-")
        for line in path.read_text().splitlines()
    ]
    rows: dict[Any, dict[str, Any]] = {}
    for doc in sorted((d for d in docs if d.get("type") == "row"), key=lambda d: (d["commit_ts"], d["start_ts"])):
        if doc["op"] == "delete":
            rows.pop(doc["before"]["id"], None)
        else:
            rows[doc["after"]["id"]] = doc["after"]
    return typed_rows([_parsed(row, types) for row in rows.values()], types)


def _parsed(row: dict[str, Any], types: dict[str, Any]) -> dict[str, Any]:
    """The JSON protocol writes DATETIME and TIMESTAMP values as ISO strings."""
    out = dict(row)
    for column, ft in types.items():
        if isinstance(out.get(column), str) and TypeCode(ft.tp) in (TypeCode.DATETIME, TypeCode.TIMESTAMP):
            out[column] = dt.datetime.fromisoformat(out[column])
    return out


def assert_files_equal(env: Env, out: Path, checkpoint: int) -> None:
    problems = []
    for table in LOADED:
        types = {c.name: c.ft for c in env.pg.catalog.find("shop", table, checkpoint).columns}
        want = typed_rows(env.pg.snapshot(table, checkpoint), types)
        found = diff(want, file_rows(out, table, types))
        if found:
            problems.append(f"shop.{table} at {checkpoint}: {found}")
    assert not problems, "\n".join(problems)


def assert_mysql_equal(env: Env, checkpoint: int) -> None:
    problems = []
    for table in LOADED:
        types = {c.name: c.ft for c in env.pg.catalog.find("shop", table, checkpoint).columns}
        want = typed_rows(env.pg.snapshot(table, checkpoint), types)
        _, rows = mysql_rows(SimpleNamespace(db=env.db), table)
        found = diff(want, typed_rows(rows, types))
        if found:
            problems.append(f"MariaDB shop.{table} at {checkpoint}: {found}")
    assert not problems, "\n".join(problems)


def stop(servers: list[Server]) -> None:
    for server in servers:
        if server.alive:
            server.terminate()


@pytest.mark.timeout(900)
def test_two_captures_share_the_snapshot_ranges(env: Env) -> None:
    assert len(env.pg.regions()) >= 4, "the tables must span several regions"
    servers = start_cluster(env, "shared")
    out = env.tmp / "shared" / "out"
    try:
        start_ts = env.pg.now()
        create_changefeed(env, servers[0], out, start_ts, mysql=True)
        env.pg.start_workload(RATE)
        time.sleep(5)
        env.pg.stop_workload()
        checkpoint = wait_checkpoint(env, servers, env.pg.now())
        read = [ranges_read(s) for s in servers]
        assert read[0] and read[1], f"each capture reads ranges: {read}"
        assert not read[0] & read[1], f"a range read by both: {read[0] & read[1]}"
        # No capture took a snapshot of its own spans.
        for server in servers:
            assert not (changefeed_dir(server.log_path.parent / server.name, CF) / "snapshot" / "plan.pkl").exists()
        assert_files_equal(env, out, checkpoint)
        assert_mysql_equal(env, checkpoint)
        # Each capture wrote as a writer of its own.
        writers = fetch_writers(env)
        assert len(writers) == 2, writers
    finally:
        env.pg.stop_workload()
        stop(servers)


def fetch_writers(env: Env) -> list[tuple[str, int]]:
    conn = env.db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT writer_id, flushed_ts FROM cdcflow.checkpoint WHERE changefeed_id = %s", (CF,))
            return sorted(tuple(r) for r in cur.fetchall())
    finally:
        conn.close()


@pytest.mark.timeout(900)
def test_a_capture_killed_mid_snapshot_has_its_ranges_read_by_the_other(env: Env) -> None:
    servers = start_cluster(env, "killed")
    out = env.tmp / "killed" / "out"
    try:
        for store in env.pg.cluster.store_ids():
            env.pg.kv_region_error(store, "server_is_busy", 1_000_000)  # every read waits
        start_ts = env.pg.now()
        create_changefeed(env, servers[0], out, start_ts)
        until_sync(lambda: all(ranges_read(s) for s in servers), timeout=CATCH_UP, interval=0.5, message="both reading")
        survivor = maintainer_of(servers)
        victim = next(s for s in servers if s is not survivor)
        survivor_id = survivor.status()["id"]  # type: ignore[index]
        before = ranges_read(survivor)
        victim.kill()
        in_flight = ranges_read(victim)
        assert in_flight and not in_flight & before, (in_flight, before)

        def all_on_survivor() -> bool:
            items = survivor.get(f"/api/v2/changefeeds/{CF}/tables")["items"]
            ranges = [i for i in items if i["table_id"] < 0]  # snapshot ranges: the table id negated
            return bool(ranges) and all(i["primary"] == survivor_id and i["state"] == "replicating" for i in ranges)

        # The dead capture's ranges are placed on the survivor (reads still wait on the stores).
        until_sync(all_on_survivor, timeout=CATCH_UP, interval=0.5, message="ranges placed on the survivor")
        env.pg.kv_faults.clear()
        env.pg.start_workload(RATE)
        time.sleep(3)
        env.pg.stop_workload()
        checkpoint = wait_checkpoint(env, [survivor], env.pg.now())
        assert in_flight <= ranges_read(survivor), "the survivor read the ranges the dead capture was reading"
        assert_files_equal(env, out, checkpoint)
    finally:
        env.pg.kv_faults.clear()
        env.pg.stop_workload()
        stop(servers)


@pytest.mark.timeout(900)
def test_the_maintainers_capture_killed_mid_snapshot_its_successor_reads_only_what_was_left(env: Env) -> None:
    store_ids = list(env.pg.cluster.store_ids())
    fast, slow = store_ids[0], store_ids[1]
    orders = [encode_key(k) for k in table_record_span(env.pg.table_id("orders"))]
    for region in env.pg.regions():  # orders' regions led by the slow store, every other by the fast one
        env.pg.transfer_leader(region.id, slow if region.overlaps(*orders) else fast)
    # Task slots for the ranges waiting on the slow store and for the others (they sleep
    # between retries, so more slots than cores cost nothing).
    servers = start_cluster(env, "moved", master="local[4]")
    out = env.tmp / "moved" / "out"
    try:
        env.pg.kv_region_error(slow, "server_is_busy", 1_000_000)  # the orders ranges wait
        start_ts = env.pg.now()
        create_changefeed(env, servers[0], out, start_ts)
        victim = maintainer_of(servers)
        survivor = next(s for s in servers if s is not victim)

        # The victim's ranges the stored record covers. A range it delivers after that, before
        # the kill, may be delivered again by the survivor (its heartbeat never carried it):
        # it counts as in flight. The record holds the ranges every capture delivered, so it
        # covers exactly the ranges delivered when their number equals its count and none
        # was delivered while it was read.
        stored: dict[str, Any] = {}

        def some_delivered_and_stored() -> bool:
            before = (ranges_delivered(victim), ranges_delivered(survivor))
            record = stored_record(env, "moved")
            after = (ranges_delivered(victim), ranges_delivered(survivor))
            if not before[0] or before != after or record is None or record.parts_done != len(before[0] | before[1]):
                return False
            stored.update(victim=before[0], record=record)
            return True

        until_sync(some_delivered_and_stored, timeout=CATCH_UP, interval=0.5, message="ranges delivered and stored")
        delivered_by_victim = stored["victim"]
        read_by_survivor = ranges_read(survivor)
        assert not stored["record"].complete, stored["record"]
        victim.kill()
        in_flight = ranges_read(victim) - delivered_by_victim
        until_sync(
            lambda: (
                "initial snapshot at" in survivor.log_path.read_text(errors="replace")
                and "resumed:" in survivor.log_path.read_text(errors="replace")
            ),
            timeout=CATCH_UP,
            interval=0.5,
            message="the changefeed's maintainer started again on the survivor, from the stored record",
        )
        env.pg.kv_faults.clear()
        env.pg.start_workload(RATE)
        time.sleep(3)
        env.pg.stop_workload()
        checkpoint = wait_checkpoint(env, [survivor], env.pg.now())
        read_after = ranges_read(survivor) - read_by_survivor
        assert not read_after & delivered_by_victim, (
            f"delivered and stored before the kill, read again: {read_after & delivered_by_victim}"
        )
        assert ranges_read(victim) & ranges_read(survivor) <= in_flight, "read twice: only ranges in flight"
        final = stored_record(env, "moved")
        assert final is not None and final.complete and final.parts_done == final.parts_total
        assert_files_equal(env, out, checkpoint)
    finally:
        env.pg.kv_faults.clear()
        env.pg.stop_workload()
        stop(servers)
