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
:class:`~cdcflow.plugins.sources.tikv.spill.FeedMemory`; past its budget a
slice of it (what is needed plus a sixteenth of the budget) moves to the
region's spill file, with the same results in the same order:

* prewrites first, oldest first. A key is in one place only: a transaction
  with locks on disk puts its new keys on disk too, and a lookup tries memory,
  then disk;
* then held changes, oldest first: the disk holds a prefix of the arrival
  order, memory the rest, and release merges the two (within a commit ts the
  disk's come first; a copy of a change already on disk is dropped);
* early commits (rare) as a whole: once spilled, the rest of them join the
  file until INITIALIZED.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass

from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2
from cdcflow.plugins.sources.tikv.spill import Early, FeedMemory, Held, Prewrite, RegionSpill

__all__ = ["Committed", "InvalidEntryError", "Matcher", "UnmatchedCommitError", "check_commit_ts"]

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


class InvalidEntryError(UnmatchedCommitError):
    """An entry no TiKV store sends (commit ts below start ts): resubscribe the region, as for an unmatched commit."""


def check_commit_ts(row: Row) -> None:
    """Refuse a COMMIT or COMMITTED entry whose commit ts is below its start ts (the client resubscribes)."""
    if row.commit_ts < row.start_ts:
        raise InvalidEntryError(
            f"entry of key {row.key.hex()} has commit_ts={row.commit_ts} below start_ts={row.start_ts}"
        )


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


def _held_size(change: Committed) -> int:
    return HELD_OVERHEAD + len(change.key) + len(change.value) + len(change.old_value)


def _early_size(entry: Early) -> int:
    return EARLY_OVERHEAD + len(entry[2])


_COMMIT_TS = operator.attrgetter("commit_ts")


def _merge_key(item: tuple[Committed, bool]) -> int:
    return item[0].commit_ts


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
        #: Held changes in arrival order: the oldest on disk (``_held_on_disk``), the rest here.
        self._held: list[Committed] = []
        self._held_bytes = 0
        self._held_on_disk = False
        self._seq = itertools.count()  # arrival order of early commits
        #: Bytes accounted to this matcher.
        self.memory = 0
        self._disk: RegionSpill | None = None
        #: start ts → how many of its prewrites are on disk (a transaction marked spilled).
        self._spilled_txns: dict[int, int] = {}
        self._early_on_disk = 0
        self._early_spilled = False
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
        k = (start_ts, key)
        cached = self._prewrites.get(k)
        if cached is not None:
            if not entry[0] and cached[0]:
                return []  # heartbeat "fake" prewrite: keep the real value
            if entry[3] < cached[3]:
                return []  # an older generation of a pipelined-DML lock
            self._drop_prewrite(k, cached)
            self._keep_prewrite(start_ts, key, entry)
        elif start_ts in self._spilled_txns:
            # The key may be on disk: the same rules there, and a new key joins it.
            assert self._disk is not None
            if self._disk.put_prewrite(start_ts, key, entry):
                self._spilled_txns[start_ts] += 1
        else:
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
        size = _held_size(change)
        if self._account.admit(size):
            self._held.append(change)
            self._held_bytes += size
            self.memory += size
        else:  # nothing of this region is in memory now: the arrival order holds on disk
            self._spill_file().add_held([_held_row(change)])
            self._held_on_disk = True

    def release(self) -> Iterator[Committed]:
        """The held changes in commit-ts order, each ``(key, commit_ts)`` once, none at or below the checkpoint.

        The scan and live rows of one registration may report the same commit
        (a write between registration and the scan's snapshot); one copy is
        enough. Order between keys of equal commit ts is arrival order. What
        was spilled (the oldest) is streamed from disk, merged with the rest;
        stops when the matcher is closed meanwhile.
        """
        # Out of reach of spill() while being emitted, and accounted until the end.
        held, self._held = self._held, []
        size, self._held_bytes = self._held_bytes, 0
        disk = self._disk if self._held_on_disk else None
        self._held_on_disk = False
        try:
            held.sort(key=_COMMIT_TS)  # stable: arrival order within a commit ts
            yield from _once_in_order(held, self.checkpoint_ts, disk)
            if disk is not None:
                disk.clear_held()
        finally:
            if not self._closed:  # close() released them already
                self._forget_bytes(size)

    # -- memory and disk ---------------------------------------------------------------------

    def spill(self, target: int) -> int:
        """Move entries kept in memory to the region's spill file until ``target`` bytes
        are released, or all of them (see the module docs); returns the bytes released.
        Prewrites go first, oldest first; changes being released at INITIALIZED stay."""
        if not (self._prewrites or self._early or self._held):
            return 0
        disk = self._spill_file()
        freed = 0
        by_txn: dict[int, list[tuple[bytes, Prewrite]]] = {}
        for (start_ts, key), entry in self._prewrites.items():  # oldest first
            if freed >= target:
                break
            by_txn.setdefault(start_ts, []).append((key, entry))
            freed += _prewrite_size(key, entry)
        for start_ts, entries in by_txn.items():
            for key, _ in entries:
                del self._prewrites[(start_ts, key)]
            self._spilled_txns[start_ts] = self._spilled_txns.get(start_ts, 0) + disk.add_prewrites(start_ts, entries)
        if freed >= target:
            self._forget_bytes(freed)
            return freed
        if self._early:
            early = sorted(e for entries in self._early.values() for e in entries)
            freed += sum(map(_early_size, early))
            self._early_on_disk += disk.add_early(early)
            self._early = {}
            self._early_spilled = True
        if self._held and freed < target:  # the oldest first: the disk keeps the arrival order's prefix
            count = moved = 0
            for change in self._held:
                if freed + moved >= target:
                    break
                moved += _held_size(change)
                count += 1
            disk.add_held(map(_held_row, self._held[:count]))
            del self._held[:count]
            self._held_bytes -= moved
            freed += moved
            self._held_on_disk = True
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

    def _early_spilled_by_admit(self) -> bool:
        # Admitting may spill this region's early entries (the account spills
        # the regions holding most); read the flag afresh after it.
        return self._early_spilled

    def _spill_file(self) -> RegionSpill:
        if self._disk is None:
            self._disk = self._account.open_spill()
        return self._disk

    def _keep_prewrite(self, start_ts: int, key: bytes, entry: Prewrite) -> None:
        """Keep a prewrite whose key is in neither place: in memory if it fits, else on disk."""
        size = _prewrite_size(key, entry)
        if self._account.admit(size):
            self._prewrites[(start_ts, key)] = entry
            self.memory += size
            return
        self._spill_file().put_prewrite(start_ts, key, entry)
        self._spilled_txns[start_ts] = self._spilled_txns.get(start_ts, 0) + 1

    def _forget_bytes(self, size: int) -> None:
        self.memory -= size
        self._account.release(size)

    def _drop_prewrite(self, k: tuple[int, bytes], entry: Prewrite) -> None:
        del self._prewrites[k]
        self._forget_bytes(_prewrite_size(k[1], entry))

    def _take_prewrite(self, start_ts: int, key: bytes) -> Prewrite | None:
        """Remove and return the prewrite of ``(start_ts, key)`` from wherever it is."""
        k = (start_ts, key)
        cached = self._prewrites.get(k)
        if cached is not None:
            self._drop_prewrite(k, cached)
            return cached
        on_disk = self._spilled_txns.get(start_ts)
        if on_disk is None:
            return None
        assert self._disk is not None
        entry = self._disk.take_prewrite(start_ts, key)
        if entry is not None:
            if on_disk > 1:
                self._spilled_txns[start_ts] = on_disk - 1
            else:
                del self._spilled_txns[start_ts]  # nothing of it left on disk
        return entry

    def _keep_early(self, entry: Early) -> None:
        if not self._early_spilled:
            size = _early_size(entry)
            if self._account.admit(size):
                if not self._early_spilled_by_admit():
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


def _once_in_order(held: list[Committed], checkpoint: int, disk: RegionSpill | None) -> Iterator[Committed]:
    """``held`` (sorted by commit ts) merged with the held changes on ``disk``, above ``checkpoint``,
    each ``(key, commit_ts)`` once.

    The disk holds the oldest arrivals, each once (its unique index), so within
    a commit ts they come first; a change in memory is dropped when a copy came
    before it, in memory (``seen``: bounded by what memory holds) or on disk.
    """
    seen: set[bytes] = set()
    seen_ts = -1
    if disk is None:
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
        return
    spilled = ((Committed(r[1], r[2], r[3], r[4], r[0], r[5]), True) for r in disk.drain_held(checkpoint))
    fresh = ((c, False) for c in held if c.commit_ts > checkpoint)
    for change, from_disk in heapq.merge(spilled, fresh, key=_merge_key):
        if from_disk:
            yield change
            continue
        if change.commit_ts != seen_ts:
            seen.clear()
            seen_ts = change.commit_ts
        if change.key in seen or disk.holds(change.key, change.commit_ts):
            continue
        seen.add(change.key)
        yield change


def _held_row(change: Committed) -> Held:
    return (change.commit_ts, change.key, change.value, change.old_value, change.start_ts, change.delete)
