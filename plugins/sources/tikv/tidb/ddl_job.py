"""DDL jobs as TiDB writes them to TiKV: where the exact DDL commit ts comes from.

A DDL's ``binlog.FinishedTS`` (status API, ``/ddl/history``) is the *start*
ts of a later bookkeeping transaction, not the moment the new schema went
live. The exact point is the commit ts of the transaction that set the job
to *done*; it updates the job's row in TiDB's job table together with the
schema, so cdcflow watches that row, as TiCDC does.

Format (TiDB ≥ 6.2; what the playground upstream writes and the mounter reads)
==========================================================================

Key space: the record keys of two system tables whose ids sit just below
``MaxInt48 = 2^48 − 1``:

* ``mysql.tidb_ddl_job``, id :data:`JOB_TABLE_ID` = 2^48 − 2. Columns (id: name):
  1 ``job_id bigint NOT NULL`` (clustered int PK, i.e. the row handle, not in the value),
  2 ``reorg int``, 3 ``schema_ids text``, 4 ``table_ids text``,
  5 ``job_meta longblob`` (the job JSON), 6 ``type int``, 7 ``processing int``.
* ``mysql.tidb_ddl_history``, id :data:`HISTORY_TABLE_ID` = 2^48 − 4. Columns:
  1 ``job_id`` (handle), 2 ``job_meta longblob``, 3 ``db_name char(64)``,
  4 ``table_name char(64)``, 5 ``schema_ids text``, 6 ``table_ids text``,
  7 ``create_time datetime``.

Row key: ``'t' + EncodeInt(table id) + '_r' + EncodeInt(job_id)``. Row value:
rowcodec v2 (:mod:`.rowcodec`). ``job_meta`` holds the job JSON exactly as
``/ddl/history`` serves one element (``id``, ``type``, ``schema_id``,
``table_id``, ``schema_name``, ``table_name``, ``state``, ``query``,
``binlog`` {``SchemaVersion``, ``DBInfo``, ``TableInfo``, ``FinishedTS``,
``MultipleTableInfos``}, …).

Reading rules (TiCDC's ``ParseDDLJob``):

* a PUT in the job table whose job state is done (4) or synced (6) is the
  DDL; its commit ts is the DDL commit ts, its start ts the job's start ts;
  other states and DELETEs (the job leaving the queue) are ignored;
* a PUT in the history table counts only for CREATE TABLE (3) and
  CREATE TABLES (60) in state synced (TiDB's fast path inserts those straight
  into history); the schema store ignores a job id it has applied already.

Older TiDB versions queued jobs under meta keys (prefix ``'m'``); those are
not read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.sources.tikv.tidb import keys, rowcodec
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, Flag
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBColumn, TiDBDatabase, TiDBTable

__all__ = [
    "HISTORY_TABLE_ID",
    "JOB_TABLE_ID",
    "DDLJob",
    "JobState",
    "ddl_spans",
    "decode_job_write",
    "encode_history_write",
    "encode_job_write",
    "is_ddl_key",
]

MAX_INT48 = (1 << 48) - 1
JOB_TABLE_ID = MAX_INT48 - 1
REORG_TABLE_ID = MAX_INT48 - 2
HISTORY_TABLE_ID = MAX_INT48 - 3

JOB_META_COLUMN_IN_JOB_TABLE = 5
JOB_META_COLUMN_IN_HISTORY_TABLE = 2

ACTION_CREATE_TABLE = 3
ACTION_CREATE_TABLES = 60


class JobState:
    """TiDB JobState values that matter here."""

    DONE = 4
    SYNCED = 6
    ROLLBACK_DONE = 3
    CANCELLED = 5


_BIGINT = FieldType(TypeCode.LONGLONG, Flag.NOT_NULL | Flag.PRI_KEY)
_INT = FieldType(TypeCode.LONG)
_TEXT = FieldType(TypeCode.BLOB, Flag.BLOB, 65535)
_BLOB = FieldType(TypeCode.LONG_BLOB, Flag.BLOB | Flag.BINARY, charset="binary", collate="binary")
_CHAR64 = FieldType(TypeCode.STRING, flen=64)
_DATETIME = FieldType(TypeCode.DATETIME)


def _system_table(table_id: int, name: str, cols: list[tuple[str, FieldType]]) -> TiDBTable:
    columns = tuple(TiDBColumn(i + 1, n, i, ft) for i, (n, ft) in enumerate(cols))
    return TiDBTable(table_id, name, columns, pk_is_handle=True)


JOB_TABLE = _system_table(
    JOB_TABLE_ID,
    "tidb_ddl_job",
    [
        ("job_id", _BIGINT),
        ("reorg", _INT),
        ("schema_ids", _TEXT),
        ("table_ids", _TEXT),
        ("job_meta", _BLOB),
        ("type", _INT),
        ("processing", _INT),
    ],
)
HISTORY_TABLE = _system_table(
    HISTORY_TABLE_ID,
    "tidb_ddl_history",
    [
        ("job_id", _BIGINT),
        ("job_meta", _BLOB),
        ("db_name", _CHAR64),
        ("table_name", _CHAR64),
        ("schema_ids", _TEXT),
        ("table_ids", _TEXT),
        ("create_time", _DATETIME),
    ],
)


def ddl_spans() -> list[tuple[bytes, bytes]]:
    """Raw key ranges a source must watch to see DDL jobs (job table, history table)."""
    return [keys.table_record_span(JOB_TABLE_ID), keys.table_record_span(HISTORY_TABLE_ID)]


def is_ddl_key(key: bytes) -> bool:
    if not keys.is_record_key(key):
        return False
    return keys.decode_table_id(key) in (JOB_TABLE_ID, HISTORY_TABLE_ID)


@dataclass(frozen=True, slots=True)
class DDLJob:
    """The parts of a TiDB ``model.Job`` the schema store and sinks need."""

    id: int
    type: int
    schema_id: int
    table_id: int
    state: int
    query: str = ""
    schema_name: str = ""
    table_name: str = ""
    schema_version: int = 0
    table_info: TiDBTable | None = None
    db_info: TiDBDatabase | None = None
    multiple_table_infos: tuple[TiDBTable, ...] = ()
    start_ts: int = 0
    finished_ts: int = 0
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DDLJob:
        binlog = data.get("binlog") or {}
        table_info = binlog.get("TableInfo")
        db_info = binlog.get("DBInfo")
        return cls(
            id=int(data["id"]),
            type=int(data.get("type", 0)),
            schema_id=int(data.get("schema_id", 0)),
            table_id=int(data.get("table_id", 0)),
            state=int(data.get("state", 0)),
            query=str(data.get("query") or ""),
            schema_name=str(data.get("schema_name") or ""),
            table_name=str(data.get("table_name") or ""),
            schema_version=int(binlog.get("SchemaVersion") or 0),
            table_info=TiDBTable.from_json(table_info) if table_info else None,
            db_info=TiDBDatabase.from_json(db_info) if db_info else None,
            multiple_table_infos=tuple(TiDBTable.from_json(t) for t in binlog.get("MultipleTableInfos") or ()),
            start_ts=int(data.get("start_ts") or 0),
            finished_ts=int(binlog.get("FinishedTS") or 0),
            raw=dict(data),
        )

    def to_json(self) -> dict[str, Any]:
        """Job JSON shaped like TiDB's (as ``/ddl/history`` serves it and ``job_meta`` holds it)."""
        out: dict[str, Any] = {"err": None, "err_count": 0, "row_count": 0, "raw_args": None, "version": 1}
        out.update(self.raw)
        out.update(
            id=self.id,
            type=self.type,
            schema_id=self.schema_id,
            table_id=self.table_id,
            schema_name=self.schema_name,
            table_name=self.table_name,
            state=self.state,
            schema_state=5,
            query=self.query,
            start_ts=self.start_ts,
            real_start_ts=self.start_ts,
            binlog={
                "SchemaVersion": self.schema_version,
                "DBInfo": self.db_info.to_json() if self.db_info else None,
                "TableInfo": self.table_info.to_json() if self.table_info else None,
                "FinishedTS": self.finished_ts,
                "MultipleTableInfos": [t.to_json() for t in self.multiple_table_infos] or None,
            },
        )
        return out

    @property
    def is_done(self) -> bool:
        return self.state in (JobState.DONE, JobState.SYNCED)

    def with_timestamps(self, start_ts: int, finished_ts: int) -> DDLJob:
        return dataclasses.replace(self, start_ts=start_ts, finished_ts=finished_ts)


