"""The SQLite metastore (``sqlite:///path``): the embedded default for one node.

Each call is one SQLite transaction, so a record is never half-written.
Sessions are rows with an expiry that a background task pushes forward;
a capture whose row expired is reaped by whoever looks next, and its session
notices the row is gone and reports itself lost. The owner is one row
holding the owner capture and a term that grows with each election; a write
checks that row in the same transaction.

Safe for several processes on one machine sharing the file (WAL mode and a
busy timeout), not across machines: use etcd for a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo, ChangeFeedStatus
from cdcflow.core.control.metastore.base import (
    POLL_INTERVAL,
    MetaStore,
    MetaStoreConflictError,
    NotOwnerError,
    OwnerTerm,
    Session,
)
from cdcflow.core.errors import DuplicateChangefeedIDError, MetaStoreIOError

__all__ = ["SQLiteMetaStore"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS capture (id TEXT PRIMARY KEY, info TEXT NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS owner (k INTEGER PRIMARY KEY CHECK (k = 1), capture_id TEXT, term INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS changefeed (id TEXT PRIMARY KEY, info TEXT NOT NULL, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS status (id TEXT PRIMARY KEY, checkpoint_ts INTEGER NOT NULL,
                                   resolved_ts INTEGER NOT NULL, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS snapshot (id TEXT PRIMARY KEY, record TEXT NOT NULL);
INSERT OR IGNORE INTO owner (k, capture_id, term) VALUES (1, NULL, 0);
"""


class _Unavailable(Exception):
    """An SQLite error worth retrying (locked database, I/O error)."""


class SQLiteSession(Session):
    def __init__(self, store: SQLiteMetaStore, capture: CaptureInfo, ttl: float) -> None:
        super().__init__(capture, ttl)
        self._store = store
        self._task = asyncio.create_task(self._keep_alive(), name=f"session-{capture.id}")

    async def _keep_alive(self) -> None:
        try:
            while not self.lost.is_set():
                await asyncio.sleep(self.ttl / 3)
                if not self._store.refresh_capture(self.capture.id, self.ttl):
                    log.warning("session of capture %s expired", self.capture.id)
                    self.lost.set()
        except MetaStoreIOError:
            self.lost.set()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(MetaStoreIOError):
            self._store.drop_capture(self.capture.id)
        self.lost.set()


