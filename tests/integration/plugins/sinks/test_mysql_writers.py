"""Several writers of one changefeed (one pipeline per capture, each with its own batch
ids) into one MariaDB: each recognises its own replays only, and rows another writer
may have applied are upserts. Also the upgrade of a checkpoint schema keyed by
changefeed alone.

Batches are written from the driver (``write_batch``) or, as on Spark, by partition
writers of the pickled task writer (``write_in_tasks``); both paths are checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from cdcflow.core.data.events import MicroBatch, RowChange
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.testing import insert
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from tests.fixtures.mariadb import MariaDB, new_database
from tests.integration.plugins.sinks.test_mysql_sink import fetch
from tests.integration.plugins.sinks.test_mysql_task_writer import write_in_tasks

pytestmark = pytest.mark.integration

PATHS = ("driver", "tasks")
Write = Callable[[MySQLSink, MicroBatch], None]


def writer(server: MariaDB, cid: str, writer_id: str, *, inherits: bool = False, **options: Any) -> MySQLSink:
    """The sink of one capture's pipeline, opened as writer ``writer_id``."""
    sink = MySQLSink(MySQLSinkConfig(uri=server.uri, **options))
    sink.open(SinkContext(cid, writer_id=writer_id, writer_inherits=inherits))
    return sink


def write_for(path: str) -> Write:
    def write(sink: MySQLSink, batch: MicroBatch) -> None:
        if path == "driver":
            sink.write_batch(batch)
        else:
            write_in_tasks(sink, batch)

    return write


def tables(server: MariaDB, db: str) -> None:
    with server.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, v INT)")
        cur.execute("CREATE TABLE notes (id INT PRIMARY KEY, v INT)")


def run_sql(server: MariaDB, db: str, *statements: str) -> None:
    with server.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)


def rows(db: str, table: str, ids: Sequence[int], first_ts: int, step: int = 10) -> list[RowChange]:
    return [insert(db, table, {"id": i, "v": i}, commit_ts=first_ts + n * step) for n, i in enumerate(ids)]


def ids(server: MariaDB, db: str, table: str) -> list[int]:
    return [r[0] for r in fetch(server, f"SELECT id FROM `{db}`.`{table}`")]


@pytest.mark.parametrize("path", PATHS)
def test_a_writer_with_lower_batch_ids_and_ts_than_another_writes_all_its_rows(mariadb: MariaDB, path: str) -> None:
    db = new_database(mariadb)
    cid, write = f"two-{db}", write_for(path)
    tables(mariadb, db)
    a, b = writer(mariadb, cid, "capture-a"), writer(mariadb, cid, "capture-b")
    # Capture A's pipeline is far ahead: batch 50, flushed up to ts 1000.
    write(a, MicroBatch(cid, 50, 900, 1000, rows=rows(db, "orders", range(5), 910)))
    # Capture B's batch 3 ends below it, at 900: not a replay of anything B wrote.
    b_batch = MicroBatch(cid, 3, 700, 900, rows=rows(db, "notes", range(5), 710))
    write(b, b_batch)
    assert ids(mariadb, db, "notes") == [0, 1, 2, 3, 4]
    assert ids(mariadb, db, "orders") == [0, 1, 2, 3, 4]
    a.close()
    b.close()

    # B restarts on the same directory (same writer) and Spark replays its batch 3: skipped,
    # so a row deleted downstream since stays deleted.
    run_sql(mariadb, db, "DELETE FROM notes WHERE id = 0")
    b = writer(mariadb, cid, "capture-b")
    write(b, b_batch)
    b.close()
    assert ids(mariadb, db, "notes") == [1, 2, 3, 4]
    flushed = fetch(
        mariadb, f"SELECT writer_id, flushed_batch_id, flushed_ts FROM cdcflow.checkpoint WHERE changefeed_id = '{cid}'"
    )
    assert flushed == [("capture-a", 50, 1000), ("capture-b", 3, 900)]


