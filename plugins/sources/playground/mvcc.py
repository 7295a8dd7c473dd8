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

Readers follow Percolator as TiKV serves it: :meth:`MVCCStore.read_range`
reports a lock with start ts at or below the read ts instead of the key's
value (its transaction may commit below the read ts);
:meth:`MVCCStore.check_txn_status` tells a reader the fate of a lock's
transaction from its primary key (rolling it back once the lock's TTL has
expired, and leaving a rollback record so that a late prewrite fails), and
:meth:`MVCCStore.resolve` commits or rolls back the locks of a decided
transaction. :meth:`MVCCStore.load` ingests committed rows in bulk.

Not modelled: heartbeats of locks, async commit, pessimistic locks,
garbage collection of old versions.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from cdcflow.core.data.events import TSO_LOGICAL_BITS
from cdcflow.plugins.sources.playground._keys import encode_key

__all__ = [
    "DEFAULT_LOCK_TTL_MS",
    "Change",
    "ChangeKind",
    "KeyLockedError",
    "Lock",
    "MVCCStore",
    "Mutation",
    "Op",
    "TxnError",
    "TxnStatus",
    "Write",
    "WriteConflictError",
]


#: A lock's time to live when its transaction does not say (TiDB's default for optimistic
#: transactions): a reader that meets it later than that may roll the transaction back.
DEFAULT_LOCK_TTL_MS = 3000


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
    ttl_ms: int = DEFAULT_LOCK_TTL_MS