def _owner_only(path: str) -> None:
    """Create the database file readable and writable by its owner only (0600) — it holds
    the changefeeds' sink URIs and options, passwords included — and take group and
    other access away from one an older version created. SQLite creates the ``-wal``
    and ``-shm`` files with the database file's permissions."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path + suffix).st_mode & 0o077:
                os.chmod(path + suffix, 0o600)


class SQLiteMetaStore(MetaStore):
    """See the module docstring."""

    def __init__(self, path: str, *, retries: int = 5) -> None:
        self.url = f"sqlite:///{path}"
        self.path = path
        self._retries = retries
        try:
            if path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                _owner_only(path)
            self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise MetaStoreIOError(f"cannot open the SQLite metastore {path}: {exc}", detail={"path": path}) from exc

    # -- plumbing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _run(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` with retries on transient SQLite errors; 3002 when they run out."""

        @retry(
            retry=retry_if_exception_type(_Unavailable),
            stop=stop_after_attempt(self._retries),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            reraise=True,
        )
        def attempt() -> T:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                raise _Unavailable(str(exc)) from exc

        try:
            return attempt()
        except (_Unavailable, sqlite3.Error) as exc:
            raise MetaStoreIOError(
                f"metastore {self.url}: {what} failed after {self._retries} attempts: {exc}",
                detail={"url": self.url, "operation": what},
            ) from exc

    def _check_owner(self, db: sqlite3.Connection, term: OwnerTerm) -> None:
        row = db.execute("SELECT capture_id, term FROM owner WHERE k = 1").fetchone()
        if row is None or row[0] != term.capture_id or row[1] != term.term:
            raise NotOwnerError(
                f"capture {term.capture_id} is no longer the owner (term {term.term})",
                detail={"capture_id": term.capture_id, "term": term.term},
            )

    def _reap(self, db: sqlite3.Connection, now: float) -> None:
        db.execute("DELETE FROM capture WHERE expires < ?", (now,))
        db.execute(
            "UPDATE owner SET capture_id = NULL WHERE k = 1 AND capture_id IS NOT NULL "
            "AND capture_id NOT IN (SELECT id FROM capture)"
        )

    # -- sessions ---------------------------------------------------------------------------

    async def open_session(self, capture: CaptureInfo, ttl: float) -> Session:
        def register() -> None:
            with self._tx() as db:
                self._reap(db, time.time())
                db.execute(
                    "INSERT OR REPLACE INTO capture (id, info, expires) VALUES (?, ?, ?)",
                    (capture.id, json.dumps(capture.to_json()), time.time() + ttl),
                )

        self._run("register capture", register)
        return SQLiteSession(self, capture, ttl)

    def refresh_capture(self, capture_id: str, ttl: float) -> bool:
        def refresh() -> bool:
            with self._tx() as db:
                cur = db.execute(
                    "UPDATE capture SET expires = ? WHERE id = ? AND expires >= ?",
                    (time.time() + ttl, capture_id, time.time()),
                )
                return cur.rowcount == 1

        return self._run("keep session alive", refresh)

    def drop_capture(self, capture_id: str) -> None:
        def drop() -> None:
            with self._tx() as db:
                db.execute("DELETE FROM capture WHERE id = ?", (capture_id,))
                self._reap(db, time.time())

        self._run("close session", drop)

    async def list_captures(self) -> list[CaptureInfo]:
        def read() -> list[CaptureInfo]:
            with self._tx() as db:
                self._reap(db, time.time())
                rows = db.execute("SELECT info FROM capture ORDER BY id").fetchall()
            return [CaptureInfo.from_json(json.loads(r[0])) for r in rows]

        return self._run("list captures", read)

    async def watch_captures(self) -> AsyncIterator[list[CaptureInfo]]:
        last: list[CaptureInfo] | None = None
        while True:
            captures = await self.list_captures()
            if captures != last:
                last = captures
                yield captures
            await asyncio.sleep(POLL_INTERVAL)

    # -- owner ---------------------------------------------------------------------------------

    async def campaign(self, session: Session) -> OwnerTerm:
        me = session.capture.id

        def try_acquire() -> OwnerTerm | None:
            with self._tx() as db:
                self._reap(db, time.time())
                if db.execute("SELECT 1 FROM capture WHERE id = ?", (me,)).fetchone() is None:
                    return None
                owner, term = db.execute("SELECT capture_id, term FROM owner WHERE k = 1").fetchone()
                if owner == me:
                    return OwnerTerm(me, term)
                if owner is not None:
                    return None
                db.execute("UPDATE owner SET capture_id = ?, term = term + 1 WHERE k = 1", (me,))
                return OwnerTerm(me, term + 1)

        while True:
            if session.lost.is_set():
                raise NotOwnerError(f"capture {me} lost its session while campaigning")
            won = self._run("campaign", try_acquire)
            if won is not None:
                return won
            await asyncio.sleep(POLL_INTERVAL)

    async def get_owner(self) -> OwnerTerm | None:
        def read() -> OwnerTerm | None:
            with self._tx() as db:
                self._reap(db, time.time())
                owner, term = db.execute("SELECT capture_id, term FROM owner WHERE k = 1").fetchone()
            return None if owner is None else OwnerTerm(owner, term)

        return self._run("get owner", read)

    async def resign(self, term: OwnerTerm) -> None:
        def resign() -> None:
            with self._tx() as db:
                db.execute(
                    "UPDATE owner SET capture_id = NULL WHERE k = 1 AND capture_id = ? AND term = ?",
                    (term.capture_id, term.term),
                )

        self._run("resign", resign)

    # -- changefeeds ---------------------------------------------------------------------------

    async def create_changefeed(self, info: ChangeFeedInfo, status: ChangeFeedStatus, term: OwnerTerm) -> None:
        def create() -> None:
            with self._tx() as db:
                self._check_owner(db, term)
                if db.execute("SELECT 1 FROM changefeed WHERE id = ?", (info.id,)).fetchone():
                    raise DuplicateChangefeedIDError(
                        f"changefeed {info.id} already exists", detail={"changefeed_id": info.id}
                    )
                db.execute(
                    "INSERT INTO changefeed (id, info, version) VALUES (?, ?, ?)",
                    (info.id, json.dumps(info.to_json()), info.version),
                )
                db.execute(
                    "INSERT OR REPLACE INTO status VALUES (?, ?, ?, ?)",
                    (info.id, status.checkpoint_ts, status.resolved_ts, status.version),
                )

        self._run("create changefeed", create)

    def _read(self, db: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return db.execute(
            "SELECT c.info, s.checkpoint_ts, s.resolved_ts, s.version FROM changefeed c "
            f"LEFT JOIN status s ON s.id = c.id {where} ORDER BY c.id",
            args,
        ).fetchall()

    @staticmethod
    def _decode(row: tuple[Any, ...]) -> tuple[ChangeFeedInfo, ChangeFeedStatus]:
        info = ChangeFeedInfo.from_json(json.loads(row[0]))
        status = ChangeFeedStatus(row[1] or 0, row[2] or 0, row[3] or 0)
        return info, status

    async def get_changefeed(self, changefeed_id: str) -> tuple[ChangeFeedInfo, ChangeFeedStatus] | None:
        rows = self._run("get changefeed", lambda: self._read(self._db, "WHERE c.id = ?", (changefeed_id,)))
        return self._decode(rows[0]) if rows else None

    async def list_changefeeds(self) -> list[tuple[ChangeFeedInfo, ChangeFeedStatus]]:
        rows = self._run("list changefeeds", lambda: self._read(self._db, "", ()))
        return [self._decode(r) for r in rows]

    async def update_changefeed(self, info: ChangeFeedInfo, term: OwnerTerm) -> None:
        def update() -> None:
            with self._tx() as db:
                self._check_owner(db, term)
                cur = db.execute(
                    "UPDATE changefeed SET info = ?, version = ? WHERE id = ? AND version = ?",
                    (json.dumps(info.to_json()), info.version, info.id, info.version - 1),
                )
                if cur.rowcount != 1:
                    raise MetaStoreConflictError(
                        f"changefeed {info.id} changed since version {info.version - 1} was read (or was removed)",
                        detail={"changefeed_id": info.id, "expected_version": info.version - 1},
                    )

        self._run("update changefeed", update)

    async def delete_changefeed(self, changefeed_id: str, term: OwnerTerm) -> None:
        def delete() -> None:
            with self._tx() as db:
                self._check_owner(db, term)
                db.execute("DELETE FROM changefeed WHERE id = ?", (changefeed_id,))
                db.execute("DELETE FROM status WHERE id = ?", (changefeed_id,))
                db.execute("DELETE FROM snapshot WHERE id = ?", (changefeed_id,))

        self._run("delete changefeed", delete)

    async def update_checkpoints(self, statuses: Mapping[str, ChangeFeedStatus], term: OwnerTerm) -> dict[str, int]:
        def update() -> dict[str, int]:
            written: dict[str, int] = {}
            with self._tx() as db:
                self._check_owner(db, term)
                for cf, st in statuses.items():
                    cur = db.execute(
                        "UPDATE status SET checkpoint_ts = MAX(checkpoint_ts, ?), resolved_ts = MAX(resolved_ts, ?), "
                        "version = version + 1 WHERE id = ? AND (checkpoint_ts < ? OR resolved_ts < ?)",
                        (st.checkpoint_ts, st.resolved_ts, cf, st.checkpoint_ts, st.resolved_ts),
                    )
                    if cur.rowcount:
                        row = db.execute("SELECT checkpoint_ts FROM status WHERE id = ?", (cf,)).fetchone()
                        written[cf] = int(row[0])
            return written

        return self._run("update checkpoints", update)

    async def save_snapshot_record(self, changefeed_id: str, record: Mapping[str, Any], term: OwnerTerm) -> None:
        def save() -> None:
            with self._tx() as db:
                self._check_owner(db, term)
                if db.execute("SELECT 1 FROM changefeed WHERE id = ?", (changefeed_id,)).fetchone():
                    db.execute(
                        "INSERT OR REPLACE INTO snapshot (id, record) VALUES (?, ?)",
                        (changefeed_id, json.dumps(dict(record))),
                    )

        self._run("save snapshot record", save)

    async def list_snapshot_records(self) -> dict[str, dict[str, Any]]:
        sql = "SELECT id, record FROM snapshot"
        rows = self._run("list snapshot records", lambda: self._db.execute(sql).fetchall())
        return {cf: json.loads(record) for cf, record in rows}

    async def close(self) -> None:
        self._db.close()
