"""How long the coordinator takes to handle 1,000 changefeeds on this machine:
create each (validated record, controller decision, persisted epoch) and one
checkpoint round (a heartbeat per changefeed and one batched, owner-checked
checkpoint write), on the SQLite metastore.

Baseline, measured in the same run: the raw metastore writes the same work
needs at least (one create and one checkpoint update per changefeed, no
coordinator). The ratio says what the coordinator adds.

    .venv/bin/python benchmarks/bench_coordinator.py [N]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time

from cdcflow.core.coordinator.coordinator import Coordinator
from cdcflow.core.messaging.center import MessageCenter
from cdcflow.core.messaging.messages import MaintainerHeartbeat, MaintainerStatus
from cdcflow.core.metastore import open_metastore
from cdcflow.core.model import CaptureInfo, ChangeFeedInfo, ChangeFeedStatus
from cdcflow.core.plugin.manager import PluginManager


def info(i: int) -> ChangeFeedInfo:
    return ChangeFeedInfo(f"cf-{i}", {"type": "tikv"}, [{"type": "file"}], start_ts=1000)


async def baseline(n: int, path: str) -> float:
    store = open_metastore(f"sqlite:///{path}")
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


async def coordinator(n: int, path: str) -> float:
    store = open_metastore(f"sqlite:///{path}")
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


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory() as tmp:
        base = asyncio.run(baseline(n, f"{tmp}/base.db"))
        coord = asyncio.run(coordinator(n, f"{tmp}/coord.db"))
    print(f"changefeeds: {n}")
    print(f"baseline (raw metastore writes): {base:.3f}s")
    print(f"coordinator (create + one checkpoint round): {coord:.3f}s")
    print(f"ratio coordinator/baseline: {coord / base:.2f}")


if __name__ == "__main__":
    main()
