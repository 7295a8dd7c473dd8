"""The CockroachDB playground: a pgwire server over an MVCC store, a shop workload and fault injection."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

from cdcflow.plugins.sources.cockroach_playground.pgwire import PgServer
from cdcflow.plugins.sources.cockroach_playground.sql import Session, SQLError
from cdcflow.plugins.sources.cockroach_playground.store import Store
from cdcflow.plugins.sources.cockroach_playground.workload import SHOP_DDL, Workload, WorkloadStats
from cdcflow.plugins.sources.cockroachdb.hlc import HLC

__all__ = ["CockroachPlayground"]


class CockroachPlayground:
    """An in-process CockroachDB stand-in on 127.0.0.1 speaking the PostgreSQL wire protocol.

    ``with CockroachPlayground(rate=20) as pg:`` serves database ``shop`` (tables
    customers, products, orders) at ``pg.dsn`` and runs the workload. With
    ``password`` set, user ``user`` must authenticate (``auth``: scram-sha-256
    or password); otherwise any user is trusted, like ``--insecure``.
    """

    def __init__(
        self,
        *,
        rate: float = 50.0,
        seed: int = 0,
        port: int = 0,
        user: str = "root",
        password: str | None = None,
        auth: str = "scram-sha-256",
    ) -> None:
        self.store = Store("shop")
        self.user = user
        self.password = password
        self.server = PgServer(self.store, passwords={user: password} if password else None, auth=auth)
        self.workload = Workload(self.store, rate=rate, seed=seed)
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cockroach-playground", daemon=True)
        self._retry_commits = 0
        self.server.before_commit = self._before_commit
        session = Session(self.store)
        for ddl in SHOP_DDL:
            session.execute(ddl)

    # -- lifecycle
    def start(self) -> CockroachPlayground:
        self._thread.start()
        self.port = self._call(self.server.start(self._port))
        self.workload.start()
        return self

    def stop(self) -> WorkloadStats:
        stats = self.workload.stop()
        if self._thread.is_alive():
            self._call(self.server.stop())
            self._call(self._cancel_tasks())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
        return stats

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> CockroachPlayground:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=30)

    @property
    def dsn(self) -> str:
        auth = f"{self.user}:{self.password}@" if self.password else f"{self.user}@"
        return f"postgresql://{auth}127.0.0.1:{self.port}/shop?sslmode=disable"

    def stop_workload(self) -> WorkloadStats:
        return self.workload.stop()

    def start_workload(self, rate: float | None = None) -> None:
        """(Re)start the shop workload, at ``rate`` transactions per second when given."""
        self.workload.start(rate)

    # -- reading
    def execute(self, sql: str) -> list[list[Any]]:
        """Run one statement in-process (no wire) and return its rows."""
        return Session(self.store).execute(sql).rows

    def now(self) -> HLC:
        return self.store.now()

    def snapshot(self, table: str, at: HLC | None = None) -> list[dict[str, Any]]:
        """Every row of ``table`` as of ``at`` (now when None)."""
        return self.store.rows_at(table, at)

    def active_feeds(self) -> int:
        return len(self.server.feeds)

    # -- fault injection
    def drop_feed_connections(self) -> int:
        """Close every changefeed connection (the source must reconnect from its cursor)."""
        count = len(self.server.feeds)
        self._loop.call_soon_threadsafe(self.server.drop_feed_connections)
        return count

    def fail_feeds(
        self, sqlstate: str = "40001", message: str = "restart transaction: TransactionRetryWithProtoRefreshError"
    ) -> int:
        """Every running changefeed ends with this error at its next step."""
        return self.server.fail_feeds(sqlstate, message)

    def advance_gc_threshold(self, table: str, to: HLC | None = None) -> HLC:
        """Move ``table``'s GC threshold (now by default): cursors below it fail."""
        threshold = to or self.store.now()
        with self.store.lock:
            self.store.table(table).gc_threshold = threshold
        return threshold

    def fail_commits(self, count: int) -> None:
        """The next ``count`` commits through pgwire fail with 40001 (the client retries)."""
        self._retry_commits = count

    def _before_commit(self) -> None:
        if self._retry_commits > 0:
            self._retry_commits -= 1
            raise SQLError("40001", "restart transaction: TransactionRetryWithProtoRefreshError: injected")