@pytest.mark.parametrize("path", PATHS)
def test_rows_another_writer_applied_in_part_are_upserts(mariadb: MariaDB, path: str) -> None:
    """Capture A dies in the middle of a batch of ``orders``; the table moves to capture B
    (open all along), which re-sends it from the table's checkpoint: no duplicate key."""
    db = new_database(mariadb)
    cid, write = f"moved-{db}", write_for(path)
    tables(mariadb, db)
    a, b = writer(mariadb, cid, "capture-a", max_txn_row=2), writer(mariadb, cid, "capture-b", max_txn_row=2)
    write(b, MicroBatch(cid, 3, 700, 900, rows=rows(db, "notes", range(3), 710)))
    write(a, MicroBatch(cid, 50, 900, 1000, rows=rows(db, "orders", range(3), 910)))
    # A's batch 51: a partition writer applies two transactions of its rows, then A dies.
    moved = rows(db, "orders", range(3, 13), 1010)
    head = MicroBatch(cid, 51, 1000, 1200)
    part = a.task_writer([moved[0].table]).open(head, 0)
    part.write(moved[:7])
    part.close()
    a.close()
    applied = ids(mariadb, db, "orders")
    assert applied[:4] == [0, 1, 2, 3] and len(applied) < 13, applied  # partly applied

    # B's next batch carries the table from its checkpoint (1000), and a row of its own table.
    write(b, MicroBatch(cid, 4, 900, 1300, rows=[*moved, *rows(db, "notes", [3], 1250)]))
    b.close()
    assert ids(mariadb, db, "orders") == list(range(13))
    assert ids(mariadb, db, "notes") == [0, 1, 2, 3]


@pytest.mark.parametrize("path", PATHS)
def test_snapshot_ranges_of_one_writer_are_each_written(mariadb: MariaDB, path: str) -> None:
    """A capture delivers several ranges of a snapshot at ts T, each with its own negative
    batch id, in no order: none is taken for a replay of another; each one's replay is."""
    db = new_database(mariadb)
    cid, write = f"ranges-{db}", write_for(path)
    tables(mariadb, db)
    t = 5000
    sink = writer(mariadb, cid, "capture-a")
    write(sink, MicroBatch(cid, -2, t - 1, t - 1))
    first = MicroBatch(cid, -1500, t, t, rows=rows(db, "orders", range(4), t, step=0))
    second = MicroBatch(cid, -2000, t, t, rows=rows(db, "notes", range(4), t, step=0))
    write(sink, first)
    write(sink, second)
    assert ids(mariadb, db, "orders") == [0, 1, 2, 3]
    assert ids(mariadb, db, "notes") == [0, 1, 2, 3]
    sink.close()
    # Delivered again after a restart before the range was marked delivered: skipped.
    run_sql(mariadb, db, "DELETE FROM notes WHERE id = 0")
    sink = writer(mariadb, cid, "capture-a", max_txn_row=1)
    write(sink, second)
    sink.close()
    assert ids(mariadb, db, "notes") == [1, 2, 3]


OLD_CHECKPOINT = (
    "CREATE TABLE checkpoint (changefeed_id VARCHAR(255) NOT NULL PRIMARY KEY,"
    " flushed_batch_id BIGINT NOT NULL DEFAULT -1, flushed_ts BIGINT UNSIGNED NOT NULL DEFAULT 0,"
    " applying_batch_id BIGINT NULL, applying_ts BIGINT UNSIGNED NULL,"
    " updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3))"
)
OLD_PARTITIONS = (
    "CREATE TABLE batch_partition (changefeed_id VARCHAR(255) NOT NULL, batch_id BIGINT NOT NULL,"
    " partition_id INT NOT NULL, end_ts BIGINT UNSIGNED NOT NULL, flushed TINYINT(1) NOT NULL DEFAULT 0,"
    " tables MEDIUMTEXT NULL,"
    " updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),"
    " PRIMARY KEY (changefeed_id, batch_id, partition_id))"
)


