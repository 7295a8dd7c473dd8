"""An MVCC key-value store with Percolator transactions, as TiKV keeps one.

Keys are raw TiDB keys. Each key has committed *writes* (start ts, commit ts,
put or delete, value) and at most one *lock* (start ts, primary key, the
pending mutation). ``prewrite`` takes locks (refusing on a newer committed
write or a foreign lock), ``commit`` turns locks into writes, ``rollback``
drops them. Every change is reported to observers together with the key's
old value (the value visible just before the transaction), which is what
TiKV hands out for ``ExtraOp.ReadOldValue``.

Thread safety: every method takes the cluster lock given at construction, and
observers are called while it is held, so they see changes in exactly the
order they happened (the EventFeed hub relies on that to keep resolved ts
behind every commit). Observers must not block.

Not modelled: TTL/heartbeats of locks, async commit, pessimistic locks,
garbage collection of old versions.
"""

from __future__ import annotations

import bisect
import enum
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from cdcflow.plugins.sources.playground._keys import encode_key

__all__ = [
    "Change",
    "ChangeKind",
    "KeyLockedError",
    "Lock",
    "MVCCStore",
    "Mutation",
    "Op",
    "TxnError",
    "Write",
    "WriteConflictError",
]


class Op(enum.Enum):
    PUT = "put"
    DELETE = "delete"


class ChangeKind(enum.Enum):
    PREWRITE = "prewrite"
    COMMIT = "commit"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class Mutation:
    """One key's change in a transaction (value ignored for deletes)."""

    key: bytes
    op: Op
    value: bytes = b""


@dataclass(frozen=True)
class Lock:
    start_ts: int
    primary: bytes
    op: Op
    value: bytes
    old_value: bytes


@dataclass(frozen=True)
class Write:
    start_ts: int
    commit_ts: int
    op: Op
    value: bytes


@dataclass(frozen=True)
class Change:
    """What observers receive: one key's prewrite, commit or rollback."""

    kind: ChangeKind
    key: bytes
    start_ts: int
    op: Op
    value: bytes
    old_value: bytes
    commit_ts: int = 0


class TxnError(Exception):
    """A Percolator step was refused; the caller rolls back and may retry."""


class KeyLockedError(TxnError):
    def __init__(self, key: bytes, lock: Lock) -> None:
        super().__init__(f"key {key.hex()} is locked by start ts {lock.start_ts}")
        self.key, self.lock = key, lock


class WriteConflictError(TxnError):
    def __init__(self, key: bytes, start_ts: int, conflict_commit_ts: int) -> None:
        super().__init__(f"key {key.hex()} was written at {conflict_commit_ts}, after start ts {start_ts}")
        self.key, self.start_ts, self.conflict_commit_ts = key, start_ts, conflict_commit_ts


Observer = Callable[[Sequence[Change]], None]


@dataclass
class _KeyState:
    writes: list[Write] = field(default_factory=list)  # ascending commit ts
    lock: Lock | None = None


