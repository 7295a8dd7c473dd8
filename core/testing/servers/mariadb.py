"""A real MariaDB/MySQL server: a testcontainers container or Debian's ``mariadbd``.

With a Docker engine, testcontainers' ``MySqlContainer`` runs :data:`MARIADB_IMAGE`;
without one, Debian's ``mariadbd`` starts on 127.0.0.1 with a private temporary data
directory and a free port (``scripts/ensure-mariadb.sh``, run by ``make setup``,
installs it). Either way the caller sees a :class:`MariaDB` with host, port, user and
password.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql

from cdcflow.core.errors import NotAvailableError
from cdcflow.core.testing.servers.engine import choose_backend

__all__ = ["MARIADB_IMAGE", "MariaDB", "free_port", "mysql_container", "new_database", "start_mariadb"]

#: The image of the container flavour.
MARIADB_IMAGE = "mariadb:10.11"
_CONTAINER_PASSWORD = "cdcflow"
_READY_TIMEOUT = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if path is None:
        raise NotAvailableError(
            f"{name} not found: install MariaDB's server (Debian: apt-get install mariadb-server; "
            "this repository: make setup) or run the tests where a Docker engine answers"
        )
    return path


class MariaDB:
    """A running server: where it is, and how to stop and restart it (outages)."""

    def __init__(
        self, host: str, port: int, user: str = "root", password: str = "", extra_args: tuple[str, ...] = ()
    ) -> None:
        self.extra_args = extra_args
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self._proc: subprocess.Popen[bytes] | None = None
        self._datadir: Path | None = None
        self._container: Any = None

    @property
    def uri(self) -> str:
        """``mysql://user:password@host:port/``, as a MySQL sink URI starts."""
        return f"mysql://{self.user}:{self.password}@{self.host}:{self.port}/"

    @property
    def backend(self) -> str:
        return "container" if self._container is not None else "local"

    def connect(self, database: str | None = None, **kw: Any) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, database=database, **kw
        )

    def wait_ready(self, timeout: float = _READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.connect(connect_timeout=2).close()
                return
            except pymysql.err.MySQLError:
                if self._proc is not None and self._proc.poll() is not None:
                    raise RuntimeError(f"mariadbd exited with {self._proc.returncode}") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    # -- local mariadbd ----------------------------------------------------

    def _start_local(self) -> None:
        assert self._datadir is not None
        log = open(self._datadir.parent / "mariadbd.log", "ab")  # noqa: SIM115 - lives as long as the server
        self._proc = subprocess.Popen(
            [
                _binary("mariadbd"),
                "--no-defaults",
                f"--datadir={self._datadir}",
                f"--socket={self._datadir.parent / 'sock'}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=16M",
                "--innodb-flush-log-at-trx-commit=2",
                "--max-connections=500",
                *(["--user=root"] if os.geteuid() == 0 else []),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.wait_ready()

    def stop(self) -> None:
        """Stop the server (clean shutdown); :meth:`start` brings it back on the same port."""
        if self._container is not None:
            self._container.get_wrapped_container().pause()
            return
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def start(self) -> None:
        if self._container is not None:
            self._container.get_wrapped_container().unpause()
            return
        if self._proc is None:
            self._start_local()

    def shutdown(self) -> None:
        if self._container is not None:
            self._container.stop()
            return
        self.stop()
        if self._datadir is not None:
            shutil.rmtree(self._datadir.parent, ignore_errors=True)


def _start_local(tmp: Path, extra_args: tuple[str, ...] = ()) -> MariaDB:
    datadir = tmp / "data"
    datadir.mkdir(parents=True)
    install = [
        _binary("mariadb-install-db"),
        "--no-defaults",
        f"--datadir={datadir}",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
    ]
    if os.geteuid() == 0:
        install.append("--user=root")
    subprocess.run(install, check=True, capture_output=True, timeout=120)
    server = MariaDB("127.0.0.1", free_port(), extra_args=extra_args)
    server._datadir = datadir
    server._start_local()
    return server


def mysql_container(image: str = MARIADB_IMAGE) -> Any:
    """The testcontainers ``MySqlContainer`` the container flavour runs (built, not started)."""
    try:
        from testcontainers.community.mysql import MySqlContainer
    except ImportError:  # testcontainers before 4.14
        from testcontainers.mysql import MySqlContainer

    return MySqlContainer(image, username="root", password=_CONTAINER_PASSWORD, dbname="cdcflow_test")


def _start_container(image: str) -> MariaDB:
    container = mysql_container(image)
    container.start()
    try:
        server = MariaDB(
            container.get_container_host_ip(), int(container.get_exposed_port(3306)), "root", _CONTAINER_PASSWORD
        )
        server._container = container
        server.wait_ready()
    except BaseException:
        container.stop()
        raise
    return server


@contextlib.contextmanager
def start_mariadb(
    extra_args: tuple[str, ...] = (), *, local: bool = False, image: str = MARIADB_IMAGE, backend: str | None = None
) -> Iterator[MariaDB]:
    """A fresh server for the duration of the block.

    ``extra_args`` go to a local mariadbd (``local=True`` insists on one, for options a
    container image would not take); ``backend`` is ``auto``, ``container`` or ``local``
    (see :func:`~cdcflow.core.testing.servers.engine.choose_backend`).
    """
    if local or extra_args:
        backend = "local"
    if choose_backend("mysql", backend) == "container":
        server = _start_container(image)
    else:
        server = _start_local(Path(tempfile.mkdtemp(prefix="cdcflow-mariadb-")), extra_args)
    try:
        yield server
    finally:
        server.shutdown()


def new_database(server: MariaDB) -> str:
    """A new, empty database on ``server`` with a unique name."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
    finally:
        conn.close()
    return name
