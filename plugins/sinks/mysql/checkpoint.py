"""The checkpoint table in the downstream: which batches are flushed.

One row per changefeed in ``{checkpoint-schema}.checkpoint``::

    changefeed_id        the changefeed
    flushed_batch_id     the batch that recorded flushed_ts
    flushed_ts           every change at or below it is applied: a batch's end ts, or
                         just below its DDL once its rows are applied
    applying_batch_id    a batch begun and not yet flushed (NULL when none)
    applying_ts          the highest end ts ever begun and not yet flushed

and one row per changefeed and key-less table in ``{checkpoint-schema}.table_progress``:
the (commit ts, start ts) of the last upstream transaction applied to it,
written in the same downstream transaction as its rows. Key-less tables are
applied serially, so this is monotonic and makes their replay exactly-once
(a REPLACE cannot be idempotent without a key).

Batches written by Spark tasks also have one row per changefeed, batch and
partition in ``{checkpoint-schema}.batch_partition`` (created beside the
others when missing, so a checkpoint schema of an earlier version keeps
working)::

    changefeed_id, batch_id, partition_id   the partition
    end_ts        the batch's end ts (a row of another end ts is of another batch)
    flushed       0 while its rows are being applied, 1 once they all are
    tables        the tables whose rows it flushed (a JSON list of
                  [schema, table, table id, physical partition id])

A partition writer records its partition as applying before its first
statement and as flushed after its last. The rows of a batch are partitioned
by table, so a table listed by a flushed partition has all its rows of the
batch downstream: a replay skips them. A partition found applying was cut
short: its replay upserts. The rows are deleted when the batch is flushed
(``mark_flushed``); until then their highest end ts counts as ``applying_ts``.

Before a batch's first statement the sink records it as *applying*; after
its last, as *flushed*. A replayed batch (its id at or below
``flushed_batch_id``: Spark replays batch ids) whose end ts is at or below
``flushed_ts`` is recognised and skipped; a newer batch's rows at or below
``flushed_ts`` are of a span that joined behind the others, not downstream
yet, and are written as upserts. After a crash, rows up to
``applying_ts`` may be partly applied, so they are applied as upserts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pymysql

from cdcflow.core.data.events import MicroBatch, TableName
from cdcflow.plugins.sinks.mysql.dml import quote, quote_param

__all__ = ["CheckpointState", "CheckpointTable", "PartitionRecord"]


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What the checkpoint table says of one changefeed."""

    flushed_batch_id: int = -1
    flushed_ts: int = 0
    applying_batch_id: int | None = None
    applying_ts: int = 0

    def replays(self, batch: MicroBatch) -> bool:
        """``batch`` is one flushed or begun before (Spark replays a batch id after a
        crash; ids only grow): its rows at or below ``flushed_ts`` are downstream. A newer
        batch's rows below it are of a span that joined behind the others: not downstream."""
        return batch.batch_id <= self.flushed_batch_id

    def has_all_of(self, batch: MicroBatch) -> bool:
        """Every row and DDL of ``batch`` is downstream: a replay at or below the flushed ts."""
        return self.replays(batch) and 0 < batch.end_ts <= self.flushed_ts


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """What the checkpoint schema says of one partition of a batch written in tasks."""

    partition: int
    flushed: bool
    tables: frozenset[TableName] = field(default_factory=frozenset)


