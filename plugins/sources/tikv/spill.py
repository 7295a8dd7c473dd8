"""What the EventFeed client holds per region, bounded: a memory budget, and disk past it.

A region subscription holds per-row state before anything reaches the event
store: the PREWRITE of every key of an open transaction (until its COMMIT or
ROLLBACK), COMMITs that arrived before their lock was scanned, and every
committed change until the region is INITIALIZED (:mod:`.matcher`). A
transaction of a million rows is a million prewrites held at once.

:class:`FeedMemory` accounts those bytes for one client (one source, so one
changefeed) against a budget. A holder asks :meth:`FeedMemory.admit` before
keeping an entry in memory; when the entry does not fit, the largest holders
spill first — each what is still needed plus ``1/SPILL_SLICES`` of the budget,
so that a spill (which runs on the event loop) stays short — into a
:class:`RegionSpill`, an SQLite file of that region subscription under the
client's directory; an entry that still does not fit goes to disk itself. The
accounted bytes therefore never exceed the budget. A budget of None keeps
everything in memory.

Spill files hold nothing durable: they are deleted with their region
subscription, and the directory is emptied when a client starts (each client
keeps its files in a subdirectory of its own, so a client still closing does
not touch the files of its successor).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import shutil
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

__all__ = ["SPILL_SLICES", "FeedMemory", "MemoryHolder", "RegionSpill"]

log = logging.getLogger(__name__)

#: A spill frees what is needed plus 1/SPILL_SLICES of the budget (prewrites, oldest first).
SPILL_SLICES = 16
#: Rows fetched from a spill file at a time while streaming it back.
_FETCH = 512
#: SQLite's page cache per spill file (KiB): what reading and writing one costs in memory.
_CACHE_KIB = 1024

_SCHEMA = (
    # Pending prewrites by (start_ts, key): value, old value, op type, generation.
    "CREATE TABLE prewrite(start_ts INTEGER, key BLOB, value BLOB, old_value BLOB, op INTEGER, gen INTEGER,"
    " PRIMARY KEY (start_ts, key)) WITHOUT ROWID",
    # COMMITs that came before their prewrite (before INITIALIZED), in arrival order.
    "CREATE TABLE early(seq INTEGER PRIMARY KEY, start_ts INTEGER, key BLOB, commit_ts INTEGER, op INTEGER)",
    "CREATE INDEX early_key ON early(start_ts, key)",
    # Committed changes held until INITIALIZED, in arrival order; each (key, commit_ts) once.
    "CREATE TABLE held(seq INTEGER PRIMARY KEY, commit_ts INTEGER, key BLOB, value BLOB, old_value BLOB,"
    " start_ts INTEGER, del INTEGER)",  # seq: assigned in insertion (arrival) order
    "CREATE UNIQUE INDEX held_once ON held(key, commit_ts)",
    "CREATE INDEX held_order ON held(commit_ts, seq)",
)

#: A pending prewrite: value, old value, op type, generation.
Prewrite = tuple[bytes, bytes, int, int]
#: An early commit: arrival number, start ts, key, commit ts, op type.
Early = tuple[int, int, bytes, int, int]
#: A held committed change: commit ts, key, value, old value, start ts, delete.
Held = tuple[int, bytes, bytes, bytes, int, bool]


class MemoryHolder(Protocol):
    """Something :class:`FeedMemory` accounts bytes to, and can ask to spill."""

    @property
    def memory(self) -> int:
        """The bytes accounted to this holder."""
        ...

    def spill(self, target: int) -> int:
        """Move entries held in memory to disk until ``target`` bytes are released
        (or all of them); returns the bytes released."""
        ...


class FeedMemory:
    """The bytes an EventFeed client's regions hold, against ``budget`` (see the module docs).

    Counters (for metrics and tests): ``used`` and ``peak`` accounted bytes,
    ``spills`` (holders spilled), ``spilled_entries`` (entries written to
    disk, by a spill or directly), ``matched_on_disk`` (commits and rollbacks
    that found their prewrite on disk) and ``files`` (spill files created).
    """

    def __init__(self, budget: int | None = None, directory: Path | None = None) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"budget must be >= 0, not {budget}")
        self.budget = budget
        self._own_directory = directory is None
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            # Spill files hold only what a restart feeds again: start empty.
            shutil.rmtree(self.directory, ignore_errors=True)
        self._files_dir: Path | None = None
        self.used = 0
        self.peak = 0
        self.spills = 0
        self.spilled_entries = 0
        self.matched_on_disk = 0
        self.files = 0
        self._holders: dict[int, MemoryHolder] = {}
        self._names = itertools.count(1)

    def register(self, holder: MemoryHolder) -> None:
        """``holder`` will ask for room (and may be asked to spill) until :meth:`forget`."""
        self._holders[id(holder)] = holder

    def admit(self, size: int) -> bool:
        """Account ``size`` more bytes if they fit the budget, spilling the largest
        holders (the caller included) to make room; False: keep the entry on disk.

        After a True answer the caller must still check where its entries went:
        it may have been spilled to make room.
        """
        used = self.used + size
        if self.budget is not None and used > self.budget:
            self._make_room(size)
            used = self.used + size
            if used > self.budget:
                return False
        self.used = used
        self.peak = max(self.peak, used)
        return True

    def release(self, size: int) -> None:
        """``size`` accounted bytes are no longer kept (by whichever holder had them)."""
        self.used -= size

    def forget(self, holder: MemoryHolder) -> None:
        """``holder`` is gone (its bytes must have been released)."""
        self._holders.pop(id(holder), None)

    def _make_room(self, size: int) -> None:
        assert self.budget is not None
        # A slice of the budget beyond what is needed, so that the next entries fit
        # without another spill, and one spill never moves the whole budget at once.
        slack = self.budget // SPILL_SLICES
        for victim in sorted(self._holders.values(), key=lambda h: h.memory, reverse=True):
            need = self.used + size - self.budget
            if need <= 0 or victim.memory <= 0:
                return
            freed = victim.spill(need + slack)
            if freed:
                self.spills += 1
                # The first spill says where the disk goes; later ones are routine.
                level = logging.INFO if self.spills == 1 else logging.DEBUG
                log.log(
                    level,
                    "EventFeed memory budget %d B reached: spilled %d B to %s",
                    self.budget,
                    freed,
                    self.directory,
                )

    def open_spill(self) -> RegionSpill:
        """A new spill file (for one region subscription)."""
        if self._files_dir is None:
            if self.directory is None:
                self.directory = Path(tempfile.mkdtemp(prefix="cdcflow-feed-spill-"))
            self.directory.mkdir(parents=True, exist_ok=True)
            self._files_dir = Path(tempfile.mkdtemp(prefix="client-", dir=self.directory))
        self.files += 1
        return RegionSpill(self._files_dir / f"region-{next(self._names)}.db", self)

    def close(self) -> None:
        """Delete this client's spill files (every region subscription must be closed),
        and the directory when nothing else is left in it."""
        if self._files_dir is not None:
            shutil.rmtree(self._files_dir, ignore_errors=True)
            self._files_dir = None
        if self.directory is not None:
            with contextlib.suppress(OSError):
                self.directory.rmdir()  # only when empty: another client may use it
            if self._own_directory:
                self.directory = None


class RegionSpill:
    """The entries one region subscription keeps on disk: an SQLite file, deleted on :meth:`close`.

    Nothing is synced: the file only outlives memory, not a crash.
    """

    def __init__(self, path: Path, memory: FeedMemory) -> None:
        self.path = path
        self._memory = memory
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "locking_mode=EXCLUSIVE", "temp_store=FILE"):
            self._db.execute(f"PRAGMA {pragma}")
        self._db.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
        for statement in _SCHEMA:
            self._db.execute(statement)
        # One transaction for the file's whole life: no commit per statement.
        self._db.execute("BEGIN")
        self.closed = False

    # -- prewrites ------------------------------------------------------------------

    def add_prewrites(self, start_ts: int, entries: Iterable[tuple[bytes, Prewrite]]) -> int:
        """Store prewrites of ``start_ts`` none of which is on disk yet; returns how many."""
        rows = [(start_ts, key, *entry) for key, entry in entries]
        self._db.executemany("INSERT INTO prewrite VALUES (?, ?, ?, ?, ?, ?)", rows)
        self._memory.spilled_entries += len(rows)
        return len(rows)

    def put_prewrite(self, start_ts: int, key: bytes, entry: Prewrite) -> bool:
        """Store a prewrite under the matcher's rules; returns whether it is a new key.

        An empty value (a heartbeat) never replaces a stored value; a lower
        generation never replaces a higher one.
        """
        self._memory.spilled_entries += 1
        inserted = self._db.execute(
            "INSERT OR IGNORE INTO prewrite VALUES (?, ?, ?, ?, ?, ?)", (start_ts, key, *entry)
        ).rowcount
        if inserted:
            return True
        value, old_value, op, gen = entry
        self._db.execute(
            "UPDATE prewrite SET value = ?, old_value = ?, op = ?, gen = ?"
            " WHERE start_ts = ? AND key = ? AND NOT (? = x'' AND value != x'') AND gen <= ?",
            (value, old_value, op, gen, start_ts, key, value, gen),
        )
        return False

    def take_prewrite(self, start_ts: int, key: bytes) -> Prewrite | None:
        """Remove and return the prewrite of ``(start_ts, key)``, if stored."""
        row = self._db.execute(
            "DELETE FROM prewrite WHERE start_ts = ? AND key = ? RETURNING value, old_value, op, gen",
            (start_ts, key),
        ).fetchone()
        if row is None:
            return None
        self._memory.matched_on_disk += 1
        return (row[0], row[1], row[2], row[3])

    # -- early commits ------------------------------------------------------------------

    def add_early(self, entries: Iterable[Early]) -> int:
        rows = list(entries)
        self._db.executemany("INSERT INTO early VALUES (?, ?, ?, ?, ?)", rows)
        self._memory.spilled_entries += len(rows)
        return len(rows)

    def take_early(self, start_ts: int, key: bytes) -> list[Early]:
        """Remove and return the early commits of ``(start_ts, key)``, in arrival order."""
        rows = self._db.execute(
            "DELETE FROM early WHERE start_ts = ? AND key = ? RETURNING seq, start_ts, key, commit_ts, op",
            (start_ts, key),
        ).fetchall()
        return sorted((r[0], r[1], r[2], r[3], r[4]) for r in rows)

    def drain_early(self) -> Iterator[Early]:
        """Every early commit in arrival order; they are deleted once all were read."""
        for r in self._stream("SELECT seq, start_ts, key, commit_ts, op FROM early ORDER BY seq", ()):
            yield (r[0], r[1], r[2], r[3], r[4])
        if not self.closed:
            self._db.execute("DELETE FROM early")

    # -- held changes ------------------------------------------------------------------

    def add_held(self, entries: Iterable[Held]) -> int:
        """Store held changes; a ``(key, commit_ts)`` already stored keeps its first copy."""
        rows = list(entries)  # the delete flag is stored as 0/1
        self._db.executemany(
            "INSERT OR IGNORE INTO held(commit_ts, key, value, old_value, start_ts, del) VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        self._memory.spilled_entries += len(rows)
        return len(rows)

    def holds(self, key: bytes, commit_ts: int) -> bool:
        """Whether a held change of ``(key, commit_ts)`` is stored."""
        row = self._db.execute("SELECT 1 FROM held WHERE key = ? AND commit_ts = ?", (key, commit_ts)).fetchone()
        return row is not None

    def drain_held(self, above_ts: int) -> Iterator[Held]:
        """The held changes above ``above_ts`` in ``(commit_ts, arrival)`` order."""
        query = (
            "SELECT commit_ts, key, value, old_value, start_ts, del FROM held"
            " WHERE commit_ts > ? ORDER BY commit_ts, seq"
        )
        for r in self._stream(query, (above_ts,)):
            yield (r[0], r[1], r[2], r[3], r[4], bool(r[5]))

    def clear_held(self) -> None:
        """Forget every held change (they were released)."""
        if not self.closed:
            self._db.execute("DELETE FROM held")

    # -- the file ---------------------------------------------------------------------------

    def _stream(self, query: str, params: tuple[int, ...]) -> Iterator[tuple[Any, ...]]:
        """Rows of ``query``, fetched a few at a time; stops early when the file is closed."""
        cursor = self._db.execute(query, params)
        try:
            while not self.closed:
                rows = cursor.fetchmany(_FETCH)
                if not rows:
                    return
                yield from rows
        finally:
            if not self.closed:
                cursor.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._db.close()
        self.path.unlink(missing_ok=True)
