"""End to end: ``cdcflow run`` with ``initial-snapshot: true`` from a playground full of rows.

The playground's shop tables are filled with ``bulk_load`` (rows no change feed ever
sees) and changed a little before the changefeed's start ts T; the changefeed copies
every row as of T in Spark tasks (one per range of about 250 keys), delivers it to
MariaDB and the Spark tables, then streams the workload that runs during the copy.
At the final checkpoint every downstream table equals the playground's snapshot there,
rows never changed after T included.

Then the same from scratch with a SIGKILL mid-snapshot: once two parts are read the
stores answer ServerIsBusy for a while, so the part in flight backs off; meanwhile the
checkpoint and the GC safepoint are checked to hold T. The capture is killed, and a new
process reads only the parts without a file — the parts read twice are exactly those in
flight at the kill — and ends equal to the playground again. (Locks at T, committed or
rolled back later, are covered by the reader's and the Spark read's own tests.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from cdcflow.core.data.pipeline.snapshot import InitialSnapshot
from cdcflow.core.testing.compare import diff, typed_rows
from cdcflow.plugins.sources.playground import Playground
from tests.e2e.e2e_shop import CHANGEFEED, TABLES, RunProcess, free_port, mysql_rows, server_settings, spark_rows
from tests.fixtures.mariadb import MariaDB, start_mariadb

pytestmark = pytest.mark.integration

RATE = 10.0
CATCH_UP = 240.0
LOADED = {"customers": 2000, "orders": 1500}
RANGE_KEYS = 250


@dataclass
class Env:
    pg: Playground
    db: MariaDB
    spark: Any
    tmp: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    from cdcflow.plugins.sinks.spark.session import spark_session

    tmp = tmp_path_factory.mktemp("e2e-snapshot")
    # Before the playground's gRPC servers run in this process (see test_playground_to_db).
    reader = spark_session("local[1]", str(tmp / "reader"), {"spark.ui.enabled": "false"})
    with Playground(stores=2, seed=11, ddl_every=0, split_keys=600) as pg, start_mariadb(local=True) as db:
        for table, count in LOADED.items():
            pg.bulk_load(table, count)
        pg.run_workload(60)  # some rows changed (and deleted) before T
        yield Env(pg, db, reader, tmp)
    reader.stop()


def start_run(env: Env, name: str, start_ts: int) -> RunProcess:
    """A fresh capture (its own metastore, data dir and lake) with an empty MariaDB."""
    conn = env.db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS shop")
            cur.execute("DROP DATABASE IF EXISTS cdcflow")
    finally:
        conn.close()
    tmp = env.tmp / name
    tmp.mkdir()
    port = free_port()
    connector = {
        "name": CHANGEFEED,
        "source": {
            "type": "tikv",
            "pd": [env.pg.pd_address],
            "tidb-status": env.pg.status_address,
            "snapshot-range-keys": RANGE_KEYS,
            "snapshot-page-size": 100,
        },
        "sinks": [{"uri": env.db.uri}, {"uri": "spark://"}],
        "filter": {"rules": ["shop.*"]},
        "start-ts": start_ts,
        "initial-snapshot": True,
    }
    path = tmp / "connectors.yaml"
    path.write_text(yaml.safe_dump({"server": server_settings(tmp, port), "connectors": [connector]}))
    run = RunProcess(path, port, tmp / "run.log")
    run.start()
    return run


def snapshot_files(env: Env, name: str, ts: int) -> InitialSnapshot:
    return InitialSnapshot(env.tmp / name / "data" / "changefeeds" / CHANGEFEED, CHANGEFEED, ts)


def assert_equal_at(env: Env, name: str, checkpoint: int, start_ts: int) -> None:
    problems = []
    for table in TABLES:
        types = {c.name: c.ft for c in env.pg.catalog.find("shop", table, checkpoint).columns}
        want = typed_rows(env.pg.snapshot(table, checkpoint), types)
        at_start = typed_rows(env.pg.snapshot(table, start_ts), types)
        unchanged = [k for k, row in want.items() if at_start.get(k) == row]  # only the snapshot wrote them
        if table in LOADED:
            assert len(unchanged) > LOADED[table] // 2, f"{table}: the workload changed too much to tell"
        downstream = SimpleNamespace(db=env.db, spark=env.spark, lake=env.tmp / name / "lake")
        for where, (_, rows) in (("MariaDB", mysql_rows(downstream, table)), ("Spark", spark_rows(downstream, table))):
            found = diff(want, typed_rows(rows, types))
            if found:
                problems.append(f"{where} shop.{table} at {checkpoint}: {found}")
    assert not problems, "\n".join(problems)


def settle(env: Env, run: RunProcess) -> int:
    env.pg.stop_workload()
    return run.wait_checkpoint(env.pg.now(), CATCH_UP)


def test_a_changefeed_starts_with_a_full_copy_then_streams(env: Env) -> None:
    start_ts = env.pg.now()
    run = start_run(env, "plain", start_ts)
    try:
        env.pg.start_workload(RATE)  # commits above T while the snapshot is read
        cf = run.wait_for("snapshot done", lambda c: c["snapshot_done"], CATCH_UP)
        assert cf["initial_snapshot"] is True and cf["checkpoint_tso"] > start_ts
        time.sleep(2)
        checkpoint = settle(env, run)
        assert_equal_at(env, "plain", checkpoint, start_ts)
        snapshot = snapshot_files(env, "plain", start_ts)
        assert snapshot.done
        # One read per part, nothing read twice.
        parts = [part for _, part in snapshot.reads()]
        assert len(parts) == len(set(parts)) >= sum(LOADED.values()) // RANGE_KEYS
        want_rows = sum(len(env.pg.snapshot(t, start_ts)) for t in TABLES)
        assert f"initial snapshot at {start_ts} done: {want_rows} rows" in run.log_path.read_text()
    finally:
        env.pg.stop_workload()
        run.stop()


def test_a_capture_killed_mid_snapshot_reads_only_the_parts_not_done(env: Env) -> None:
    start_ts = env.pg.now()
    run = start_run(env, "killed", start_ts)
    snapshot = snapshot_files(env, "killed", start_ts)
    try:
        env.pg.start_workload(RATE)
        deadline = time.monotonic() + CATCH_UP
        while len(snapshot.parts_done()) < 2:
            assert run.proc is not None and run.proc.poll() is None, run.log_tail()
            assert time.monotonic() < deadline, f"no part was read: {run.log_tail()}"
            time.sleep(0.1)
        # The stores answer ServerIsBusy for a while: the part being read backs off and waits.
        for store in (1, 2):
            env.pg.kv_region_error(store, "server_is_busy", 25)
        time.sleep(3.0)
        started = {part for _, part in snapshot.reads()}
        assert started - set(snapshot.parts_done()), "no part in flight"
        # The checkpoint holds T while the snapshot runs, and so does the GC safepoint.
        cf = run.changefeed()
        assert cf is not None and cf["checkpoint_tso"] == start_ts and not cf["snapshot_done"]
        assert env.pg.advance_gc(env.pg.now()) <= start_ts
        run.kill()
        done_at_kill = set(snapshot.parts_done())
        reads_at_kill = snapshot.reads()
        first_run = {run_id for run_id, _ in reads_at_kill}
        assert len(first_run) == 1
        in_flight = {part for _, part in reads_at_kill} - done_at_kill
        assert in_flight and done_at_kill

        run.start()
        run.wait_for("snapshot done", lambda c: c["snapshot_done"], CATCH_UP)
        checkpoint = settle(env, run)
        assert_equal_at(env, "killed", checkpoint, start_ts)
        second = [part for run_id, part in snapshot.reads() if run_id not in first_run]
        kept = snapshot.plan()
        assert kept is not None
        # Every part not done at the kill is read by the new process, once; the parts read
        # twice are exactly those in flight when the capture was killed.
        assert sorted(second) == sorted(set(range(len(kept[0].tasks))) - done_at_kill)
        assert {part for part in second if part in {p for _, p in reads_at_kill}} == in_flight
    finally:
        env.pg.stop_workload()
        run.stop()