@pytest.mark.parametrize("path", PATHS)
def test_an_upgraded_checkpoint_schema_keeps_protecting_replays(mariadb: MariaDB, path: str) -> None:
    """Tables made by the version keyed by changefeed alone: the capture restarting on its
    old directory takes their rows over (its replays are still recognised), and another
    capture starts its own rows, upserting what may be downstream."""
    db, schema = new_database(mariadb), new_database(mariadb)
    cid, write = f"old-{db}", write_for(path)
    tables(mariadb, db)
    run_sql(
        mariadb,
        schema,
        OLD_CHECKPOINT,
        OLD_PARTITIONS,
        f"INSERT INTO checkpoint (changefeed_id, flushed_batch_id, flushed_ts) VALUES ('{cid}', 5, 1000)",
        # Batch 6 was begun (partition 0) when the old version stopped.
        f"INSERT INTO batch_partition (changefeed_id, batch_id, partition_id, end_ts) VALUES ('{cid}', 6, 0, 1100)",
    )
    # What the old version applied: batch 5 whole, batch 6 in part.
    run_sql(mariadb, db, *(f"INSERT INTO orders VALUES ({i}, {i})" for i in (1, 2, 3, 4, 5)))
    old = writer(mariadb, cid, "restarted", inherits=True, checkpoint_schema=schema)
    other = writer(mariadb, cid, "other", inherits=True, checkpoint_schema=schema)

    # The restarted capture's Spark replays batch 5 (row 0 deleted downstream since): skipped.
    write(old, MicroBatch(cid, 5, 900, 1000, rows=rows(db, "orders", range(5), 910)))
    assert ids(mariadb, db, "orders") == [1, 2, 3, 4, 5]
    # ... and batch 6, begun before: upserts, no duplicate key.
    write(old, MicroBatch(cid, 6, 1000, 1100, rows=rows(db, "orders", [5, 6], 1010)))
    assert ids(mariadb, db, "orders") == [1, 2, 3, 4, 5, 6]
    # The other capture's batch 2 (below the old row's ids and ts) is written, as upserts.
    run_sql(mariadb, db, "INSERT INTO notes VALUES (0, 0)")
    write(other, MicroBatch(cid, 2, 700, 900, rows=rows(db, "notes", range(3), 710)))
    assert ids(mariadb, db, "notes") == [0, 1, 2]
    old.close()
    other.close()

    writers = fetch(mariadb, f"SELECT writer_id, flushed_batch_id, flushed_ts FROM `{schema}`.checkpoint")
    assert writers == [("other", 2, 900), ("restarted", 6, 1100)]
    keys = fetch(
        mariadb,
        "SELECT table_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics"
        f" WHERE table_schema = '{schema}' AND index_name = 'PRIMARY' GROUP BY table_name",
    )
    assert dict(keys)["checkpoint"] == "changefeed_id,writer_id"
    assert dict(keys)["batch_partition"] == "changefeed_id,writer_id,batch_id,partition_id"


@pytest.mark.parametrize("path", PATHS)
def test_snapshot_ranges_of_a_keyless_table_are_each_written_once(mariadb: MariaDB, path: str) -> None:
    """Every range of a key-less table is a part of one "transaction" at (T, T): a range
    applied does not make the next one look applied, and each one's replay is skipped."""
    db = new_database(mariadb)
    cid, write = f"keyless-{db}", write_for(path)
    run_sql(mariadb, db, "CREATE TABLE orders (msg VARCHAR(8), n INT)")
    t = 7000

    def part(batch_id: int, first: int) -> MicroBatch:
        rows = [
            insert(db, "orders", {"msg": f"m{i}", "n": i}, commit_ts=t, start_ts=t) for i in range(first, first + 3)
        ]
        return MicroBatch(cid, batch_id, t, t, rows=rows)

    a, b = writer(mariadb, cid, "capture-a"), writer(mariadb, cid, "capture-b")
    write(a, part(-1500, 0))
    write(a, part(-1400, 3))  # a higher id than the one before, on the same capture
    write(b, part(-2000, 6))  # another capture
    write(b, part(-1000, 9))
    # A range delivered again (by a capture restarted before it marked it delivered, or by
    # the next capture after its first died): its rows are not applied twice.
    write(a, part(-1400, 3))
    write(b, part(-1500, 0))
    a.close()
    b.close()
    assert fetch(mariadb, f"SELECT n FROM `{db}`.orders") == [(i,) for i in range(12)]
