"""The MySQL sink's partition writers (the Spark-task path) against a real MariaDB.

Batches are cut by the test kit, then written the way the pipeline writes them
in tasks: the sink's task writer is pickled (as for Spark's workers), each
partition (rows partitioned by table) is written through its own writer and
connection, and the driver's ``commit_batch`` applies the DDL.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from cdcflow.core.data.events import DDLEvent, MicroBatch, RowChange, TableName
from cdcflow.core.data.sink import PartitionWriter, SinkContext, TaskWriter
from cdcflow.core.errors import CdcflowError, DownstreamUnavailableError
from cdcflow.core.testing import ListSink, ListSource, drive, insert, update
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from cdcflow.plugins.sinks.mysql.tasks import MySQLPartitionWriter
from tests.fixtures.mariadb import MariaDB, new_database
from tests.fixtures.workload import Workload, make_workload
from tests.integration.plugins.sinks.test_mysql_sink import assert_replicated, fetch

pytestmark = pytest.mark.integration

#: Which partition a table's rows go to (the pipeline hashes the table id; any fixed map will do).
PARTITION_OF = {"orders": 0, "notes": 1}


def batches_of(w: Workload, cid: str) -> list[MicroBatch]:
    """The workload cut into micro-batches (rows and DDL) as the runtime cuts them."""
    recorder = ListSink()
    asyncio.run(drive(ListSource.of(w.events), [recorder], changefeed_id=cid))
    return [recorder.batches[i] for i in sorted(recorder.batches)]


def sink_of(server: MariaDB, cid: str, restart_ts: int = 0, **options: Any) -> MySQLSink:
    sink = MySQLSink(MySQLSinkConfig(uri=server.uri, **options))
    sink.open(SinkContext(cid, restart_ts=restart_ts))
    return sink


Wrap = Callable[[TaskWriter], TaskWriter]


def write_in_tasks(
    sink: MySQLSink, batch: MicroBatch, *, partitions: int = 2, wrap: Wrap | None = None, commit: bool = True
) -> list[PartitionWriter]:
    """Write ``batch`` as the pipeline does on Spark; returns the partition writers used."""
    assert sink.task_partitioning() == "table"
    tables = sorted({row.table for row in batch.rows})
    writer = pickle.loads(pickle.dumps(sink.task_writer(tables)))
    if wrap is not None:
        writer = wrap(writer)
    head = MicroBatch(batch.changefeed_id, batch.batch_id, batch.start_ts, batch.end_ts)
    by_partition: list[list[RowChange]] = [[] for _ in range(partitions)]
    for row in batch.rows:
        by_partition[PARTITION_OF[row.table.table] % partitions].append(row)
    opened: list[PartitionWriter] = []
    errors: list[CdcflowError] = []
    for partition, rows in enumerate(by_partition):
        if not rows:
            continue
        try:
            part = writer.open(head, partition)
        except CdcflowError as exc:
            errors.append(exc)
            continue
        opened.append(part)
        try:
            for i in range(0, len(rows), 3):  # rows come in chunks
                part.write(rows[i : i + 3])
            part.flush()
        except CdcflowError as exc:
            errors.append(exc)
        finally:
            part.close()
    if errors:
        raise errors[0]
    if commit:
        sink.commit_batch(MicroBatch(batch.changefeed_id, batch.batch_id, batch.start_ts, batch.end_ts, ddl=batch.ddl))
    return opened


def test_two_partitions_equal_a_single_write_batch(mariadb: MariaDB) -> None:
    tasks_db, single_db = new_database(mariadb), new_database(mariadb)
    w_tasks, w_single = make_workload(tasks_db, txns=200), make_workload(single_db, txns=200)
    sink = sink_of(mariadb, f"t-{tasks_db}", **{"max_txn_row": 4})
    batches = batches_of(w_tasks, f"t-{tasks_db}")
    assert any(b.ddl for b in batches) and len(batches) > 5
    for batch in batches:
        write_in_tasks(sink, batch)
    sink.close()

    single = sink_of(mariadb, f"s-{single_db}", **{"max_txn_row": 4})
    for batch in batches_of(w_single, f"s-{single_db}"):
        single.write_batch(batch)
    single.close()

    assert_replicated(mariadb, w_tasks)
    assert_replicated(mariadb, w_single)
    for table in ("orders", "notes"):
        assert fetch(mariadb, f"SELECT * FROM `{tasks_db}`.{table}") == fetch(
            mariadb, f"SELECT * FROM `{single_db}`.{table}"
        )
    query = "SELECT flushed_ts, applying_ts FROM cdcflow.checkpoint WHERE changefeed_id = "
    assert fetch(mariadb, query + f"'t-{tasks_db}'") == [(w_tasks.last_ts, None)]
    # The partitions of flushed batches are not kept.
    assert fetch(mariadb, f"SELECT * FROM cdcflow.batch_partition WHERE changefeed_id = 't-{tasks_db}'") == []


class _FailFlushOnce(TaskWriter):
    """Partition 1's first writer applies what it is handed, then fails at flush
    (the downstream went away before the partition's last transaction)."""

    def __init__(self, inner: TaskWriter, state: dict[str, Any]) -> None:
        self.inner = inner
        self.state = state

    def open(self, batch: MicroBatch, partition: int) -> PartitionWriter:
        writer = self.inner.open(batch, partition)
        self.state.setdefault("writers", []).append((partition, writer))
        if partition == 1 and not self.state.get("failed"):
            self.state["failed"] = True
            return _FailingFlush(writer)
        return writer


class _FailingFlush(PartitionWriter):
    def __init__(self, inner: PartitionWriter) -> None:
        self.inner = inner

    def write(self, rows: Sequence[RowChange]) -> None:
        self.inner.write(rows)

    def flush(self) -> None:
        raise DownstreamUnavailableError("the downstream went away during the flush")

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("resume", ["retried", "restarted"])
def test_a_partition_failed_after_part_of_its_rows_is_replayed_with_upserts(mariadb: MariaDB, resume: str) -> None:
    db = new_database(mariadb)
    w = make_workload(db, txns=200, resolve_every=40)
    cid = f"fail-{db}"
    batches = batches_of(w, cid)
    failing = max(range(len(batches)), key=lambda i: sum(r.table.table == "notes" for r in batches[i].rows))
    sink = sink_of(mariadb, cid, max_txn_row=4)
    for batch in batches[:failing]:
        write_in_tasks(sink, batch)
    batch = batches[failing]
    state: dict[str, Any] = {}
    with pytest.raises(DownstreamUnavailableError):
        write_in_tasks(sink, batch, wrap=lambda inner: _FailFlushOnce(inner, state))
    ((_, first_p0), (_, first_p1)) = state["writers"]
    assert isinstance(first_p0, MySQLPartitionWriter) and isinstance(first_p1, MySQLPartitionWriter)
    assert 0 < first_p1.rows_applied < sum(r.table.table == "notes" for r in batch.rows), "not a partial write"
    records = f"SELECT partition_id, flushed FROM cdcflow.batch_partition WHERE changefeed_id = '{cid}'"
    assert fetch(mariadb, records) == [(0, 1), (1, 0)]

    if resume == "restarted":
        sink.close()
        sink = sink_of(mariadb, cid, restart_ts=batch.start_ts, max_txn_row=4)
    state["writers"] = []
    write_in_tasks(sink, batch, wrap=lambda inner: _FailFlushOnce(inner, state))
    ((_, again_p0), (_, again_p1)) = state["writers"]
    assert isinstance(again_p0, MySQLPartitionWriter) and isinstance(again_p1, MySQLPartitionWriter)
    assert again_p0.rows_applied == 0, "partition 0 flushed before: its rows are skipped"
    assert again_p1.replay and again_p1.rows_applied == sum(r.table.table == "notes" for r in batch.rows)
    for later in batches[failing + 1 :]:
        write_in_tasks(sink, later)
    sink.close()
    assert_replicated(mariadb, w)
    assert fetch(mariadb, records) == []


def test_a_replay_of_flushed_partitions_and_batches_is_skipped(mariadb: MariaDB) -> None:
    db = new_database(mariadb)
    w = make_workload(db, txns=120, alter=False)
    cid = f"replay-{db}"
    batches = batches_of(w, cid)
    batches = batches[: max(i for i, b in enumerate(batches) if b.rows) + 1]
    sink = sink_of(mariadb, cid)
    for batch in batches[:-1]:
        write_in_tasks(sink, batch)
    # The last batch's partitions flush, then the driver dies before commit_batch.
    last = batches[-1]
    write_in_tasks(sink, last, commit=False)
    sink.close()

    # A restart from 0 replays every batch (plain INSERTs would fail on duplicate keys if applied).
    sink = sink_of(mariadb, cid)
    for batch in batches[:-1]:
        writers = write_in_tasks(sink, batch)
        assert all(isinstance(p, MySQLPartitionWriter) and p.skipped for p in writers)
    writers = write_in_tasks(sink, last)
    assert writers and all(isinstance(p, MySQLPartitionWriter) and p.rows_applied == 0 for p in writers)
    sink.close()
    assert fetch(mariadb, f"SELECT id, name, qty FROM `{db}`.orders") == w.expected_orders(with_note=False)
    assert fetch(mariadb, f"SELECT msg, n FROM `{db}`.notes") == w.expected_notes()
    query = f"SELECT flushed_ts, applying_ts FROM cdcflow.checkpoint WHERE changefeed_id = '{cid}'"
    assert fetch(mariadb, query) == [(last.end_ts, None)]


def test_a_checkpoint_schema_of_an_earlier_version_keeps_working(mariadb: MariaDB) -> None:
    """A checkpoint schema made before partitions were recorded gains their table on open."""
    db, schema = new_database(mariadb), new_database(mariadb)
    cid = f"old-{db}"
    with mariadb.connect(schema, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE checkpoint (changefeed_id VARCHAR(255) NOT NULL PRIMARY KEY,"
            " flushed_batch_id BIGINT NOT NULL DEFAULT -1, flushed_ts BIGINT UNSIGNED NOT NULL DEFAULT 0,"
            " applying_batch_id BIGINT NULL, applying_ts BIGINT UNSIGNED NULL,"
            " updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3))"
        )
        cur.execute(f"INSERT INTO checkpoint (changefeed_id, flushed_batch_id, flushed_ts) VALUES ('{cid}', 3, 5)")
    w = make_workload(db, txns=30, alter=False)
    sink = sink_of(mariadb, cid, checkpoint_schema=schema)
    for batch in batches_of(w, cid):
        write_in_tasks(sink, batch)
    sink.close()
    assert fetch(mariadb, f"SELECT msg, n FROM `{db}`.notes") == w.expected_notes()
    assert fetch(mariadb, f"SELECT flushed_ts FROM `{schema}`.checkpoint") == [(w.last_ts,)]


def test_ddl_of_a_batch_written_in_tasks_runs_after_its_rows_once(mariadb: MariaDB) -> None:
    """The DDL runs from the driver after every partition; replayed after it ran (the driver
    died before recording the batch), the rows below it are skipped and the DDL is not refused."""
    db = new_database(mariadb)
    cid = f"ddl-{db}"
    with mariadb.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, v VARCHAR(8), gone VARCHAR(8))")
        cur.execute("CREATE TABLE notes (msg VARCHAR(8), n INT)")
    rows = [
        insert(db, "orders", {"id": 1, "v": "a", "gone": "x"}, commit_ts=50),
        insert(db, "notes", {"msg": "m", "n": 1}, commit_ts=52),
        update(db, "orders", {"id": 1, "v": "a", "gone": "x"}, {"id": 1, "v": "b", "gone": "y"}, commit_ts=55),
    ]
    drop = DDLEvent(60, f"ALTER TABLE `{db}`.`orders` DROP COLUMN `gone`", TableName(db, "orders"))
    batch = MicroBatch(cid, 1, 10, 60, rows, [drop])
    sink = sink_of(mariadb, cid, restart_ts=10)
    write_in_tasks(sink, batch)
    sink.close()
    # The checkpoint row is set back as if the final mark had not been written.
    with mariadb.connect("cdcflow", autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE checkpoint SET flushed_ts = 59, applying_ts = 60 WHERE changefeed_id = '{cid}'")
    sink = sink_of(mariadb, cid, restart_ts=10)
    writers = write_in_tasks(sink, batch)
    assert all(isinstance(p, MySQLPartitionWriter) and p.rows_applied == 0 for p in writers)
    sink.close()
    assert fetch(mariadb, f"SELECT * FROM `{db}`.orders") == [(1, "b")]
    assert fetch(mariadb, f"SELECT * FROM `{db}`.notes") == [("m", 1)]
    query = f"SELECT flushed_ts, applying_ts FROM cdcflow.checkpoint WHERE changefeed_id = '{cid}'"
    assert fetch(mariadb, query) == [(60, None)]
