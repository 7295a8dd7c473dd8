"""When the coordinator writes a heartbeat's checkpoint: at once when the last write is
``min_write_interval`` old, else by a write due then (not at the window's ticker); a
resolved ts alone waits for the ticker. The ticker is an hour here, so whatever is
written comes from a heartbeat or the write due after one."""

from __future__ import annotations

import asyncio

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo
from cdcflow.core.control.coordinator.coordinator import Coordinator
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import AddMaintainerRequest, MaintainerHeartbeat, MaintainerStatus, Topic
from cdcflow.core.control.metastore.sqlite import SQLiteMetaStore
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until


class CountingStore(SQLiteMetaStore):
    """A real SQLite store that keeps each checkpoint batch written."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[dict[str, int]] = []

    async def update_checkpoints(self, statuses, term):
        self.writes.append({cf: st.checkpoint_ts for cf, st in statuses.items()})
        return await super().update_checkpoints(statuses, term)


def test_a_new_checkpoint_is_written_once_the_last_write_is_old_enough_and_a_resolved_ts_waits(tmp_path):
    async def main():
        store = CountingStore(str(tmp_path / "meta.db"))
        session = await store.open_session(CaptureInfo("c", "x", "x", "0", 0, 0), 30)
        term = await store.campaign(session)
        center = MessageCenter("c")
        added: list[AddMaintainerRequest] = []

        async def manager(message):
            if isinstance(message, AddMaintainerRequest):
                added.append(message)

        center.register(Topic.MAINTAINER_MANAGER, manager)
        # An interval long enough that the second heartbeat surely comes before it ends.
        coordinator = Coordinator(
            store, term, center, PluginManager(), None, bootstrap_wait=0, checkpoint_window=3600, min_write_interval=3
        )
        running = asyncio.create_task(coordinator.run())
        try:
            await until(lambda: coordinator._tasks, message="the coordinator's tasks to start")
            await coordinator.create(ChangeFeedInfo("cf", {"type": "x"}, [], start_ts=10))
            await until(lambda: added, message="the changefeed's maintainer placed")
            epoch = added[-1].epoch

            async def heartbeat(checkpoint: int, resolved: int) -> None:
                status = MaintainerStatus("cf", epoch, "working", checkpoint, resolved)
                center.send("c", Topic.COORDINATOR, MaintainerHeartbeat("c", term.term, (status,)))
                rt = coordinator.controller.changefeeds["cf"]
                await until(lambda: rt.status.resolved_ts >= resolved, message="the heartbeat taken")

                async def nothing() -> None:
                    pass

                await coordinator._submit(nothing)  # the heartbeat's own work is done by then

            async def persisted() -> tuple[int, int]:
                record = await store.get_changefeed("cf")
                assert record is not None
                return record[1].checkpoint_ts, record[1].resolved_ts

            await heartbeat(20, 20)
            assert store.writes == [{"cf": 20}]  # the first: at once
            await heartbeat(30, 30)
            assert store.writes == [{"cf": 20}]  # under an interval after it: due later...
            await until(lambda: len(store.writes) == 2, timeout=60, message="the write due after the interval")
            assert store.writes[1] == {"cf": 30} and await persisted() == (30, 30)  # ...not at the ticker's
            await heartbeat(30, 45)  # the resolved ts alone moved
            assert coordinator._due is None or coordinator._due.done()
            assert len(store.writes) == 2 and await persisted() == (30, 30)  # it waits for the ticker
            await heartbeat(40, 50)  # a checkpoint again: written, with the resolved ts
            await until(lambda: len(store.writes) == 3, timeout=60, message="the new checkpoint written")
            assert await persisted() == (40, 50)
        finally:
            coordinator.stop()
            await asyncio.wait_for(running, 30)
            await center.close()
            await session.close()
            await store.close()

    asyncio.run(main())
