"""The MySQL sink against a real MariaDB: final state, replay, crash, outage, errors."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pymysql
import pytest

from cdcflow.core.data.events import DDLEvent, MicroBatch, TableName
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.errors import DownstreamUnavailableError, ErrorCode, Retryable
from cdcflow.core.testing import ListSource, SimulatedCrash, drive, insert, update
from cdcflow.plugins.sinks.mysql import ConstraintViolationError, DownstreamRejectedError, MySQLSink, MySQLSinkConfig
from tests import REPO
from tests.fixtures.mariadb import MariaDB, new_database
from tests.fixtures.workload import Workload, make_workload
from tests.integration.plugins.sinks import mysql_capture

pytestmark = pytest.mark.integration


def sink_for(server: MariaDB, **options: Any) -> MySQLSink:
    uri = server.uri + "?" + "&".join(f"{k}={v}" for k, v in options.items())
    return MySQLSink(MySQLSinkConfig(**MySQLSink.options_from_uri(uri)))


def fetch(server: MariaDB, sql: str) -> list[tuple[Any, ...]]:
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return sorted(tuple(r) for r in cur.fetchall())
    finally:
        conn.close()


def assert_replicated(server: MariaDB, w: Workload) -> None:
    assert fetch(server, f"SELECT id, name, qty, note FROM `{w.schema}`.orders") == w.expected_orders()
    assert fetch(server, f"SELECT msg, n FROM `{w.schema}`.notes") == w.expected_notes()


@pytest.mark.parametrize("workers", [1, 8])
def test_workload_reaches_the_expected_final_state(mariadb: MariaDB, mysql_database: str, workers: int) -> None:
    w = make_workload(mysql_database, txns=300)
    sink = sink_for(mariadb, **{"worker-count": workers, "max-txn-row": 16})
    result = asyncio.run(drive(ListSource.of(w.events), [sink], changefeed_id=mysql_database))
    assert result.checkpoint_ts == w.last_ts
    assert_replicated(mariadb, w)
    flushed = fetch(
        mariadb, f"SELECT flushed_ts, applying_ts FROM cdcflow.checkpoint WHERE changefeed_id = '{mysql_database}'"
    )
    assert flushed == [(w.last_ts, None)]


def test_replayed_batch_is_recognised_and_skipped(mariadb: MariaDB, mysql_database: str) -> None:
    w = make_workload(mysql_database, txns=40, alter=False)
    cid = f"replay-{mysql_database}"
    result = asyncio.run(drive(ListSource.of(w.events), [sink_for(mariadb)], changefeed_id=cid))
    # A restart from 0 replays every batch with the same ids: all are recognised, none applied twice
    # (plain INSERTs would fail with duplicate keys if they were).
    again = asyncio.run(drive(ListSource.of(w.events), [sink_for(mariadb)], changefeed_id=cid))
    assert again.checkpoint_ts == result.checkpoint_ts
    assert_replicated_no_note(mariadb, w)


def assert_replicated_no_note(server: MariaDB, w: Workload) -> None:
    assert fetch(server, f"SELECT id, name, qty FROM `{w.schema}`.orders") == w.expected_orders(with_note=False)
    assert fetch(server, f"SELECT msg, n FROM `{w.schema}`.notes") == w.expected_notes()


class CrashingMySQLSink(MySQLSink):
    """Dies half-way through one batch: some of its transactions committed, the batch not flushed."""

    crash_on: int = -1

    def write_batch(self, batch: MicroBatch) -> None:
        if batch.batch_id != self.crash_on:
            super().write_batch(batch)
            return
        downstream, checkpoint = self._require_open()
        downstream.run(0, "start", lambda c, _r: checkpoint.mark_applying(c, batch.batch_id, batch.end_ts))
        self._apply_rows(batch.rows[: len(batch.rows) // 2])
        raise SimulatedCrash(f"crash in batch {batch.batch_id}")


@pytest.mark.parametrize("restart_from_zero", [False, True])
def test_crash_mid_batch_then_resume_from_checkpoint(
    mariadb: MariaDB, mysql_database: str, restart_from_zero: bool
) -> None:
    w = make_workload(mysql_database, txns=200)
    cid = f"crash-{mysql_database}"
    crashing = CrashingMySQLSink(MySQLSinkConfig(uri=mariadb.uri, worker_count=4))
    crashing.crash_on = 7
    with pytest.raises(SimulatedCrash):
        asyncio.run(drive(ListSource.of(w.events), [crashing], changefeed_id=cid))
    query = "SELECT flushed_batch_id, flushed_ts, applying_ts FROM cdcflow.checkpoint WHERE changefeed_id = "
    ((flushed_batch, flushed_ts, applying_ts),) = fetch(mariadb, query + f"'{cid}'")
    assert flushed_batch == 6 and applying_ts is not None and applying_ts > flushed_ts
    # The runtime resumes from its checkpoint (the last flushed batch), or from further back.
    start_ts, first_id = (0, 0) if restart_from_zero else (flushed_ts, flushed_batch + 1)
    resumed = asyncio.run(
        drive(
            ListSource.of(w.events),
            [sink_for(mariadb, **{"worker-count": 4})],
            changefeed_id=cid,
            start_ts=start_ts,
            first_batch_id=first_id,
        )
    )
    assert resumed.checkpoint_ts == w.last_ts
    assert_replicated(mariadb, w)


class CrashAfterDDL(MySQLSink):
    """Dies right after the first DDL it ran, before the batch is recorded as flushed."""

    crashed = False

    def _apply_ddl(self, ddl: DDLEvent) -> None:
        super()._apply_ddl(ddl)
        if not self.crashed:
            self.crashed = True
            raise SimulatedCrash(f"crash after the DDL at ts {ddl.commit_ts}")


@pytest.mark.parametrize("resume", ["retried", "restarted"])
def test_a_batch_written_again_after_its_drop_column_ran_converges(
    mariadb: MariaDB, mysql_database: str, resume: str
) -> None:
    """The batch's rows still have the dropped column: written again after the DROP COLUMN
    (the runtime's retry on the same sink, or a replay after a restart) they must not be."""
    db, cid = mysql_database, f"ddl-{mysql_database}"
    with mariadb.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(8), gone VARCHAR(8))")
    rows = [
        insert(db, "t", {"id": 1, "v": "a", "gone": "x"}, commit_ts=50),
        update(db, "t", {"id": 1, "v": "a", "gone": "x"}, {"id": 1, "v": "b", "gone": "y"}, commit_ts=55),
        insert(db, "t", {"id": 2, "v": "c", "gone": "z"}, commit_ts=55),
    ]
    drop = DDLEvent(60, f"ALTER TABLE `{db}`.`t` DROP COLUMN `gone`", TableName(db, "t"))
    batch = MicroBatch(cid, 1, 10, 60, rows, [drop])
    crashing = CrashAfterDDL(MySQLSinkConfig(uri=mariadb.uri))
    crashing.open(SinkContext(cid, restart_ts=10))
    with pytest.raises(SimulatedCrash):
        crashing.write_batch(batch)
    if resume == "retried":
        crashing.write_batch(batch)  # the runtime's retry, on the same sink
        crashing.close()
    else:
        crashing.close()
        sink = sink_for(mariadb)
        sink.open(SinkContext(cid, restart_ts=10))
        sink.write_batch(batch)
        sink.close()
    assert fetch(mariadb, f"SELECT * FROM `{db}`.t") == [(1, "b"), (2, "c")]
    query = f"SELECT flushed_ts, applying_ts FROM cdcflow.checkpoint WHERE changefeed_id = '{cid}'"
    assert fetch(mariadb, query) == [(60, None)]


