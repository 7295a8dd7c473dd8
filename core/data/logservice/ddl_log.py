"""The event store's DDL log: a changefeed's schema changes in commit order.

Each DDL is a barrier for publishing (a cut of its own) and is handed to
the sinks with the batch that ends at it. The log is kept in ``ddl.pkl`` in
the store's directory, rewritten atomically (temp file, rename) on every
change, so a restarted capture has every DDL not yet released.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from cdcflow.core.data.events import DDLEvent, TableName
from cdcflow.core.data.logservice.records import load_pickled

__all__ = ["DDLLog"]

_DDL_FILE = "ddl.pkl"


class DDLLog:
    """The unreleased DDL events of one store (not thread-safe: the store serializes access)."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / _DDL_FILE
        self._events: list[DDLEvent] = self._load()

    def add(self, ddl: DDLEvent) -> bool:
        """Record ``ddl``; returns False for a repeat.

        A repeat is the same statement on the same table at the same commit ts,
        whatever schema it carries: a source that sends a DDL again after a
        restart may describe the schema in more detail than the copy stored by
        an earlier version (column defaults), and sinks must not run it twice."""
        identity = _identity(ddl)
        if any(_identity(d) == identity for d in self._events):
            return False
        self._events.append(ddl)
        self._events.sort(key=lambda d: d.commit_ts)
        self._save()
        return True

    def between(self, start_ts: int, end_ts: int) -> list[DDLEvent]:
        """The DDL events with commit ts in ``(start_ts, end_ts]``, in commit order."""
        return [d for d in self._events if start_ts < d.commit_ts <= end_ts]

    def barriers(self) -> list[int]:
        """The distinct commit ts of the DDL events, ascending (the manifest's ``ddl_ts``)."""
        return sorted({d.commit_ts for d in self._events})

    def release(self, ts: int) -> None:
        """Forget the DDL events at or below ``ts`` (every batch up to it is flushed)."""
        self._events = [d for d in self._events if d.commit_ts > ts]
        self._save()

    def _load(self) -> list[DDLEvent]:
        if not self._path.exists():
            return []
        with self._path.open("rb") as fh:
            loaded: list[DDLEvent] = load_pickled(fh)
        return loaded

    def _save(self) -> None:
        tmp = self._path.with_name(_DDL_FILE + ".tmp")
        tmp.write_bytes(pickle.dumps(self._events, protocol=5))
        tmp.replace(self._path)


def _identity(ddl: DDLEvent) -> tuple[int, str, TableName | None, int]:
    """What makes two DDL events the same schema change (see :meth:`DDLLog.add`)."""
    return ddl.commit_ts, ddl.query, ddl.table, ddl.action_type