class CheckpointTable:
    """Reads and writes the checkpoint row of one changefeed."""

    def __init__(self, schema: str, changefeed_id: str) -> None:
        self.schema = schema
        self.changefeed_id = changefeed_id
        # Every statement naming these tables runs with parameters (``()`` at least),
        # so the driver's %-formatting sees a doubled '%' of the schema name.
        self.table = f"{quote_param(schema)}.{quote('checkpoint')}"
        self.progress_table = f"{quote_param(schema)}.{quote('table_progress')}"
        self.partition_table = f"{quote_param(schema)}.{quote('batch_partition')}"

    def ensure(self, conn: pymysql.connections.Connection[Any]) -> None:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(self.schema)}")
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} ("
                "changefeed_id VARCHAR(255) NOT NULL PRIMARY KEY,"
                " flushed_batch_id BIGINT NOT NULL DEFAULT -1,"
                " flushed_ts BIGINT UNSIGNED NOT NULL DEFAULT 0,"
                " applying_batch_id BIGINT NULL,"
                " applying_ts BIGINT UNSIGNED NULL,"
                " updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)"
                ")",
                (),
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.progress_table} ("
                "changefeed_id VARCHAR(255) NOT NULL, table_name VARCHAR(600) NOT NULL,"
                " commit_ts BIGINT UNSIGNED NOT NULL, start_ts BIGINT UNSIGNED NOT NULL,"
                " PRIMARY KEY (changefeed_id, table_name))",
                (),
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.partition_table} ("
                "changefeed_id VARCHAR(255) NOT NULL, batch_id BIGINT NOT NULL, partition_id INT NOT NULL,"
                " end_ts BIGINT UNSIGNED NOT NULL, flushed TINYINT(1) NOT NULL DEFAULT 0, tables MEDIUMTEXT NULL,"
                " updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),"
                " PRIMARY KEY (changefeed_id, batch_id, partition_id))",
                (),
            )
        conn.commit()

    def read(self, conn: pymysql.connections.Connection[Any]) -> CheckpointState:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT flushed_batch_id, flushed_ts, applying_batch_id, applying_ts FROM {self.table}"
                " WHERE changefeed_id = %s",
                (self.changefeed_id,),
            )
            row = cur.fetchone()
            # Partitions of a batch not flushed yet: their rows may be downstream already.
            cur.execute(
                f"SELECT MAX(batch_id), MAX(end_ts) FROM {self.partition_table} WHERE changefeed_id = %s",
                (self.changefeed_id,),
            )
            partitions = cur.fetchone()
        conn.commit()
        begun_batch, begun_ts = (0, 0) if partitions is None or partitions[1] is None else map(int, partitions)
        flushed = CheckpointState() if row is None else CheckpointState(int(row[0]), int(row[1]))
        applying_batch = None if row is None or row[2] is None else int(row[2])
        applying_ts = 0 if row is None else int(row[3] or 0)
        if begun_ts > applying_ts:
            applying_batch, applying_ts = begun_batch, begun_ts
        return CheckpointState(flushed.flushed_batch_id, flushed.flushed_ts, applying_batch, applying_ts)

    def mark_applying(self, conn: pymysql.connections.Connection[Any], batch_id: int, end_ts: int) -> None:
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {self.table} (changefeed_id, applying_batch_id, applying_ts) VALUES (%s, %s, %s)"
                " ON DUPLICATE KEY UPDATE applying_batch_id = VALUES(applying_batch_id),"
                " applying_ts = GREATEST(COALESCE(applying_ts, 0), VALUES(applying_ts))",
                (self.changefeed_id, batch_id, end_ts),
            )
        conn.commit()

    def mark_flushed(self, conn: pymysql.connections.Connection[Any], batch_id: int, end_ts: int) -> None:
        with conn.cursor() as cur:
            # applying_ts survives until the flushed ts passes it: a replay with
            # smaller batches must still treat those rows as possibly applied.
            cur.execute(
                f"INSERT INTO {self.table} (changefeed_id, flushed_batch_id, flushed_ts) VALUES (%s, %s, %s)"
                " ON DUPLICATE KEY UPDATE"
                " applying_batch_id = IF(COALESCE(applying_ts, 0) <= VALUES(flushed_ts), NULL, applying_batch_id),"
                " applying_ts = IF(COALESCE(applying_ts, 0) <= VALUES(flushed_ts), NULL, applying_ts),"
                " flushed_batch_id = VALUES(flushed_batch_id), flushed_ts = VALUES(flushed_ts)",
                (self.changefeed_id, batch_id, end_ts),
            )
            # The partitions of the batches now flushed are needed no more.
            cur.execute(
                f"DELETE FROM {self.partition_table} WHERE changefeed_id = %s AND end_ts <= %s",
                (self.changefeed_id, end_ts),
            )
        conn.commit()

    def partitions(
        self, conn: pymysql.connections.Connection[Any], batch_id: int, end_ts: int
    ) -> list[PartitionRecord]:
        """The recorded partitions of batch ``batch_id`` ending at ``end_ts``."""
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT partition_id, flushed, tables FROM {self.partition_table}"
                " WHERE changefeed_id = %s AND batch_id = %s AND end_ts = %s",
                (self.changefeed_id, batch_id, end_ts),
            )
            rows = cur.fetchall()
        conn.commit()
        return [
            PartitionRecord(int(p), bool(flushed), frozenset(_table(t) for t in json.loads(tables or "[]")))
            for p, flushed, tables in rows
        ]

    def mark_partition_applying(
        self, conn: pymysql.connections.Connection[Any], batch_id: int, partition: int, end_ts: int
    ) -> None:
        """Record a partition as begun; a flushed record of the same batch stays flushed
        (its tables are done), one of another batch with the same id is replaced."""
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {self.partition_table} (changefeed_id, batch_id, partition_id, end_ts, flushed)"
                " VALUES (%s, %s, %s, %s, 0) ON DUPLICATE KEY UPDATE"
                " flushed = IF(end_ts = VALUES(end_ts), flushed, 0),"
                " tables = IF(end_ts = VALUES(end_ts), tables, NULL), end_ts = VALUES(end_ts)",
                (self.changefeed_id, batch_id, partition, end_ts),
            )
        conn.commit()

    def mark_partition_flushed(
        self,
        conn: pymysql.connections.Connection[Any],
        batch_id: int,
        partition: int,
        end_ts: int,
        tables: frozenset[TableName],
    ) -> None:
        names = json.dumps(sorted([[t.schema, t.table, t.table_id, t.partition_id] for t in tables], key=str))
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {self.partition_table} (changefeed_id, batch_id, partition_id, end_ts, flushed, tables)"
                " VALUES (%s, %s, %s, %s, 1, %s) ON DUPLICATE KEY UPDATE end_ts = VALUES(end_ts), flushed = 1,"
                " tables = VALUES(tables)",
                (self.changefeed_id, batch_id, partition, end_ts, names),
            )
        conn.commit()

    def table_progress(self, conn: pymysql.connections.Connection[Any], table: str) -> tuple[int, int]:
        """(commit ts, start ts) of the last transaction applied to a key-less table; call inside its transaction."""
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT commit_ts, start_ts FROM {self.progress_table} WHERE changefeed_id = %s AND table_name = %s",
                (self.changefeed_id, table),
            )
            row = cur.fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def record_table_progress(
        self, conn: pymysql.connections.Connection[Any], table: str, commit_ts: int, start_ts: int
    ) -> None:
        """Part of the key-less table's own transaction: not committed here."""
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {self.progress_table} (changefeed_id, table_name, commit_ts, start_ts)"
                " VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE commit_ts = VALUES(commit_ts),"
                " start_ts = VALUES(start_ts)",
                (self.changefeed_id, table, commit_ts, start_ts),
            )


def _table(fields: list[Any]) -> TableName:
    schema, table, table_id, partition_id = fields
    return TableName(schema, table, int(table_id), None if partition_id is None else int(partition_id))
