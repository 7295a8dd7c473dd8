"""Percolator matching for one region subscription: PREWRITE + COMMIT → a committed change.

TiKV sends a transaction's two phases separately: a PREWRITE entry carries the
value, the COMMIT entry only the commit ts. During the incremental scan TiKV
also sends COMMITTED entries (already complete) and the locks it finds as
PREWRITE entries, concurrently with live PREWRITE/COMMIT traffic, so a live
COMMIT can arrive before the scan reports its lock. The rules (the reference's
§3.3, and seed 003):

* PREWRITE: cache by ``(start_ts, key)``. An empty-value prewrite is a
  transaction heartbeat and never replaces a cached value; a pipelined-DML
  prewrite only replaces one of a lower ``generation``.
* COMMIT: take the cached prewrite's value and old value. Unmatched before
  INITIALIZED: cache the commit and match it when its prewrite arrives or at
  INITIALIZED. Unmatched after INITIALIZED: an error (the caller re-subscribes
  the region from its resolved ts, which loses nothing).
* ROLLBACK: drop the cached prewrite.
* A COMMIT or COMMITTED at or below the request's checkpoint ts is stale:
  it was delivered before the subscription started, and is skipped.

Until INITIALIZED the region's committed changes are held (:meth:`Matcher.hold`)
and released in commit-ts order at INITIALIZED (:meth:`Matcher.release`).

Everything the matcher keeps is accounted to the client's
:class:`~cdcflow.plugins.sources.tikv.spill.FeedMemory`; past its budget it
moves to the region's spill file, with the same results in the same order:

* prewrites per transaction: spilling marks every ``start_ts`` it moved, and
  later prewrites of a marked transaction go to disk too (so one key is never
  in both places); unmarked transactions keep using memory;
* early commits and held changes as a whole: once spilled, the rest of them
  join the file until INITIALIZED.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass

from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2
from cdcflow.plugins.sources.tikv.spill import Early, FeedMemory, Held, Prewrite, RegionSpill

__all__ = ["Committed", "Matcher", "UnmatchedCommitError"]

Row = cdcpb_pb2.Event.Row
_DELETE = cdcpb_pb2.Event.Row.DELETE
_UNKNOWN_OP = cdcpb_pb2.Event.Row.UNKNOWN

# What an entry costs in memory beyond its byte strings (dict or list slot, tuple,
# ints, bytes headers), measured with tracemalloc on CPython 3.11 and rounded up.
PREWRITE_OVERHEAD = 320
EARLY_OVERHEAD = 400
HELD_OVERHEAD = 280


class UnmatchedCommitError(Exception):
    """A COMMIT arrived after INITIALIZED without its PREWRITE: resubscribe the region."""


@dataclass(frozen=True, slots=True)
class Committed:
    """A committed key change ready to emit."""

    key: bytes
    value: bytes
    old_value: bytes
    start_ts: int
    commit_ts: int
    delete: bool


def _op(op_type: int, prewrite_op: int) -> bool:
    """Whether the change is a delete: the commit's op type, else the prewrite's."""
    return (op_type if op_type != _UNKNOWN_OP else prewrite_op) == _DELETE


def _prewrite_size(key: bytes, entry: Prewrite) -> int:
    return PREWRITE_OVERHEAD + len(key) + len(entry[0]) + len(entry[1])


def _early_size(entry: Early) -> int:
    return EARLY_OVERHEAD + len(entry[2])


_COMMIT_TS = operator.attrgetter("commit_ts")


class Matcher:
    """The pending state of one region subscription (not shared between regions).

    ``memory`` is the client's account (an unbounded one when None). Call
    :meth:`close` when the subscription ends: it releases the bytes and
    deletes the region's spill file.
    """

    def __init__(self, checkpoint_ts: int, memory: FeedMemory | None = None) -> None:
        self.checkpoint_ts = checkpoint_ts
        self._account = memory if memory is not None else FeedMemory()
        self._prewrites: dict[tuple[int, bytes], Prewrite] = {}
        self._early: dict[tuple[int, bytes], list[Early]] = {}
        self._held: list[Committed] = []  # in arrival order
        self._held_bytes = 0
        self._seq = itertools.count()  # arrival order of early commits
        #: Bytes accounted to this matcher.
        self.memory = 0
        self._disk: RegionSpill | None = None
        #: start ts → how many of its prewrites are on disk (a transaction marked spilled).
        self._spilled_txns: dict[int, int] = {}
        self._early_on_disk = 0
        self._early_spilled = False
        self._held_spilled = False
        self._closed = False
        self._account.register(self)
        #: Commits skipped as stale or dropped as already delivered (for tests and metrics).
        self.skipped = 0

    def __len__(self) -> int:
        """Pending prewrites, in memory and on disk."""
        return len(self._prewrites) + sum(self._spilled_txns.values())

    # -- the rules ----------------------------------------------------------------------

    def prewrite(self, row: Row, initialized: bool) -> list[Committed]:
        """Cache ``row``; returns early commits it completes (only before INITIALIZED)."""
        start_ts, key = row.start_ts, row.key
        entry: Prewrite = (row.value, row.old_value, row.op_type, row.generation)
        if start_ts in self._spilled_txns:
            assert self._disk is not None
            if self._disk.put_prewrite(start_ts, key, entry):
                self._spilled_txns[start_ts] += 1
        else:
            k = (start_ts, key)
            cached = self._prewrites.get(k)
            if cached is not None:
                if not entry[0] and cached[0]:
                    return []  # heartbeat "fake" prewrite: keep the real value
                if entry[3] < cached[3]:
                    return []  # an older generation of a pipelined-DML lock
                self._drop_prewrite(k, cached)
            self._keep_prewrite(start_ts, key, entry)
        if initialized or not (self._early or self._early_on_disk):
            return []
        return self._match_early(start_ts, key)

    def commit(self, row: Row, initialized: bool) -> Committed | None:
        """The committed change for a COMMIT entry, or None (stale, or cached until its prewrite)."""
        start_ts, key = row.start_ts, row.key
        prewrite = self._take_prewrite(start_ts, key)
        if row.commit_ts <= self.checkpoint_ts:
            self.skipped += 1
            return None
        if prewrite is not None:
            return Committed(key, prewrite[0], prewrite[1], start_ts, row.commit_ts, _op(row.op_type, prewrite[2]))
        if not initialized:
            self._keep_early((next(self._seq), start_ts, key, row.commit_ts, row.op_type))
            return None
        raise UnmatchedCommitError(
            f"COMMIT of key {key.hex()} start_ts={start_ts} commit_ts={row.commit_ts} has no PREWRITE"
        )

    def committed(self, row: Row) -> Committed | None:
        """A COMMITTED entry of the incremental scan (None when stale)."""
        if row.commit_ts <= self.checkpoint_ts:
            self.skipped += 1
            return None
        return Committed(row.key, row.value, row.old_value, row.start_ts, row.commit_ts, row.op_type == _DELETE)

    def rollback(self, row: Row) -> None:
        self._take_prewrite(row.start_ts, row.key)

    def initialized(self) -> None:
        """At INITIALIZED: hold the early commits that match a cached lock; any still
        unmatched were delivered as COMMITTED already.

        A commit whose lock the scan never reported was committed before the
        scan's snapshot, so the scan delivered it as COMMITTED already.
        """
        early = sorted(e for entries in self._early.values() for e in entries)
        self._early = {}
        self._forget_bytes(sum(map(_early_size, early)))
        spilled = self._disk.drain_early() if self._early_on_disk and self._disk is not None else iter(())
        for entry in heapq.merge(early, spilled):  # both in arrival order
            _, start_ts, key, commit_ts, op_type = entry
            prewrite = self._take_prewrite(start_ts, key)
            if prewrite is None:
                self.skipped += 1
            else:
                self.hold(Committed(key, prewrite[0], prewrite[1], start_ts, commit_ts, _op(op_type, prewrite[2])))
        self._early_on_disk = 0
        self._early_spilled = False

    # -- holding until INITIALIZED -----------------------------------------------------------

    def hold(self, change: Committed) -> None:
        """Keep ``change`` until :meth:`release`."""
        if not self._held_spilled:
            size = HELD_OVERHEAD + len(change.key) + len(change.value) + len(change.old_value)
            if self._account.admit(size):
                if not self._held_spilled:
                    self._held.append(change)
                    self._held_bytes += size
                    self.memory += size
                    return
                self._account.release(size)
        # Once spilled, every held change goes to disk (in arrival order) until INITIALIZED.
        self._spill_file().add_held([_held_row(change)])
        self._held_spilled = True

    def release(self) -> Iterator[Committed]:
        """The held changes in commit-ts order, each ``(key, commit_ts)`` once, none at or below the checkpoint.

        The scan and live rows of one registration may report the same commit
        (a write between registration and the scan's snapshot); one copy is
        enough. Order between keys of equal commit ts is arrival order.
        Streams from disk when the held changes were spilled; stops when the
        matcher is closed meanwhile.
        """
        if self._held_spilled:
            assert self._disk is not None
            self._held_spilled = False
            for commit_ts, key, value, old, start_ts, delete in self._disk.drain_held(self.checkpoint_ts):
                yield Committed(key, value, old, start_ts, commit_ts, delete)
            return
        # Out of reach of spill() while being emitted, and accounted until the end.
        held, self._held = self._held, []
        size, self._held_bytes = self._held_bytes, 0
        try:
            held.sort(key=_COMMIT_TS)  # stable: arrival order within a commit ts
            checkpoint = self.checkpoint_ts
            seen: set[bytes] = set()
            seen_ts = -1
            for change in held:
                ts = change.commit_ts
                if ts <= checkpoint:
                    continue
                if ts != seen_ts:
                    seen.clear()  # duplicates share their commit ts
                    seen_ts = ts
                if change.key not in seen:
                    seen.add(change.key)
                    yield change
        finally:
            if not self._closed:  # close() released them already
                self._forget_bytes(size)

    # -- memory and disk ---------------------------------------------------------------------

    def spill(self) -> int:
        """Move every entry kept in memory to the region's spill file (see the module docs);
        returns the bytes released. Changes being released at INITIALIZED stay."""
        if not (self._prewrites or self._early or self._held):
            return 0
        disk = self._spill_file()
        freed = 0
        by_txn: dict[int, list[tuple[bytes, Prewrite]]] = {}
        for (start_ts, key), entry in self._prewrites.items():
            by_txn.setdefault(start_ts, []).append((key, entry))
            freed += _prewrite_size(key, entry)
        for start_ts, entries in by_txn.items():
            self._spilled_txns[start_ts] = self._spilled_txns.get(start_ts, 0) + disk.add_prewrites(start_ts, entries)
        self._prewrites = {}
        if self._early:
            early = sorted(e for entries in self._early.values() for e in entries)
            freed += sum(map(_early_size, early))
            self._early_on_disk += disk.add_early(early)
            self._early = {}
            self._early_spilled = True
        if self._held:
            freed += self._held_bytes
            disk.add_held(map(_held_row, self._held))
            self._held, self._held_bytes = [], 0
            self._held_spilled = True
        self._forget_bytes(freed)
        return freed

    def close(self) -> None:
        """Release everything (the subscription ended); deletes the spill file."""
        self._prewrites, self._early, self._held, self._held_bytes = {}, {}, [], 0
        self._forget_bytes(self.memory)
        self._account.forget(self)
        self._closed = True
        if self._disk is not None:
            self._disk.close()
        self._spilled_txns = {}

    @property
    def spilled(self) -> bool:
        """Whether this matcher has a spill file."""
        return self._disk is not None

    def _spill_file(self) -> RegionSpill:
        if self._disk is None:
            self._disk = self._account.open_spill()
        return self._disk

    def _keep_prewrite(self, start_ts: int, key: bytes, entry: Prewrite) -> None:
        size = PREWRITE_OVERHEAD + len(key) + len(entry[0]) + len(entry[1])
        if self._account.admit(size):
            if start_ts not in self._spilled_txns:
                self._prewrites[(start_ts, key)] = entry
                self.memory += size
                return
            self._account.release(size)
        # Nothing of this transaction is in memory now (spilled to make room, or never there).
        self._spill_file().put_prewrite(start_ts, key, entry)
        self._spilled_txns[start_ts] = self._spilled_txns.get(start_ts, 0) + 1

    def _forget_bytes(self, size: int) -> None:
        self.memory -= size
        self._account.release(size)

    def _drop_prewrite(self, k: tuple[int, bytes], entry: Prewrite) -> None:
        del self._prewrites[k]
        self._forget_bytes(_prewrite_size(k[1], entry))

    def _take_prewrite(self, start_ts: int, key: bytes) -> Prewrite | None:
        on_disk = self._spilled_txns.get(start_ts)
        if on_disk is not None:
            assert self._disk is not None
            entry = self._disk.take_prewrite(start_ts, key)
            if entry is not None:
                if on_disk > 1:
                    self._spilled_txns[start_ts] = on_disk - 1
                else:
                    del self._spilled_txns[start_ts]  # memory may hold this transaction again
            return entry
        k = (start_ts, key)
        cached = self._prewrites.get(k)
        if cached is not None:
            self._drop_prewrite(k, cached)
        return cached

    def _keep_early(self, entry: Early) -> None:
        if not self._early_spilled:
            size = _early_size(entry)
            if self._account.admit(size):
                if not self._early_spilled:
                    self._early.setdefault((entry[1], entry[2]), []).append(entry)
                    self.memory += size
                    return
                self._account.release(size)
        self._early_on_disk += self._spill_file().add_early([entry])
        self._early_spilled = True

    def _match_early(self, start_ts: int, key: bytes) -> list[Committed]:
        k = (start_ts, key)
        early = self._early.pop(k, [])
        self._forget_bytes(sum(map(_early_size, early)))
        if self._early_on_disk and self._disk is not None:
            spilled = self._disk.take_early(start_ts, key)
            self._early_on_disk -= len(spilled)
            early = sorted(early + spilled)
        if not early:
            return []
        prewrite = self._take_prewrite(start_ts, key)
        assert prewrite is not None  # just cached
        return [
            Committed(key, prewrite[0], prewrite[1], start_ts, commit_ts, _op(op_type, prewrite[2]))
            for _, _, _, commit_ts, op_type in early
        ]


def _held_row(change: Committed) -> Held:
    return (change.commit_ts, change.key, change.value, change.old_value, change.start_ts, change.delete)
