"""One downstream transaction: the statements of some units, or the precise error.

Shared by the sink's workers on the driver (:mod:`.sink`) and by the
partition writers in Spark tasks (:mod:`.tasks`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

import pymysql

from cdcflow.core.data.events import RowChange, TableName
from cdcflow.core.errors import CdcflowError
from cdcflow.plugins.sinks.mysql.causality import Unit
from cdcflow.plugins.sinks.mysql.checkpoint import CheckpointTable
from cdcflow.plugins.sinks.mysql.dml import Statement, TableMeta, plan_statements
from cdcflow.plugins.sinks.mysql.downstream import error_code, is_transient
from cdcflow.plugins.sinks.mysql.errors import ConstraintViolationError, DownstreamRejectedError

__all__ = [
    "Segment",
    "all_upserts",
    "apply_transaction",
    "progress_name",
    "progress_scope",
    "rollback_quietly",
    "segments_of",
]


@dataclass(slots=True)
class Segment:
    """Rows of one table inside a downstream transaction, and which are upserts."""

    meta: TableMeta
    rows: list[RowChange]
    safe: list[bool]


def segments_of(
    group: Sequence[Unit], meta_of: Callable[[TableName], TableMeta], upsert: Callable[[RowChange], bool]
) -> list[Segment]:
    """The units of one downstream transaction as runs of one table each."""
    segments: list[Segment] = []
    for unit in group:
        meta = meta_of(unit.table)
        safe = [upsert(row) for row in unit.rows]
        if segments and segments[-1].meta is meta:
            segments[-1].rows.extend(unit.rows)
            segments[-1].safe.extend(safe)
        else:
            segments.append(Segment(meta, list(unit.rows), safe))
    return segments


def all_upserts(segments: Sequence[Segment]) -> list[Segment]:
    """``segments`` with every row an upsert (a transaction run again after a lost connection)."""
    return [Segment(seg.meta, seg.rows, [True] * len(seg.rows)) for seg in segments]


def apply_transaction(
    conn: pymysql.connections.Connection[Any],
    segments: Sequence[Segment],
    checkpoint: CheckpointTable,
    zone: tzinfo,
    scope: str = "",
) -> None:
    """One downstream transaction (begun implicitly: autocommit is off); on a refused
    statement, roll back and say which row. ``scope`` (:func:`progress_scope`) sets
    apart the progress of key-less tables in an initial snapshot's batches."""
    todo: list[Segment] = []
    try:
        for seg in segments:
            rows, safe = seg.rows, seg.safe
            if not seg.meta.unique_keys:
                rows, safe = _unapplied(checkpoint, conn, seg.meta, rows, safe, scope)
            if rows:
                todo.append(Segment(seg.meta, rows, safe))
        for seg in todo:
            _execute(conn, plan_statements(seg.meta, seg.rows, seg.safe, zone))
        last_of_keyless = {progress_name(seg.meta, scope): seg.rows[-1] for seg in todo if not seg.meta.unique_keys}
        for name, last in last_of_keyless.items():
            checkpoint.record_table_progress(conn, name, last.commit_ts, last.start_ts)
        conn.commit()
    except pymysql.err.MySQLError as exc:
        rollback_quietly(conn)
        if is_transient(exc):
            raise
        raise _rejected(conn, todo, exc, zone) from exc
    except BaseException:
        rollback_quietly(conn)
        raise


def _rejected(
    conn: pymysql.connections.Connection[Any],
    segments: list[Segment],
    exc: pymysql.err.MySQLError,
    zone: tzinfo,
) -> CdcflowError:
    """The precise error: find the first row the server refuses, then roll back."""
    culprit: tuple[TableMeta, RowChange] | None = None
    try:
        for seg in segments:
            for row, upsert in zip(seg.rows, seg.safe, strict=True):
                try:
                    _execute(conn, plan_statements(seg.meta, [row], [upsert], zone))
                except pymysql.err.MySQLError:
                    culprit = (seg.meta, row)
                    break
            if culprit is not None:
                break
    finally:
        rollback_quietly(conn)
    meta, row = culprit or (segments[0].meta, segments[0].rows[0])
    key_cols = meta.handle or tuple(row.image())
    key = {c: row.image().get(c) for c in key_cols}
    detail = {
        "table": f"{meta.schema}.{meta.table}",
        "key": {c: repr(v) for c, v in key.items()},
        "commit_ts": row.commit_ts,
        "start_ts": row.start_ts,
        "op": row.op.value,
        "error_code": error_code(exc),
    }
    where = f"{meta.qualified} key {key} ({row.op.value} committed at ts {row.commit_ts})"
    if isinstance(exc, pymysql.err.IntegrityError):
        return ConstraintViolationError(
            f"MySQL sink: constraint violated at {where}: {exc.args[-1]}; the transaction was rolled back. "
            "The changefeed restarts and replays the batch with upserts; if it recurs, the downstream was "
            "changed by someone else or differs from the upstream (set safe-mode=true to overwrite).",
            detail=detail,
        )
    return DownstreamRejectedError(
        f"MySQL sink: the downstream refused {where}: {exc.args[-1]}; the transaction was rolled back.",
        detail=detail,
    )


def progress_name(meta: TableMeta, scope: str = "") -> str:
    """The ``table_progress`` row of a key-less table (of one snapshot range: ``scope``)."""
    name = f"{meta.schema}.{meta.table}"
    return f"{name} {scope}" if scope else name


def progress_scope(batch_id: int) -> str:
    """Every row of an initial snapshot has commit and start ts T, so a key-less table's
    progress cannot tell one range from another (a range applied would make the next
    look applied): a snapshot batch (negative id, one per range, the same on every
    capture that delivers it) keeps its own; the stream's rows, above T, keep the table's."""
    return f"#{batch_id}" if batch_id < 0 else ""


def _unapplied(
    checkpoint: CheckpointTable,
    conn: pymysql.connections.Connection[Any],
    meta: TableMeta,
    rows: list[RowChange],
    safe: list[bool],
    scope: str,
) -> tuple[list[RowChange], list[bool]]:
    """Rows of a key-less table not yet applied: only replayed rows need the lookup."""
    if not any(safe):
        return rows, safe
    done = checkpoint.table_progress(conn, progress_name(meta, scope))
    keep = [i for i, row in enumerate(rows) if (row.commit_ts, row.start_ts) > done]
    return [rows[i] for i in keep], [safe[i] for i in keep]


def _execute(conn: pymysql.connections.Connection[Any], statements: list[Statement]) -> None:
    with conn.cursor() as cur:
        for statement in statements:
            if statement.many is not None:
                cur.executemany(statement.sql, statement.many)
            else:
                cur.execute(statement.sql, statement.args)


def rollback_quietly(conn: pymysql.connections.Connection[Any]) -> None:
    # The connection may be broken; the retry opens a new one.
    with contextlib.suppress(Exception):
        conn.rollback()
