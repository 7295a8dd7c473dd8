"""The coordinator keeps an initial snapshot's record in the metastore (SQLite here).

A maintainer reports the record of the snapshot its cluster shares in its status; the
coordinator stores it when it changed, acknowledges a complete one (on every report of
it, so a lost acknowledgement is sent again), hands the stored record to the changefeed's
next maintainer (also after a new coordinator took over), and deletes it with the
changefeed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo
from cdcflow.core.control.coordinator.coordinator import Coordinator
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import (
    AddMaintainerRequest,
    CheckpointTsMessage,
    MaintainerHeartbeat,
    MaintainerStatus,
    Message,
    Topic,
)
from cdcflow.core.control.metastore.sqlite import SQLiteMetaStore
from cdcflow.core.data.events import Span
from cdcflow.core.data.snapshot_ranges import SnapshotRecord
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until

TS = 10


def record(*done: Span, complete: bool = False) -> dict[str, Any]:
    return SnapshotRecord(TS, done, len(done), 4, 100 * len(done), complete, 1.0).to_json()


def test_the_record_is_stored_acknowledged_complete_and_handed_to_the_next_maintainer(tmp_path) -> None:
    async def main() -> None:
        store = SQLiteMetaStore(str(tmp_path / "meta.db"))
        session = await store.open_session(CaptureInfo("c", "x", "x", "0", 0, 0), 30)
        center = MessageCenter("c")
        received: list[Message] = []

        async def manager(message: Message) -> None:
            received.append(message)

        center.register(Topic.MAINTAINER_MANAGER, manager)

        def adds() -> list[AddMaintainerRequest]:
            return [m for m in received if isinstance(m, AddMaintainerRequest)]

        def acks() -> list[CheckpointTsMessage]:
            return [m for m in received if isinstance(m, CheckpointTsMessage) and m.snapshot_complete]

        async def coordinate() -> tuple[Coordinator, asyncio.Task[None]]:
            term = await store.campaign(session)
            coordinator = Coordinator(store, term, center, PluginManager(), None, bootstrap_wait=0)
            running = asyncio.create_task(coordinator.run())
            await until(lambda: coordinator._tasks, message="the coordinator's tasks to start")
            return coordinator, running

        def beat(coordinator: Coordinator, epoch: int, snapshot: dict[str, Any] | None) -> None:
            status = MaintainerStatus("cf", epoch, "working", TS, TS, snapshot_record=snapshot)
            center.send("c", Topic.COORDINATOR, MaintainerHeartbeat("c", coordinator.term.term, (status,)))

        coordinator, running = await coordinate()
        await coordinator.create(ChangeFeedInfo("cf", {"type": "x"}, [], start_ts=TS, initial_snapshot=True))
        first = await until(adds, message="the first maintainer")
        assert first[-1].snapshot_record is None
        epoch = first[-1].epoch

        # Two ranges delivered: stored, not acknowledged.
        half = record(Span(5, b"a", b"c"), Span(5, b"c", b"e"))
        beat(coordinator, epoch, half)

        async def stored(snapshot: dict[str, Any]) -> bool:
            return await store.list_snapshot_records() == {"cf": snapshot}

        await until(lambda: stored(half), message="the record stored")
        await asyncio.sleep(0.2)
        assert not acks()
        # Complete: stored, then acknowledged; again on every report of it.
        done = record(Span(5, b"a", b""), complete=True)
        beat(coordinator, epoch, done)
        await until(acks, message="the complete record acknowledged")
        assert await store.list_snapshot_records() == {"cf": done}
        beat(coordinator, epoch, done)
        await until(lambda: len(acks()) >= 2, message="acknowledged again")
        assert all(a.epoch == epoch and a.changefeed_id == "cf" for a in acks())

        # A new coordinator (this capture, a new term) hands the stored record to the
        # maintainer it starts.
        coordinator.stop()
        await asyncio.wait_for(running, 5)
        received.clear()
        coordinator, running = await coordinate()
        again = await until(adds, message="a maintainer started by the new coordinator")
        assert again[-1].epoch > epoch and again[-1].snapshot_record == done

        await coordinator.remove("cf")
        assert await store.list_snapshot_records() == {}
        coordinator.stop()
        await asyncio.wait_for(running, 5)
        await center.close()
        await session.close()
        await store.close()

    asyncio.run(main())
