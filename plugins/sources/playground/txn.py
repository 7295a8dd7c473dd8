"""Client-side Percolator transactions against the playground's MVCC store.

``Transaction`` buffers puts and deletes, then runs the two phases with a
start ts and a commit ts from the oracle (the commit ts is taken after
prewrite, which is what keeps resolved ts safe). The phases are public so
tests can interleave prewrites, commits and rollbacks of several transactions.
"""

from __future__ import annotations

from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.playground.mvcc import DEFAULT_LOCK_TTL_MS, Mutation, Op

__all__ = ["Transaction"]


class Transaction:
    """One optimistic transaction. Not thread-safe; use one per thread."""

    def __init__(self, cluster: Cluster, *, ttl_ms: int = DEFAULT_LOCK_TTL_MS) -> None:
        self.cluster = cluster
        #: How long its locks live: a reader that meets one older than that rolls the transaction back.
        self.ttl_ms = ttl_ms
        self.start_ts = cluster.oracle.next()
        self.commit_ts = 0
        self._mutations: dict[bytes, Mutation] = {}
        self._prewritten = False

    def put(self, key: bytes, value: bytes) -> None:
        if not value:
            raise PlaygroundError("a put needs a non-empty value; use delete() to remove a key")
        self._mutations[key] = Mutation(key, Op.PUT, value)

    def delete(self, key: bytes) -> None:
        self._mutations[key] = Mutation(key, Op.DELETE)

    @property
    def keys(self) -> list[bytes]:
        return list(self._mutations)

    def get(self, key: bytes) -> bytes | None:
        """Read at the start ts, seeing this transaction's own buffered writes."""
        if key in self._mutations:
            m = self._mutations[key]
            return m.value if m.op is Op.PUT else None
        return self.cluster.mvcc.get(key, self.start_ts)

    def prewrite(self) -> None:
        """Phase one: lock every key (raises a TxnError on conflict; nothing is then locked)."""
        if not self._mutations:
            raise PlaygroundError("nothing to prewrite: the transaction has no mutations")
        primary = next(iter(self._mutations))
        self.cluster.mvcc.prewrite(list(self._mutations.values()), primary, self.start_ts, ttl_ms=self.ttl_ms)
        self._prewritten = True

    def commit_prewritten(self) -> int:
        """Phase two: take a commit ts and commit every lock; return the commit ts."""
        if not self._prewritten:
            raise PlaygroundError("commit before prewrite")
        self.commit_ts = self.cluster.oracle.next()
        self.cluster.mvcc.commit(self.keys, self.start_ts, self.commit_ts)
        return self.commit_ts

    def commit_primary(self) -> int:
        """Phase two for the primary key only, as a client that dies right after it leaves the
        transaction: committed (its fate is decided), its secondaries still locked until a reader
        resolves them. Return the commit ts."""
        if not self._prewritten:
            raise PlaygroundError("commit before prewrite")
        self.commit_ts = self.cluster.oracle.next()
        self.cluster.mvcc.commit(self.keys[:1], self.start_ts, self.commit_ts)
        return self.commit_ts

    def commit(self) -> int:
        """Both phases; return the commit ts."""
        self.prewrite()
        return self.commit_prewritten()

    def rollback(self) -> None:
        self.cluster.mvcc.rollback(self.keys, self.start_ts)
        self._prewritten = False