class FailMidRows(MySQLSink):
    """Applies half of the first batch's rows, then fails (as when the server goes away)."""

    failed = False

    def _apply_rows(self, rows: Any) -> None:
        if self.failed:
            super()._apply_rows(rows)
            return
        self.failed = True
        super()._apply_rows(rows[: len(rows) // 2])
        raise DownstreamUnavailableError("the server went away")


def test_a_batch_retried_by_the_same_sink_after_a_partial_write_upserts(mariadb: MariaDB, mysql_database: str) -> None:
    db, cid = mysql_database, f"retry-{mysql_database}"
    with mariadb.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(8))")
    rows = [insert(db, "t", {"id": i, "v": f"v{i}"}, commit_ts=50 + i) for i in range(6)]
    sink = FailMidRows(MySQLSinkConfig(uri=mariadb.uri))
    sink.open(SinkContext(cid, restart_ts=10))
    batch = MicroBatch(cid, 1, 10, 60, rows)
    with pytest.raises(DownstreamUnavailableError):
        sink.write_batch(batch)
    sink.write_batch(batch)  # the runtime's retry: the first three rows are downstream already
    sink.close()
    assert fetch(mariadb, f"SELECT id, v FROM `{db}`.t") == [(i, f"v{i}") for i in range(6)]


def progress(server: MariaDB, query: str) -> int:
    """The flushed batch id, -1 before the capture created its checkpoint row."""
    try:
        rows = fetch(server, query)
    except pymysql.err.ProgrammingError:
        return -1
    return int(rows[0][0]) if rows else -1


def test_sigkill_of_the_capture_then_resume(mariadb: MariaDB, mysql_database: str) -> None:
    """A capture process is killed with SIGKILL mid-run; a new one resumes from the checkpoint table."""
    cid = f"kill-{mysql_database}"
    query = f"SELECT flushed_batch_id, flushed_ts FROM cdcflow.checkpoint WHERE changefeed_id = '{cid}'"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.plugins.sinks.mysql_capture", mariadb.uri, mysql_database, cid],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 120
        while progress(mariadb, query) < 6:
            assert proc.poll() is None, "the capture ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    ((flushed_batch, flushed_ts),) = fetch(mariadb, query)
    w = make_workload(mysql_database, txns=mysql_capture.TXNS)
    assert flushed_ts < w.last_ts
    resumed = asyncio.run(
        drive(
            ListSource.of(w.events),
            [sink_for(mariadb, **{"worker-count": 4})],
            changefeed_id=cid,
            start_ts=flushed_ts,
            first_batch_id=flushed_batch + 1,
        )
    )
    assert resumed.checkpoint_ts == w.last_ts
    assert_replicated(mariadb, w)


def test_rename_table_is_applied_once_and_a_rename_into_the_filter_says_what_to_do(
    mariadb: MariaDB, mysql_database: str
) -> None:
    db, cid = mysql_database, f"rename-{mysql_database}"
    with mariadb.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(8))")
    old, new = TableName(db, "a", 7), TableName(db, "b", 7)
    rename = DDLEvent(60, f"RENAME TABLE `{db}`.`a` TO `{db}`.`b`", new, 14, renamed_from=old)
    batches = [
        MicroBatch(cid, 1, 10, 60, [insert(db, "a", {"id": 1, "v": "x"}, commit_ts=50)], [rename]),
        MicroBatch(cid, 2, 60, 70, [insert(db, "b", {"id": 2, "v": "y"}, commit_ts=65)]),
    ]
    sink = sink_for(mariadb)
    sink.open(SinkContext(cid, restart_ts=10))
    for batch in batches:
        sink.write_batch(batch)
    # Written again outside the replay window (the sink's checkpoint row gone): the RENAME
    # is recognised as applied rather than refused for the missing old table.
    with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM cdcflow.checkpoint WHERE changefeed_id = %s", (cid,))
    sink.write_batch(dataclasses.replace(batches[0], rows=[]))
    sink.close()
    assert fetch(mariadb, f"SELECT id, v FROM `{db}`.b") == [(1, "x"), (2, "y")]
    assert fetch(mariadb, f"SHOW TABLES FROM `{db}` LIKE 'a'") == []

    # Renamed into the filter from outside it: neither name downstream.
    into = DDLEvent(80, f"RENAME TABLE `{db}`.`hidden` TO `{db}`.`shown`", TableName(db, "shown", 8), 14,
                    renamed_from=TableName(db, "hidden", 8))  # fmt: skip
    sink = sink_for(mariadb)
    sink.open(SinkContext(cid, restart_ts=10))
    with pytest.raises(DownstreamRejectedError) as info:
        sink.write_batch(MicroBatch(cid, 3, 70, 80, [], [into]))
    assert f"`{db}`.`shown`" in info.value.message and "renamed into the changefeed's filter" in info.value.message
    assert info.value.retryable is Retryable.LATER
    # The operator creates the table downstream; the retry goes on.
    with mariadb.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE shown (id INT PRIMARY KEY)")
    sink.write_batch(MicroBatch(cid, 3, 70, 80, [], [into]))
    sink.close()