@dataclass(frozen=True)
class TxnStatus:
    """What :meth:`MVCCStore.check_txn_status` found: locked (``lock_ttl`` > 0, ``lock``
    set), committed (``commit_ts`` > 0) or rolled back (both 0). ``action`` says whether
    the check rolled the transaction back itself ("ttl_expired", "lock_not_exist")."""

    lock_ttl: int = 0
    commit_ts: int = 0
    action: str = ""
    lock: Lock | None = None


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
        self._rolled_back: set[tuple[bytes, int]] = set()  # (key, start ts): a prewrite of it must fail
        self._observers: list[Observer] = []

    def subscribe(self, observer: Observer) -> None:
        """Call ``observer`` with every batch of changes, under the store lock."""
        with self.lock:
            self._observers.append(observer)

    # -- transactions ---------------------------------------------------------------------------

    def prewrite(
        self, mutations: Sequence[Mutation], primary: bytes, start_ts: int, *, ttl_ms: int = DEFAULT_LOCK_TTL_MS
    ) -> None:
        """Lock every key of ``mutations`` for ``start_ts``; all or nothing."""
        with self.lock:
            for m in mutations:
                if (m.key, start_ts) in self._rolled_back:
                    raise TxnError(f"transaction {start_ts} was rolled back by a reader (key {m.key.hex()})")
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
                state.lock = Lock(start_ts, primary, m.op, value, old, ttl_ms)
                self._locked[encode_key(m.key)] = start_ts
                changes.append(Change(ChangeKind.PREWRITE, m.key, start_ts, m.op, value, old))
            self._notify(changes)

    def commit(self, keys: Iterable[bytes], start_ts: int, commit_ts: int) -> None:
        """Turn the locks of ``start_ts`` on ``keys`` into writes at ``commit_ts``."""
        if commit_ts <= start_ts:
            raise TxnError(f"commit ts {commit_ts} must be greater than start ts {start_ts}")
        with self.lock:
            keys = list(keys)
            for key in keys:  # all or nothing: a reader may have rolled the transaction back
                state = self._keys.get(key)
                lock = state.lock if state is not None else None
                if lock is None or lock.start_ts != start_ts:
                    raise TxnError(f"no lock of start ts {start_ts} on key {key.hex()} to commit")
            self._notify([self._commit_key(key, commit_ts) for key in keys])

    def _commit_key(self, key: bytes, commit_ts: int) -> Change:
        state = self._keys[key]
        lock = state.lock
        assert lock is not None
        state.writes.append(Write(lock.start_ts, commit_ts, lock.op, lock.value))
        state.lock = None
        self._locked.pop(encode_key(key), None)
        return Change(ChangeKind.COMMIT, key, lock.start_ts, lock.op, lock.value, lock.old_value, commit_ts)

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

    # -- readers' lock resolution (Percolator) ---------------------------------------------------

    def check_txn_status(
        self, primary: bytes, lock_ts: int, current_ts: int, *, rollback_if_not_exist: bool = True
    ) -> TxnStatus:
        """The fate of transaction ``lock_ts`` whose primary key is ``primary``.

        Locked and alive: its lock and TTL. Locked past its TTL (measured on the
        physical part of ``current_ts``): rolled back now. Committed: its commit ts.
        No lock and no write: rolled back (now, with a rollback record, if
        ``rollback_if_not_exist``), so that the transaction can never commit later.
        """
        with self.lock:
            state = self._keys.get(primary)
            lock = state.lock if state is not None else None
            if lock is not None and lock.start_ts == lock_ts:
                if (current_ts >> TSO_LOGICAL_BITS) >= (lock_ts >> TSO_LOGICAL_BITS) + lock.ttl_ms:
                    self._rollback_keys([primary], lock_ts)
                    return TxnStatus(action="ttl_expired")
                return TxnStatus(lock_ttl=lock.ttl_ms, lock=lock)
            for write in reversed(state.writes if state is not None else []):
                if write.start_ts == lock_ts:
                    return TxnStatus(commit_ts=write.commit_ts)
            if (primary, lock_ts) in self._rolled_back:
                return TxnStatus()
            if rollback_if_not_exist:
                self._rolled_back.add((primary, lock_ts))
                return TxnStatus(action="lock_not_exist")
            return TxnStatus()

    def resolve(
        self, start_ts: int, commit_ts: int, enc_start: bytes, enc_end: bytes, keys: Sequence[bytes] = ()
    ) -> int:
        """Commit (``commit_ts`` > 0) or roll back every lock of ``start_ts`` in encoded range
        [start, end) (only on ``keys`` when given); return how many locks were resolved."""
        with self.lock:
            if keys:
                candidates = [k for k in keys if self._in_range(encode_key(k), enc_start, enc_end)]
            else:
                candidates = [
                    self._raw[enc]
                    for enc, ts in self._locked.items()
                    if ts == start_ts and self._in_range(enc, enc_start, enc_end)
                ]
            locked = [k for k in candidates if (lk := self._keys[k].lock) is not None and lk.start_ts == start_ts]
            if commit_ts:
                self._notify([self._commit_key(key, commit_ts) for key in locked])
            else:
                self._rollback_keys(locked, start_ts)
            return len(locked)

    @staticmethod
    def _in_range(enc: bytes, enc_start: bytes, enc_end: bytes) -> bool:
        return enc >= enc_start and (not enc_end or enc < enc_end)

    def _rollback_keys(self, keys: Sequence[bytes], start_ts: int) -> None:
        changes = []
        for key in keys:
            state = self._keys[key]
            lock = state.lock
            assert lock is not None and lock.start_ts == start_ts
            state.lock = None
            self._locked.pop(encode_key(key), None)
            self._rolled_back.add((key, start_ts))
            changes.append(Change(ChangeKind.ROLLBACK, key, start_ts, lock.op, b"", lock.old_value))
        self._notify(changes)

    # -- bulk ingest ---------------------------------------------------------------------------

    def load(self, pairs: Sequence[tuple[bytes, bytes]], start_ts: int, commit_ts: int) -> None:
        """Ingest ``pairs`` as puts committed at ``commit_ts`` in one step, as a physical
        import does (TiDB Lightning): no locks, and no observer is told (a change feed
        does not see an import either; load before a changefeed starts).
        Refuses a key with a lock or a write at or above ``start_ts``."""
        if commit_ts <= start_ts:
            raise TxnError(f"commit ts {commit_ts} must be greater than start ts {start_ts}")
        with self.lock:
            for key, _ in pairs:
                state = self._keys.get(key)
                if state is not None and state.lock is not None:
                    raise KeyLockedError(key, state.lock)
                if state is not None and state.writes and state.writes[-1].commit_ts >= start_ts:
                    raise WriteConflictError(key, start_ts, state.writes[-1].commit_ts)
            added: list[bytes] = []
            for key, value in pairs:
                state = self._keys.get(key)
                if state is None:
                    state = self._keys[key] = _KeyState()
                    enc = encode_key(key)
                    self._raw[enc] = key
                    added.append(enc)
                state.writes.append(Write(start_ts, commit_ts, Op.PUT, value))
            if added:
                added.sort()
                self._order = list(heapq.merge(self._order, added))

    # -- reads -------------------------------------------------------------------------------

    def read_range(
        self, enc_start: bytes, enc_end: bytes, ts: int, limit: int, *, key_only: bool = False
    ) -> list[tuple[bytes, bytes, Lock | None]]:
        """What a snapshot reader at ``ts`` sees in encoded range [start, end), in key order,
        at most ``limit`` entries (0: no limit): (raw key, value, None) for a live key, or
        (raw key, b"", lock) for a key locked by a transaction with start ts <= ``ts``
        (it may commit below ``ts``: the reader resolves the lock and reads again)."""
        with self.lock:
            out: list[tuple[bytes, bytes, Lock | None]] = []
            lo, hi = self._bounds(enc_start, enc_end)
            for enc in self._order[lo:hi]:
                raw = self._raw[enc]
                state = self._keys[raw]
                lock = state.lock
                if lock is not None and lock.start_ts <= ts:
                    out.append((raw, b"", lock))
                else:
                    value = self._value_at(state, ts)
                    if not value:
                        continue
                    out.append((raw, b"" if key_only else value, None))
                if limit and len(out) >= limit:
                    break
            return out

    def locks(self) -> list[tuple[bytes, Lock]]:
        """Every current lock: (raw key, lock), in key order."""
        with self.lock:
            out = []
            for enc in sorted(self._locked):
                lock = self._keys[self._raw[enc]].lock
                assert lock is not None
                out.append((self._raw[enc], lock))
            return out

    def scan_locks(self, enc_start: bytes, enc_end: bytes, max_ts: int, limit: int) -> list[tuple[bytes, Lock]]:
        """The locks in encoded range [start, end) of transactions with start ts at or below
        ``max_ts``: (raw key, lock) in key order, at most ``limit`` of them (0: no limit)."""
        with self.lock:
            out: list[tuple[bytes, Lock]] = []
            below = (enc for enc, ts in self._locked.items() if ts <= max_ts)
            for enc in sorted(enc for enc in below if self._in_range(enc, enc_start, enc_end)):
                raw = self._raw[enc]
                lock = self._keys[raw].lock
                assert lock is not None
                out.append((raw, lock))
                if limit and len(out) >= limit:
                    break
            return out

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

    def last_key(self, enc_start: bytes, enc_end: bytes) -> bytes | None:
        """The raw key (any version) with the highest encoding in [start, end), None if none."""
        with self.lock:
            lo, hi = self._bounds(enc_start, enc_end)
            return self._raw[self._order[hi - 1]] if hi > lo else None

    def keys_every(self, enc_start: bytes, enc_end: bytes, step: int) -> list[bytes]:
        """Every ``step``-th raw key of [start, end) after the first (split points)."""
        with self.lock:
            lo, hi = self._bounds(enc_start, enc_end)
            return [self._raw[e] for e in self._order[lo + step : hi : step]]

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
