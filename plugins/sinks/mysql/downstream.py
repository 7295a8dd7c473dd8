"""Connections to the downstream, one per worker, with retry and backoff.

A transient failure (server down, connection lost, deadlock, lock wait
timeout) closes the worker's connection, waits with exponential backoff and
runs the whole downstream transaction again on a new connection — with
``retried=True`` so that the caller switches to upserts: after a lost
connection the outcome of a COMMIT is unknown, and only an idempotent
re-run is safe. After ``retry-timeout`` seconds the error becomes
:class:`~cdcflow.core.errors.DownstreamUnavailableError` (2001).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pymysql
import pymysql.cursors
from tenacity import Retrying, retry_if_exception, stop_after_delay, stop_when_event_set, wait_exponential

from cdcflow.core.errors import DownstreamUnavailableError, Retryable
from cdcflow.plugins.sinks.mysql.config import MySQLSinkConfig, session_zone, session_zone_sql, target_of

__all__ = ["Downstream", "error_code", "is_transient"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Server and client error codes after which a new attempt may succeed.
TRANSIENT_CODES = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1205,  # lock wait timeout
        1213,  # deadlock
        1927,  # connection was killed
        2002,  # cannot connect through socket
        2003,  # cannot connect to server
        2006,  # server has gone away
        2013,  # lost connection during query
        2055,  # lost connection at handshake / reading
        4031,  # disconnected by the server for inactivity
    }
)


def error_code(exc: BaseException) -> int:
    """The MySQL error number of a driver exception, 0 when it has none."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying on a new connection (a refused certificate is not)."""
    if "[SSL" in str(exc):
        return False
    if isinstance(exc, pymysql.err.InterfaceError | ConnectionError | TimeoutError):
        return True
    return isinstance(exc, pymysql.err.OperationalError) and error_code(exc) in TRANSIENT_CODES


class Downstream:
    """A MySQL-compatible server reached through ``workers`` connections."""

    def __init__(self, config: MySQLSinkConfig, workers: int) -> None:
        self.config = config
        self.target = target_of(config)
        self.zone = session_zone(config.time_zone)
        self._connections: list[pymysql.connections.Connection[Any] | None] = [None] * workers
        #: Set when a batch fails: other workers stop retrying and give up.
        self.abort = threading.Event()

    def _tls_options(self) -> dict[str, Any]:
        """PyMySQL's TLS arguments: verified with ssl-ca, encrypted-only without, none for mysql://."""
        cfg = self.config
        if not self.target.tls:
            # Plain TCP: no opportunistic TLS (and no CA-store load per connection).
            return {"ssl_disabled": True}
        if cfg.ssl_ca:
            return {
                "ssl_ca": cfg.ssl_ca,
                "ssl_cert": cfg.ssl_cert or None,
                "ssl_key": cfg.ssl_key or None,
                "ssl_verify_cert": True,
            }
        ssl: dict[str, Any] = {"check_hostname": False}
        if cfg.ssl_cert:
            ssl.update(cert=cfg.ssl_cert, key=cfg.ssl_key)
        return {"ssl": ssl}

    def _connect(self) -> pymysql.connections.Connection[Any]:
        cfg = self.config
        conn = pymysql.connect(
            host=self.target.host,
            port=self.target.port,
            user=self.target.user,
            password=self.target.password,
            charset="utf8mb4",
            autocommit=False,
            connect_timeout=int(max(1, cfg.timeout)),
            read_timeout=int(max(1, cfg.read_timeout)),
            write_timeout=int(max(1, cfg.write_timeout)),
            **self._tls_options(),
        )
        with conn.cursor() as cur:
            cur.execute("SET time_zone = %s", (session_zone_sql(cfg.time_zone, self.zone),))
        conn.commit()
        return conn

    def connection(self, worker: int, *, fresh: bool = False) -> pymysql.connections.Connection[Any]:
        conn = self._connections[worker]
        if fresh and conn is not None:
            self._discard(worker)
            conn = None
        if conn is None:
            conn = self._connections[worker] = self._connect()
        return conn

    def _discard(self, worker: int) -> None:
        conn, self._connections[worker] = self._connections[worker], None
        if conn is not None:
            # A broken socket may fail to close; it is gone either way.
            with contextlib.suppress(Exception):
                conn.close()

    def run(self, worker: int, what: str, work: Callable[[pymysql.connections.Connection[Any], bool], T]) -> T:
        """Run ``work(connection, retried)`` until it succeeds or retrying is exhausted."""
        cfg = self.config
        retrying = Retrying(
            stop=stop_after_delay(cfg.retry_timeout) | stop_when_event_set(self.abort),
            wait=wait_exponential(multiplier=0.25, min=0.25, max=cfg.retry_max_backoff),
            retry=retry_if_exception(is_transient),
            before_sleep=lambda state: self._before_retry(worker, what, state.outcome),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    retried = attempt.retry_state.attempt_number > 1
                    return work(self.connection(worker, fresh=retried), retried)
        except pymysql.err.MySQLError as exc:
            self._discard(worker)
            # Transient errors were retried until retry-timeout; the others (TLS refused,
            # access denied) need an operator, so they are not retried at all.
            raise DownstreamUnavailableError(
                f"MySQL sink: {self.target.host}:{self.target.port} unreachable while {what}: {exc}",
                detail={"host": self.target.host, "port": self.target.port, "error_code": error_code(exc)},
                retryable=Retryable.RETRY if is_transient(exc) else Retryable.LATER,
            ) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _before_retry(self, worker: int, what: str, outcome: Any) -> None:
        exc = outcome.exception() if outcome is not None else None
        log.warning("MySQL sink worker %d: retrying %s after %s", worker, what, exc)
        self._discard(worker)

    def close(self) -> None:
        for worker in range(len(self._connections)):
            self._discard(worker)
