"""The checkpoint tables in the downstream: which batches are flushed, by which writer.

A changefeed may be written by several pipelines at once (one per capture that
runs some of its spans), and Spark's batch ids are each pipeline's own: they
start at 0 in each capture's checkpoint directory, and a batch replayed after
a crash keeps its id only within that directory. So every record is kept per
*writer*, the pipeline's identity
(:attr:`SinkContext.writer_id <cdcflow.core.data.sink.SinkContext.writer_id>`,
created once in its checkpoint directory; ``""`` for the test kit and the
in-process executor, which have one writer).

One row per changefeed and writer in ``{checkpoint-schema}.checkpoint``::

    changefeed_id        the changefeed
    writer_id            the writer ("" for a single writer without an identity,
                         and for rows written before writers had identities)
    flushed_batch_id     the batch that recorded flushed_ts (this writer's id)
    flushed_ts           every change this writer had at or below it is applied:
                         a batch's end ts, or just below its DDL once its rows are applied
    applying_batch_id    a batch begun and not yet flushed (NULL when none)
    applying_ts          the highest end ts ever begun and not yet flushed

and one row per changefeed and key-less table in ``{checkpoint-schema}.table_progress``:
the (commit ts, start ts) of the last upstream transaction applied to it,
written in the same downstream transaction as its rows. Key-less tables are
applied serially, so this is monotonic and makes their replay exactly-once
(a REPLACE cannot be idempotent without a key). It is kept per table, not per
writer: a table is written by one writer at a time, and a table that moves to
another capture is re-sent there from the table's checkpoint, where the new
writer must skip what the old one applied. The rows of an initial snapshot
(all at commit and start ts T) keep one row per table and snapshot batch
(``table_name`` followed by `` #<batch id>``): the ranges of one table are
parts of one snapshot, and one range applied must not make another look so.

Batches written by Spark tasks also have one row per changefeed, writer, batch
and partition in ``{checkpoint-schema}.batch_partition`` (created beside the
others when missing)::

    changefeed_id, writer_id, batch_id, partition_id   the partition
    end_ts        the batch's end ts (a row of another end ts is of another batch)
    flushed       0 while its rows are being applied, 1 once they all are
    tables        the tables whose rows it flushed (a JSON list of
                  [schema, table, table id, physical partition id])

A partition writer records its partition as applying before its first
statement and as flushed after its last. The rows of a batch are partitioned
by table, so a table listed by a flushed partition has all its rows of the
batch downstream: a replay skips them. A partition found applying was cut
short: its replay upserts. The writer's rows are deleted when the batch is
flushed (``mark_flushed``); until then their highest end ts counts as
``applying_ts``.

Before a batch's first statement the sink records it as *applying*; after
its last, as *flushed*. A replayed batch (its id at or below the writer's
``flushed_batch_id``: Spark replays batch ids) whose end ts is at or below
``flushed_ts`` is recognised and skipped; a newer batch's rows at or below
``flushed_ts`` are of a span that joined behind the others, not downstream
yet, and are written as upserts. The ids of an initial snapshot's batches are
negative and not ordered (a range placed on a cluster has its own, from its
keys): such a batch is a replay only of the same id, the last flushed.

Replays are recognised from the writer's own row only; whether a row *may
already be downstream* (and is applied as an upsert) is decided from every
writer's rows: rows at or below the highest flushed or applying ts of any
writer of the changefeed (:attr:`CheckpointState.downstream_ts`). A table
that moves from a capture that died in the middle of a batch to another one
is re-sent there from the table's checkpoint: the new writer has no record of
those rows, the old one may have applied part of them.

Upgrading a checkpoint schema created before writers (``checkpoint`` keyed by
``changefeed_id`` alone, ``batch_partition`` by changefeed, batch and
partition): :meth:`CheckpointTable.ensure` adds ``writer_id`` (default ``""``)
to both and makes it part of their keys, so the old rows become the rows of
writer ``""``, and no row is lost. The old rows were written by the pipeline
whose checkpoint directory predates writer identities: its identity says it
inherits (:attr:`SinkContext.writer_inherits`), and the first such writer to
open takes the rows of writer ``""`` over as its own (one transaction: only
one writer gets them), so its replays after the upgrade are recognised as
before. Until every writer flushed past them they still count for the upserts
of every writer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import pymysql

from cdcflow.core.data.events import MicroBatch, TableName
from cdcflow.plugins.sinks.mysql.dml import quote, quote_param

__all__ = ["CheckpointState", "CheckpointTable", "PartitionRecord"]

log = logging.getLogger(__name__)

#: MySQL's "duplicate column name": another writer added ``writer_id`` at the same time.
_DUPLICATE_COLUMN = 1060


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What the checkpoint tables say of one writer of a changefeed, and of all of them."""

    flushed_batch_id: int = -1
    flushed_ts: int = 0
    applying_batch_id: int | None = None
    applying_ts: int = 0
    #: The highest flushed or begun end ts of any writer of the changefeed: rows at or
    #: below it may be downstream already (another capture had their table before).
    downstream_ts: int = 0

    def replays(self, batch: MicroBatch) -> bool:
        """``batch`` is one this writer flushed or began before (Spark replays a batch id
        after a crash; ids only grow): its rows at or below ``flushed_ts`` are downstream.
        A newer batch's rows below it are of a span that joined behind the others: not
        downstream. A snapshot's ids are negative and not ordered: only the same id is."""
        if batch.batch_id < 0:
            return batch.batch_id == self.flushed_batch_id
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
    """Reads and writes the checkpoint rows of one writer of a changefeed."""

    def __init__(self, schema: str, changefeed_id: str, writer_id: str = "", *, inherits: bool = False) -> None:
        self.schema = schema
        self.changefeed_id = changefeed_id
        self.writer_id = writer_id
        #: Take the rows of writer "" over on :meth:`ensure` (see the module docs).
        self.inherits = inherits
        # Every statement naming these tables runs with parameters (``()`` at least),
        # so the driver's %-formatting sees a doubled '%' of the schema name.
        self.table = f"{quote_param(schema)}.{quote('checkpoint')}"
        self.progress_table = f"{quote_param(schema)}.{quote('table_progress')}"
        self.partition_table = f"{quote_param(schema)}.{quote('batch_partition')}"

    @property
    def _key(self) -> tuple[str, str]:
        return self.changefeed_id, self.writer_id

    def ensure(self, conn: pymysql.connections.Connection[Any]) -> None:
        """Create the tables (or add ``writer_id`` to those of an earlier version), and
        take over the rows written before writers had ids if this writer inherits them."""
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(self.schema)}")
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} ("
                "changefeed_id VARCHAR(255) NOT NULL, writer_id VARCHAR(64) NOT NULL DEFAULT '',"
                " flushed_batch_id BIGINT NOT NULL DEFAULT -1,"
                " flushed_ts BIGINT UNSIGNED NOT NULL DEFAULT 0,"
                " applying_batch_id BIGINT NULL,"
                " applying_ts BIGINT UNSIGNED NULL,"
                " updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),"
                " PRIMARY KEY (changefeed_id, writer_id))",
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
                "changefeed_id VARCHAR(255) NOT NULL, writer_id VARCHAR(64) NOT NULL DEFAULT '',"
                " batch_id BIGINT NOT NULL, partition_id INT NOT NULL,"
                " end_ts BIGINT UNSIGNED NOT NULL, flushed TINYINT(1) NOT NULL DEFAULT 0, tables MEDIUMTEXT NULL,"
                " updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),"
                " PRIMARY KEY (changefeed_id, writer_id, batch_id, partition_id))",
                (),
            )
        conn.commit()
        self._add_writer_column(conn, "checkpoint", self.table, "changefeed_id, writer_id")
        self._add_writer_column(
            conn, "batch_partition", self.partition_table, "changefeed_id, writer_id, batch_id, partition_id"
        )
        if self.inherits and self.writer_id:
            self._take_over_unnamed(conn)

    def _add_writer_column(self, conn: pymysql.connections.Connection[Any], name: str, table: str, key: str) -> None:
        """A table of an earlier version is keyed without the writer: its rows become writer ""'s."""
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name = %s AND column_name = 'writer_id'",
                (self.schema, name),
            )
            row = cur.fetchone()
            if row is not None and int(row[0]) > 0:
                conn.commit()
                return
            try:
                cur.execute(
                    f"ALTER TABLE {table} ADD COLUMN writer_id VARCHAR(64) NOT NULL DEFAULT '' AFTER changefeed_id,"
                    f" DROP PRIMARY KEY, ADD PRIMARY KEY ({key})",
                    (),
                )
            except pymysql.err.MySQLError as exc:
                if not (exc.args and exc.args[0] == _DUPLICATE_COLUMN):  # not another writer's upgrade
                    raise
            else:
                log.info('MySQL sink: %s.%s keyed by writer now (its rows are writer ""\'s)', self.schema, name)
        conn.commit()

    def _take_over_unnamed(self, conn: pymysql.connections.Connection[Any]) -> None:
        """Make the rows of writer "" this writer's, unless it has a row of its own; the
        first writer to do so gets them (the row lock orders concurrent ones)."""
        with conn.cursor() as cur:
            cur.execute(f"SELECT 1 FROM {self.table} WHERE changefeed_id = %s AND writer_id = %s", self._key)
            if cur.fetchone() is not None:
                conn.commit()
                return
            taken = cur.execute(
                f"UPDATE {self.table} SET writer_id = %s WHERE changefeed_id = %s AND writer_id = ''",
                (self.writer_id, self.changefeed_id),
            )
            cur.execute(
                f"UPDATE {self.partition_table} SET writer_id = %s WHERE changefeed_id = %s AND writer_id = ''",
                (self.writer_id, self.changefeed_id),
            )
        conn.commit()
        if taken:
            log.info(
                "MySQL sink: changefeed %s's checkpoint of before writer ids is writer %s's now",
                self.changefeed_id,
                self.writer_id,
            )

    def read(self, conn: pymysql.connections.Connection[Any]) -> CheckpointState:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT flushed_batch_id, flushed_ts, applying_batch_id, applying_ts FROM {self.table}"
                " WHERE changefeed_id = %s AND writer_id = %s",
                self._key,
            )
            row = cur.fetchone()
            # Partitions of a batch not flushed yet: their rows may be downstream already.
            cur.execute(
                f"SELECT MAX(batch_id), MAX(end_ts) FROM {self.partition_table}"
                " WHERE changefeed_id = %s AND writer_id = %s",
                self._key,
            )
            partitions = cur.fetchone()
        conn.commit()
        downstream = self.downstream_ts(conn)
        begun_batch, begun_ts = (0, 0) if partitions is None or partitions[1] is None else map(int, partitions)
        flushed = CheckpointState() if row is None else CheckpointState(int(row[0]), int(row[1]))
        applying_batch = None if row is None or row[2] is None else int(row[2])
        applying_ts = 0 if row is None else int(row[3] or 0)
        if begun_ts > applying_ts:
            applying_batch, applying_ts = begun_batch, begun_ts
        return CheckpointState(flushed.flushed_batch_id, flushed.flushed_ts, applying_batch, applying_ts, downstream)

    def downstream_ts(self, conn: pymysql.connections.Connection[Any]) -> int:
        """The highest ts any writer of the changefeed flushed or began (partitions
        included): rows at or below it may be downstream already."""
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT MAX(GREATEST(flushed_ts, COALESCE(applying_ts, 0))) FROM {self.table}"
                " WHERE changefeed_id = %s",
                (self.changefeed_id,),
            )
            rows = cur.fetchone()
            cur.execute(
                f"SELECT MAX(end_ts) FROM {self.partition_table} WHERE changefeed_id = %s", (self.changefeed_id,)
            )
            parts = cur.fetchone()
        conn.commit()
        return max(int(rows[0] or 0) if rows else 0, int(parts[0] or 0) if parts else 0)

    def mark_applying(self, conn: pymysql.connections.Connection[Any], batch_id: int, end_ts: int) -> None:
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {self.table} (changefeed_id, writer_id, applying_batch_id, applying_ts)"
                " VALUES (%s, %s, %s, %s)"
                " ON DUPLICATE KEY UPDATE applying_batch_id = VALUES(applying_batch_id),"
                " applying_ts = GREATEST(COALESCE(applying_ts, 0), VALUES(applying_ts))",
                (*self._key, batch_id, end_ts),
            )
        conn.commit()

    def mark_flushed(self, conn: pymysql.connections.Connection[Any], batch_id: int, end_ts: int) -> None:
        with conn.cursor() as cur:
            # applying_ts survives until the flushed ts passes it: a replay with
            # smaller batches must still treat those rows as possibly applied.
            cur.execute(
                f"INSERT INTO {self.table} (changefeed_id, writer_id, flushed_batch_id, flushed_ts)"
                " VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE"
                " applying_batch_id = IF(COALESCE(applying_ts, 0) <= VALUES(flushed_ts), NULL, applying_batch_id),"
                " applying_ts = IF(COALESCE(applying_ts, 0) <= VALUES(flushed_ts), NULL, applying_ts),"
                " flushed_batch_id = VALUES(flushed_batch_id), flushed_ts = VALUES(flushed_ts)",
                (*self._key, batch_id, end_ts),
            )
            # The partitions of this writer's batches now flushed are needed no more.
            cur.execute(
                f"DELETE FROM {self.partition_table} WHERE changefeed_id = %s AND writer_id = %s AND end_ts <= %s",
                (*self._key, end_ts),
            )
        conn.commit()

    def partitions(
        self, conn: pymysql.connections.Connection[Any], batch_id: int, end_ts: int
    ) -> list[PartitionRecord]:
        """The recorded partitions of this writer's batch ``batch_id`` ending at ``end_ts``."""
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT partition_id, flushed, tables FROM {self.partition_table}"
                " WHERE changefeed_id = %s AND writer_id = %s AND batch_id = %s AND end_ts = %s",
                (*self._key, batch_id, end_ts),
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
                f"INSERT INTO {self.partition_table}"
                " (changefeed_id, writer_id, batch_id, partition_id, end_ts, flushed)"
                " VALUES (%s, %s, %s, %s, %s, 0) ON DUPLICATE KEY UPDATE"
                " flushed = IF(end_ts = VALUES(end_ts), flushed, 0),"
                " tables = IF(end_ts = VALUES(end_ts), tables, NULL), end_ts = VALUES(end_ts)",
                (*self._key, batch_id, partition, end_ts),
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
                f"INSERT INTO {self.partition_table}"
                " (changefeed_id, writer_id, batch_id, partition_id, end_ts, flushed, tables)"
                " VALUES (%s, %s, %s, %s, %s, 1, %s) ON DUPLICATE KEY UPDATE end_ts = VALUES(end_ts), flushed = 1,"
                " tables = VALUES(tables)",
                (*self._key, batch_id, partition, end_ts, names),
            )
        conn.commit()

    def table_progress(self, conn: pymysql.connections.Connection[Any], table: str) -> tuple[int, int]:
        """(commit ts, start ts) of the last transaction applied to a key-less table, by
        any writer (see the module docs); call inside its transaction."""
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
