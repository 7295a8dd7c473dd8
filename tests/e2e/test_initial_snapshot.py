"""End to end: ``cdcflow run`` with ``initial-snapshot: true`` from a playground full of rows.

The playground's shop tables are filled with ``bulk_load`` (rows no change feed ever
sees) and changed a little before the changefeed's start ts T; the changefeed copies
every row as of T in Spark tasks (one per range of about 250 keys), delivers it to
MariaDB and the Spark tables (and, in the first test, Kafka: the copy's rows, all at T,
are produced to each table's partition by every task that holds some), then streams
the workload that runs during the copy. At the final checkpoint every downstream table
equals the playground's snapshot there, rows never changed after T included.

Then the same from scratch with a SIGKILL mid-snapshot: once two parts are read the
stores answer ServerIsBusy for a while, so the part in flight backs off; meanwhile the
checkpoint and the GC safepoint are checked to hold T. The capture is killed, and a new
process reads only the parts without a file — the parts read twice are exactly those in
flight at the kill — and ends equal to the playground again.

Then faults under the read itself. The playground splits the regions and moves their
leaders just before the snapshot's scans are served (``kv_churn``), so the scans meet
EpochNotMatch and NotLeader (counted by the stores) and each part is still read once,
exactly. And locks of transactions that started before T: held when the changefeed
starts, they hold its feeds' resolved ts below T, so the snapshot waits for them (one
commits below T, one above, one rolls back); prewritten late, once the snapshot is
planned, they are met by the reader, which checks them (counted by the stores), waits,
and reads again once one committed above T and one rolled back. The snapshot batch (the
change log's ``batch_id=-1``) equals the playground at T, and everything downstream
equals it at the final checkpoint.
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
from cdcflow.core.testing.open_protocol import read_topic, rebuild
from cdcflow.plugins.sinks.kafka.mock import mock_cluster
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key
from cdcflow.plugins.sources.playground.txn import Transaction
from tests.e2e.e2e_shop import CHANGEFEED, TABLES, RunProcess, mysql_rows, server_settings, spark_rows
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


def start_run(env: Env, name: str, start_ts: int, kafka_topic: str | None = None) -> RunProcess:
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
    port = 0  # the capture takes a free port and logs it (RunProcess reads it)
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
    if kafka_topic is not None:
        cluster = mock_cluster(3)
        cluster.create_topic(kafka_topic, 3, 3)  # the mock cluster creates topics only from this process
        connector["sinks"].append({"uri": f"kafka://{cluster.bootstrap_servers}/{kafka_topic}?partition-num=3"})
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
    run = start_run(env, "plain", start_ts, kafka_topic="snapshot-plain")
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
        # Kafka (Open Protocol, rebuilt by the consumer recipe) equals the playground at the
        # last resolved ts its partitions carry, and the copy is every row at T once.
        replica = rebuild(read_topic(mock_cluster(3).bootstrap_servers, "snapshot-plain"))
        assert replica.resolved_ts > start_ts
        for table in TABLES:
            got = {key[0]: row for key, row in replica.tables.get(("shop", table), {}).items()}
            want = {row["id"]: row for row in env.pg.snapshot(table, replica.resolved_ts)}
            assert got == want, table
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
        env.pg.kv_faults.clear()  # busy answers the killed capture did not take: not for the next test
        env.pg.stop_workload()
        run.stop()


def snapshot_batch_rows(env: Env, name: str, table: str) -> list[dict[str, Any]]:
    """The rows the initial snapshot wrote to the Spark change log of ``shop.<table>``."""
    path = env.tmp / name / "lake" / "shop" / table / "changelog"
    frame = env.spark.read.parquet(str(path)).where("batch_id = -1")
    return [row["after"].asDict() for row in frame.select("after").collect()]


def assert_snapshot_exact(env: Env, name: str, start_ts: int) -> None:
    """The snapshot batch itself (not only the end state) equals the playground at T."""
    problems = []
    for table in TABLES:
        types = {c.name: c.ft for c in env.pg.catalog.find("shop", table, start_ts).columns}
        want = typed_rows(env.pg.snapshot(table, start_ts), types)
        found = diff(want, typed_rows(snapshot_batch_rows(env, name, table), types))
        if found:
            problems.append(f"snapshot batch of shop.{table} at {start_ts}: {found}")
    assert not problems, "\n".join(problems)


CHURN = 12


def test_regions_split_and_leaders_move_under_the_snapshot_read(env: Env) -> None:
    env.pg.kv_faults.clear()  # only the churn's errors: a ServerIsBusy first would hide them
    errors_before = env.pg.kv_stats.region_errors()
    churned_before = dict(env.pg.kv_faults.churned)
    regions_before = len(env.pg.regions())
    # Every other scan of the snapshot's parts (after the key-only sampling that plans them)
    # first has its region split in the middle of the keys left, or its leader moved.
    env.pg.kv_churn(every=2, times=CHURN)
    start_ts = env.pg.now()
    run = start_run(env, "churn", start_ts)
    try:
        env.pg.start_workload(RATE)
        run.wait_for("snapshot done", lambda c: c["snapshot_done"], CATCH_UP)
        churned = {k: v - churned_before.get(k, 0) for k, v in env.pg.kv_faults.churned.items()}
        errors = {k: v - errors_before.get(k, 0) for k, v in env.pg.kv_stats.region_errors().items()}
        # The faults happened while the parts were read, and the scans met them.
        assert sum(churned.values()) == CHURN, f"the snapshot's scans did not all meet the churn: {churned}"
        assert churned.get("split", 0) >= CHURN // 4 and churned.get("leader", 0) >= CHURN // 4, churned
        assert errors.get("epoch_not_match", 0) >= churned["split"], errors
        assert errors.get("not_leader", 0) >= churned["leader"], errors
        assert len(env.pg.regions()) >= regions_before + churned["split"]
        time.sleep(2)
        checkpoint = settle(env, run)
        assert_snapshot_exact(env, "churn", start_ts)
        assert_equal_at(env, "churn", checkpoint, start_ts)
        # The reader followed the region errors: no part failed and was read again.
        parts = [part for _, part in snapshot_files(env, "churn", start_ts).reads()]
        assert len(parts) == len(set(parts))
    finally:
        env.pg.kv_churn(1, 0)
        env.pg.stop_workload()
        run.stop()


def _txn(env: Env, table: str, rows: list[dict[str, Any]], label: str) -> Transaction:
    """A transaction (start ts taken now) that rewrites ``rows`` of ``shop.<table>``, not
    prewritten yet. Its locks live long enough that only its own outcome decides it."""
    definition = env.pg.catalog.find("shop", table)
    name = "name" if table == "customers" else next(c.name for c in definition.columns[1:] if c.ft.tp == 15)
    txn = env.pg.begin(ttl_ms=300_000)
    for row in rows:
        txn.put(row_key(definition, row["id"]), encode_row_value(definition, {**row, name: label}))
    return txn


def _fed(env: Env, key: bytes) -> bool:
    """Whether a change feed is registered on the region of raw ``key``."""
    from cdcflow.plugins.sources.playground._keys import encode_key

    return any(sub.covers(encode_key(key)) and sub.initialized for sub in env.pg.hub.subscriptions())


def test_locks_at_the_snapshot_ts_committed_below_or_above_it_or_rolled_back(env: Env) -> None:
    """Locks of transactions that started before T, in the two ways a snapshot meets them.

    Locks held when the changefeed starts hold its feeds' resolved ts below T, so the
    spans do not catch up and the snapshot does not start before they are decided: one
    commits below T (its commit ts taken before T), one above T, one rolls back. Locks
    prewritten late (start ts before T, prewrite once the snapshot is planned, as a slow
    client does) are met by the snapshot's reader, which checks the transaction, finds
    it alive and waits: one then commits (above T, as a commit ts after the prewrite
    must be) and one rolls back. The snapshot batch equals the playground at T."""
    customers = env.pg.snapshot("customers")[300:309]
    held = [_txn(env, "customers", customers[i : i + 3], f"held-{i}") for i in (0, 3, 6)]
    for txn in held:
        txn.prewrite()
    last_table = max(TABLES, key=env.pg.table_id)  # read last: its keys are the highest
    tail = env.pg.snapshot(last_table)[-4:]
    late = [_txn(env, last_table, tail[i : i + 2], f"late-{i}") for i in (0, 2)]
    below_commit_ts = env.pg.now()  # taken before T: `held[0]` commits under the snapshot ts
    start_ts = env.pg.now()
    run = start_run(env, "locks", start_ts)
    snapshot = snapshot_files(env, "locks", start_ts)
    table = env.pg.catalog.find("shop", "customers")
    try:
        deadline = time.monotonic() + CATCH_UP
        while not _fed(env, row_key(table, customers[0]["id"])):
            assert run.proc is not None and run.proc.poll() is None, run.log_tail()
            assert time.monotonic() < deadline, f"no feed on the locked rows: {run.log_tail()}"
            time.sleep(0.1)
        assert snapshot.plan() is None, "the snapshot was planned while locks below T were held"
        env.pg.cluster.mvcc.commit(held[0].keys, held[0].start_ts, below_commit_ts)
        held[1].commit_prewritten()
        held[2].rollback()
        while snapshot.plan() is None:
            assert run.proc is not None and run.proc.poll() is None, run.log_tail()
            assert time.monotonic() < deadline, f"the snapshot was not planned: {run.log_tail()}"
            time.sleep(0.05)
        for txn in late:
            txn.prewrite()
        # The reader meets each late lock and asks about its transaction; then it is decided.
        outcome = {late[0].start_ts: late[0].commit_prewritten, late[1].start_ts: late[1].rollback}
        while outcome:
            for start in [s for s in outcome if env.pg.kv_stats.txn_checks(s)]:
                outcome.pop(start)()
            assert run.proc is not None and run.proc.poll() is None, run.log_tail()
            assert time.monotonic() < deadline, f"the snapshot's reader met no late lock: {run.log_tail()}"
            time.sleep(0.05)
        run.wait_for("snapshot done", lambda c: c["snapshot_done"], CATCH_UP)
        assert held[0].start_ts < below_commit_ts < start_ts < held[1].commit_ts < late[0].commit_ts
        env.pg.start_workload(RATE)
        time.sleep(2)
        checkpoint = settle(env, run)
        at_t = {row["id"]: row["name"] for row in env.pg.snapshot("customers", start_ts)}
        assert [at_t[row["id"]] for row in customers[:3]] == ["held-0"] * 3
        assert not {at_t[row["id"]] for row in customers[3:]} & {"held-3", "held-6"}
        assert_snapshot_exact(env, "locks", start_ts)
        assert_equal_at(env, "locks", checkpoint, start_ts)
    finally:
        env.pg.stop_workload()
        run.stop()
        for txn in (*held, *late):  # a failed test leaves no lock to the next
            if any(lock.start_ts == txn.start_ts for _, lock in env.pg.locks()):
                txn.rollback()