def test_a_rename_out_of_the_filter_renames_the_downstream_table(mariadb: MariaDB, mysql_database: str) -> None:
    db = mysql_database
    with mariadb.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(8))")
    row = insert(db, "a", {"id": 1, "v": "x"}, commit_ts=50)
    old, new = row.table, dataclasses.replace(row.table, table="archived")
    events = [
        row,
        DDLEvent(60, f"RENAME TABLE `{db}`.`a` TO `{db}`.`archived`", new, 14, renamed_from=old),
        ListSource.resolved(70),
    ]
    only_a = TableFilter([f"{db}.a"])
    source = ListSource.of(events)
    result = asyncio.run(drive(source, [sink_for(mariadb)], changefeed_id=f"out-{db}", table_filter=only_a))
    assert result.checkpoint_ts == 70
    assert fetch(mariadb, f"SELECT id, v FROM `{db}`.archived") == [(1, "x")]
    assert fetch(mariadb, f"SHOW TABLES FROM `{db}` LIKE 'a'") == []


def test_duplicate_key_outside_safe_mode_is_precise_and_rolls_back(mariadb: MariaDB, mysql_database: str) -> None:
    db = mysql_database
    with mariadb.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(8))")
        cur.execute("INSERT INTO t VALUES (2, 'other')")
    rows = [insert(db, "t", {"id": 1, "v": "a"}, commit_ts=50), insert(db, "t", {"id": 2, "v": "b"}, commit_ts=50)]
    sink = sink_for(mariadb)
    sink.open(SinkContext(f"dup-{db}", restart_ts=10))
    with pytest.raises(ConstraintViolationError) as info:
        sink.write_batch(MicroBatch(f"dup-{db}", 1, 10, 60, rows))
    sink.close()
    err = info.value
    assert err.code == ErrorCode.ErrDownstreamUnavailable
    assert err.detail["table"] == f"{db}.t" and err.detail["key"] == {"id": "2"} and err.detail["commit_ts"] == 50
    assert "commit" in err.message and f"`{db}`.`t`" in err.message
    # The whole upstream transaction was rolled back: row 1 is not there either.
    assert fetch(mariadb, f"SELECT id, v FROM `{db}`.t") == [(2, "other")]
    # The restart replays the unfinished batch with upserts, which converges.
    sink = sink_for(mariadb)
    sink.open(SinkContext(f"dup-{db}", restart_ts=10))
    sink.write_batch(MicroBatch(f"dup-{db}", 1, 10, 60, rows))
    sink.close()
    assert fetch(mariadb, f"SELECT id, v FROM `{db}`.t") == [(1, "a"), (2, "b")]