def encode_job_write(job: DDLJob) -> tuple[bytes, bytes]:
    """Key and value of ``job``'s row in ``mysql.tidb_ddl_job``."""
    table_ids = ",".join(str(i) for i in {job.table_id} | {t.id for t in job.multiple_table_infos})
    value = rowcodec.encode_row(
        {
            2: (_INT, 0),
            3: (_TEXT, str(job.schema_id)),
            4: (_TEXT, table_ids),
            5: (_BLOB, json.dumps(job.to_json()).encode()),
            6: (_INT, job.type),
            7: (_INT, 1),
        }
    )
    return keys.record_key(JOB_TABLE_ID, job.id), value


def encode_history_write(job: DDLJob) -> tuple[bytes, bytes]:
    """Key and value of ``job``'s row in ``mysql.tidb_ddl_history``."""
    value = rowcodec.encode_row(
        {
            2: (_BLOB, json.dumps(job.to_json()).encode()),
            3: (_CHAR64, job.schema_name),
            4: (_CHAR64, job.table_name),
            5: (_TEXT, str(job.schema_id)),
            6: (_TEXT, str(job.table_id)),
            7: (_DATETIME, None),
        }
    )
    return keys.record_key(HISTORY_TABLE_ID, job.id), value


def decode_job_write(key: bytes, value: bytes, *, start_ts: int, commit_ts: int) -> DDLJob | None:
    """The finished DDL job a job-table or history-table write carries, stamped with the write's ts.

    Returns None for writes that are not a finished DDL (see the module rules).
    Raises ValueError (RowFormatError, JSON errors, …) on a malformed value.
    """
    if not value:
        return None
    table_id = keys.decode_table_id(key)
    if table_id == JOB_TABLE_ID:
        column = JOB_META_COLUMN_IN_JOB_TABLE
    elif table_id == HISTORY_TABLE_ID:
        column = JOB_META_COLUMN_IN_HISTORY_TABLE
    else:
        return None
    row = rowcodec.decode_row(value)
    meta = rowcodec.decode_column(_BLOB, row.get(column))
    if not meta:
        raise ValueError(f"DDL job row has no job_meta (column {column})")
    job = DDLJob.from_json(json.loads(meta))
    if table_id == HISTORY_TABLE_ID:
        if job.type not in (ACTION_CREATE_TABLE, ACTION_CREATE_TABLES) or job.state != JobState.SYNCED:
            return None
    elif not job.is_done:
        return None
    return job.with_timestamps(start_ts, commit_ts)
