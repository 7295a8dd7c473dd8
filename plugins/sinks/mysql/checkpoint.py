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

Before a batch's first statement the sink records it as *applying*; after
its last, as *flushed*. A replayed batch whose end ts is at or below
``flushed_ts`` is recognised and skipped; after a crash, rows up to
``applying_ts`` may be partly applied, so they are applied as upserts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pymysql

from cdcflow.plugins.sinks.mysql.dml import quote

__all__ = ["CheckpointState", "CheckpointTable"]


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What the checkpoint table says of one changefeed."""

    flushed_batch_id: int = -1
    flushed_ts: int = 0
    applying_batch_id: int | None = None
    applying_ts: int = 0


class CheckpointTable:
    """Reads and writes the checkpoint row of one changefeed."""

    def __init__(self, schema: str, changefeed_id: str) -> None:
        self.schema = schema
        self.changefeed_id = changefeed_id
        self.table = f"{quote(schema)}.{quote('checkpoint')}"
        self.progress_table = f"{quote(schema)}.{quote('table_progress')}"

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
                ")"
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.progress_table} ("
                "changefeed_id VARCHAR(255) NOT NULL, table_name VARCHAR(600) NOT NULL,"
                " commit_ts BIGINT UNSIGNED NOT NULL, start_ts BIGINT UNSIGNED NOT NULL,"
                " PRIMARY KEY (changefeed_id, table_name))"
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
        conn.commit()
        if row is None:
            return CheckpointState()
        return CheckpointState(int(row[0]), int(row[1]), None if row[2] is None else int(row[2]), int(row[3] or 0))

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