def test_safe_mode_upserts_and_values_are_parameters(mariadb: MariaDB, mysql_database: str) -> None:
    db = mysql_database
    with mariadb.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE `we``ird` (id INT PRIMARY KEY, v TEXT)")
        cur.execute("INSERT INTO `we``ird` VALUES (1, 'old')")
    hostile = "x'); DROP TABLE `we``ird`; --"
    rows = [
        insert(db, "we`ird", {"id": 1, "v": hostile}, commit_ts=20),
        update(db, "we`ird", {"id": 1, "v": hostile}, {"id": 3, "v": "%s %% \\"}, commit_ts=30),
    ]
    sink = sink_for(mariadb, **{"safe-mode": "true"})
    sink.open(SinkContext(f"safe-{db}"))
    sink.write_batch(MicroBatch(f"safe-{db}", 0, 0, 40, rows))
    sink.close()
    assert fetch(mariadb, f"SELECT id, v FROM `{db}`.`we``ird`") == [(3, "%s %% \\")]


def test_unreachable_downstream_raises_2001_after_retrying(private_mariadb: MariaDB) -> None:
    sink = sink_for(private_mariadb, **{"retry-timeout": 2, "retry-max-backoff": 0.5})
    sink.open(SinkContext("down"))
    private_mariadb.stop()
    started = time.monotonic()
    db = "x"
    with pytest.raises(DownstreamUnavailableError) as info:
        sink.write_batch(MicroBatch("down", 0, 0, 10, [insert(db, "t", {"id": 1}, commit_ts=5)]))
    assert type(info.value) is DownstreamUnavailableError and info.value.code == ErrorCode.ErrDownstreamUnavailable
    assert time.monotonic() - started >= 2
    sink.close()


class PacedSink(MySQLSink):
    """Calls ``on_batch`` before each batch, so a test can act between batches."""

    def __init__(self, config: MySQLSinkConfig, on_batch: Any) -> None:
        super().__init__(config)
        self.on_batch = on_batch

    def write_batch(self, batch: MicroBatch) -> None:
        self.on_batch(batch.batch_id)
        super().write_batch(batch)


@pytest.mark.parametrize("outage_seconds", [3.0, 30.0])
def test_downstream_outage_is_ridden_out(private_mariadb: MariaDB, outage_seconds: float) -> None:
    """The server is stopped for a while in the middle of the run and restarted; the sink
    retries with backoff and the final state is exact. 3 s keeps the suite quick; 30 s is
    the outage length operators ask about."""
    db = new_database(private_mariadb)
    w = make_workload(db, txns=120)
    outage: list[threading.Thread] = []

    def on_batch(batch_id: int) -> None:
        if batch_id == 5 and not outage:
            private_mariadb.stop()
            thread = threading.Thread(target=lambda: (time.sleep(outage_seconds), private_mariadb.start()))
            thread.start()
            outage.append(thread)

    config = MySQLSinkConfig(uri=private_mariadb.uri, worker_count=4, retry_timeout=outage_seconds + 60)
    started = time.monotonic()
    result = asyncio.run(drive(ListSource.of(w.events), [PacedSink(config, on_batch)]))
    outage[0].join()
    assert time.monotonic() - started >= outage_seconds
    assert result.checkpoint_ts == w.last_ts
    assert_replicated(private_mariadb, w)
