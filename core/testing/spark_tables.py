"""Reading back the tables of the Spark table sink, for comparison with an upstream snapshot.

The sink writes, per upstream table, under its root directory (see
:mod:`cdcflow.plugins.sinks.spark.storage`): ``{schema}/{table}/snapshot/`` (versions of
the table's current state; the newest committed one is read, through the sink's own
:func:`~cdcflow.plugins.sinks.spark.snapshot.read_snapshot`) and
``{schema}/{table}/changelog/`` (every change: ``op``, ``commit_ts``, ``seq``, ``before``,
``after``, partitioned by ``commit_date`` and ``batch_id``), which :func:`changelog_rows`
replays up to a timestamp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["changelog_rows", "reader_session", "snapshot_rows"]


def reader_session(work_dir: Path) -> Any:
    """The test process's Spark session (``local[1]``; an existing session is reused)."""
    from cdcflow.plugins.sinks.spark.session import spark_session

    return spark_session("local[1]", str(work_dir), {"spark.ui.enabled": "false"})


def snapshot_rows(spark: Any, root: str, db: str, table: str) -> list[dict[str, Any]] | None:
    """The rows of the newest committed snapshot version of ``db.table`` (None: no version yet)."""
    from cdcflow.plugins.sinks.spark.snapshot import read_snapshot
    from cdcflow.plugins.sinks.spark.storage import Storage

    storage = Storage(spark, root)
    frame = read_snapshot(spark, storage, storage.path(db, table, "snapshot"))
    return None if frame is None else [row.asDict() for row in frame.collect()]


def changelog_rows(spark: Any, root: str, db: str, table: str, ts: int, key: tuple[str, ...]) -> list[dict[str, Any]]:
    """``db.table`` as its change log has it at ``ts``: the changes with ``commit_ts <= ts`` applied
    in (commit ts, batch, order in the batch) order, rows keyed by ``key``.

    A batch replayed after a restart writes its changes again, under its own batch id or over the
    same one; applying a change twice in commit-ts order leaves the same state. Rows carry the
    columns their change had: after an ADD COLUMN, rows not changed since lack the new column.
    """
    from cdcflow.plugins.sinks.spark.storage import Storage

    storage = Storage(spark, root)
    path = storage.path(db, table, "changelog")
    if not storage.exists(path):
        return []
    frame = spark.read.option("mergeSchema", "true").parquet(path)
    changes = frame.filter(frame.commit_ts <= ts).select("op", "commit_ts", "batch_id", "seq", "before", "after")
    state: dict[tuple[Any, ...], dict[str, Any]] = {}

    def key_of(image: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(image.get(k) for k in key)

    for change in sorted(changes.collect(), key=lambda c: (c.commit_ts, c.batch_id, c.seq)):
        before = change.before.asDict() if change.before is not None else None
        after = change.after.asDict() if change.after is not None else None
        if change.op == "delete":
            state.pop(key_of(before if before is not None else after or {}), None)
            continue
        if before is not None:
            state.pop(key_of(before), None)  # an update may move the key
        if after is not None:
            state[key_of(after)] = after
    return list(state.values())