class MVCCStore:
    """Percolator on an in-memory ordered map. See the module docstring."""

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self.lock = lock if lock is not None else threading.RLock()
        self._keys: dict[bytes, _KeyState] = {}
        self._order: list[bytes] = []  # memcomparable-encoded keys, sorted
        self._raw: dict[bytes, bytes] = {}  # encoded -> raw
        self._locked: dict[bytes, int] = {}  # encoded key -> lock start ts (resolved ts needs it often)
        self._observers: list[Observer] = []

    def subscribe(self, observer: Observer) -> None:
        """Call ``observer`` with every batch of changes, under the store lock."""
        with self.lock:
            self._observers.append(observer)

    # -- transactions ---------------------------------------------------------------------------

    def prewrite(self, mutations: Sequence[Mutation], primary: bytes, start_ts: int) -> None:
        """Lock every key of ``mutations`` for ``start_ts``; all or nothing."""
        with self.lock:
            for m in mutations:
                state = self._keys.get(m.key)
                if state is None:
                    continue
                if state.lock is not None and state.lock.start_ts != start_ts:
                    raise KeyLockedError(m.key, state.lock)
                if state.writes and state.writes[-1].commit_ts >= start_ts:
                    raise WriteConflictError(m.key, start_ts, state.writes[-1].commit_ts)
            changes = []
            for m in mutations:
                state = self._state(m.key)
                old = self._value_at(state, start_ts)
                value = m.value if m.op is Op.PUT else b""
                state.lock = Lock(start_ts, primary, m.op, value, old)
                self._locked[encode_key(m.key)] = start_ts
                changes.append(Change(ChangeKind.PREWRITE, m.key, start_ts, m.op, value, old))
            self._notify(changes)

    def commit(self, keys: Iterable[bytes], start_ts: int, commit_ts: int) -> None:
        """Turn the locks of ``start_ts`` on ``keys`` into writes at ``commit_ts``."""
        if commit_ts <= start_ts:
            raise TxnError(f"commit ts {commit_ts} must be greater than start ts {start_ts}")
        with self.lock:
            changes = []
            for key in keys:
                state = self._keys.get(key)
                lock = state.lock if state is not None else None
                if state is None or lock is None or lock.start_ts != start_ts:
                    raise TxnError(f"no lock of start ts {start_ts} on key {key.hex()} to commit")
                state.writes.append(Write(start_ts, commit_ts, lock.op, lock.value))
                state.lock = None
                self._locked.pop(encode_key(key), None)
                changes.append(Change(ChangeKind.COMMIT, key, start_ts, lock.op, lock.value, lock.old_value, commit_ts))
            self._notify(changes)

    def rollback(self, keys: Iterable[bytes], start_ts: int) -> None:
        """Drop the locks of ``start_ts`` on ``keys`` (keys without one are skipped)."""
        with self.lock:
            changes = []
            for key in keys:
                state = self._keys.get(key)
                if state is None or state.lock is None or state.lock.start_ts != start_ts:
                    continue
                lock, state.lock = state.lock, None
                self._locked.pop(encode_key(key), None)
                changes.append(Change(ChangeKind.ROLLBACK, key, start_ts, lock.op, b"", lock.old_value))
            self._notify(changes)

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: bytes, ts: int) -> bytes | None:
        """The committed value of ``key`` visible at ``ts`` (None if absent or deleted).

        Locks are ignored: a reader at ``ts`` sees only writes with commit ts <= ts.
        Reading at a ts below an existing lock's eventual commit ts is consistent
        only once that ts is resolved; callers use a ts from the oracle.
        """
        with self.lock:
            state = self._keys.get(key)
            return None if state is None else (self._value_at(state, ts) or None)

    def scan(self, start: bytes, end: bytes, ts: int) -> Iterator[tuple[bytes, bytes]]:
        """(raw key, value) of live keys in raw range [start, end) at ``ts``, in key order."""
        with self.lock:
            items = []
            for raw in self._raw_keys_between(encode_key(start), encode_key(end) if end else b""):
                value = self._value_at(self._keys[raw], ts)
                if value:
                    items.append((raw, value))
        yield from items

    def feed_scan(self, enc_start: bytes, enc_end: bytes, checkpoint_ts: int) -> tuple[list[Change], list[Change]]:
        """What an incremental scan from ``checkpoint_ts`` sees in encoded range [start, end).

        Returns (committed, locks): every write with commit ts > checkpoint_ts (as COMMIT
        changes, with old values) in key then commit-ts order, and every current lock
        (as PREWRITE changes). Caller holds the lock to pair it with a subscription.
        """
        with self.lock:
            committed: list[Change] = []
            locks: list[Change] = []
            for raw in self._raw_keys_between(enc_start, enc_end):
                state = self._keys[raw]
                prev = b""
                for w in state.writes:
                    if w.commit_ts > checkpoint_ts:
                        committed.append(Change(ChangeKind.COMMIT, raw, w.start_ts, w.op, w.value, prev, w.commit_ts))
                    prev = w.value
                if state.lock is not None:
                    lk = state.lock
                    locks.append(Change(ChangeKind.PREWRITE, raw, lk.start_ts, lk.op, lk.value, lk.old_value))
            return committed, locks

    def min_lock_ts(self, enc_start: bytes, enc_end: bytes) -> int | None:
        """Smallest start ts of a lock in encoded range [start, end), None if unlocked."""
        with self.lock:
            tss = [ts for enc, ts in self._locked.items() if enc >= enc_start and (not enc_end or enc < enc_end)]
            return min(tss) if tss else None

    def key_count(self, enc_start: bytes, enc_end: bytes) -> int:
        """Number of keys (any version) in encoded range [start, end)."""
        with self.lock:
            lo, hi = self._bounds(enc_start, enc_end)
            return hi - lo

    def middle_key(self, enc_start: bytes, enc_end: bytes) -> bytes | None:
        """The encoded key in the middle of the range (a split point), None if < 2 keys."""
        with self.lock:
            lo, hi = self._bounds(enc_start, enc_end)
            if hi - lo < 2:
                return None
            return self._order[(lo + hi) // 2]

    # -- internals ---------------------------------------------------------------------------

    def _state(self, key: bytes) -> _KeyState:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _KeyState()
            enc = encode_key(key)
            bisect.insort(self._order, enc)
            self._raw[enc] = key
        return state

    @staticmethod
    def _value_at(state: _KeyState, ts: int) -> bytes:
        for w in reversed(state.writes):
            if w.commit_ts <= ts:
                return w.value if w.op is Op.PUT else b""
        return b""

    def _bounds(self, enc_start: bytes, enc_end: bytes) -> tuple[int, int]:
        lo = bisect.bisect_left(self._order, enc_start)
        hi = bisect.bisect_left(self._order, enc_end) if enc_end else len(self._order)
        return lo, max(lo, hi)

    def _raw_keys_between(self, enc_start: bytes, enc_end: bytes) -> list[bytes]:
        lo, hi = self._bounds(enc_start, enc_end)
        return [self._raw[e] for e in self._order[lo:hi]]

    def _notify(self, changes: list[Change]) -> None:
        if changes:
            for observer in self._observers:
                observer(changes)
