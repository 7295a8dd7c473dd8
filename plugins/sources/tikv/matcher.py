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
"""

from __future__ import annotations

from dataclasses import dataclass

from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2

__all__ = ["Matcher", "UnmatchedCommitError"]

Row = cdcpb_pb2.Event.Row
_DELETE = cdcpb_pb2.Event.Row.DELETE
_UNKNOWN_OP = cdcpb_pb2.Event.Row.UNKNOWN


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


def _committed(row: Row, prewrite: Row | None = None) -> Committed:
    src = prewrite if prewrite is not None else row
    op = row.op_type if row.op_type != _UNKNOWN_OP else src.op_type
    return Committed(
        key=row.key,
        value=src.value,
        old_value=src.old_value,
        start_ts=row.start_ts,
        commit_ts=row.commit_ts,
        delete=op == _DELETE,
    )


class Matcher:
    """The prewrite cache of one region subscription (not shared between regions)."""

    def __init__(self, checkpoint_ts: int) -> None:
        self.checkpoint_ts = checkpoint_ts
        self._prewrites: dict[tuple[int, bytes], Row] = {}
        self._early_commits: list[Row] = []
        #: Commits skipped as stale or dropped as already delivered (for tests and metrics).
        self.skipped = 0

    def __len__(self) -> int:
        return len(self._prewrites)

    def prewrite(self, row: Row, initialized: bool) -> list[Committed]:
        """Cache ``row``; returns early commits it completes (only before INITIALIZED)."""
        k = (row.start_ts, row.key)
        cached = self._prewrites.get(k)
        if cached is not None:
            if not row.value and cached.value:
                return []  # heartbeat "fake" prewrite: keep the real value
            if row.generation < cached.generation:
                return []  # an older generation of a pipelined-DML lock
        self._prewrites[k] = row
        if initialized or not self._early_commits:
            return []
        return self._match_early(k)

    def _match_early(self, k: tuple[int, bytes]) -> list[Committed]:
        out: list[Committed] = []
        keep: list[Row] = []
        for commit in self._early_commits:
            if (commit.start_ts, commit.key) == k:
                out.append(_committed(commit, self._prewrites.pop(k)))
            else:
                keep.append(commit)
        self._early_commits = keep
        return out

    def commit(self, row: Row, initialized: bool) -> Committed | None:
        """The committed change for a COMMIT entry, or None (stale, or cached until its prewrite)."""
        k = (row.start_ts, row.key)
        if row.commit_ts <= self.checkpoint_ts:
            self._prewrites.pop(k, None)
            self.skipped += 1
            return None
        prewrite = self._prewrites.pop(k, None)
        if prewrite is not None:
            return _committed(row, prewrite)
        if not initialized:
            self._early_commits.append(row)
            return None
        raise UnmatchedCommitError(
            f"COMMIT of key {row.key.hex()} start_ts={row.start_ts} commit_ts={row.commit_ts} has no PREWRITE"
        )

    def committed(self, row: Row) -> Committed | None:
        """A COMMITTED entry of the incremental scan (None when stale)."""
        if row.commit_ts <= self.checkpoint_ts:
            self.skipped += 1
            return None
        return _committed(row)

    def rollback(self, row: Row) -> None:
        self._prewrites.pop((row.start_ts, row.key), None)

    def initialized(self) -> list[Committed]:
        """At INITIALIZED: match cached early commits; any still unmatched were delivered as COMMITTED.

        A commit whose lock the scan never reported was committed before the
        scan's snapshot, so the scan delivered it as COMMITTED already.
        """
        out: list[Committed] = []
        for commit in self._early_commits:
            prewrite = self._prewrites.pop((commit.start_ts, commit.key), None)
            if prewrite is not None:
                out.append(_committed(commit, prewrite))
            else:
                self.skipped += 1
        self._early_commits = []
        return out
