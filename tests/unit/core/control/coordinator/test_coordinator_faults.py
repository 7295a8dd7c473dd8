"""A metastore that keeps failing: the caller gets 3002 and the coordinator steps down
(it re-reads everything when it takes over again); nothing half-written is kept."""

from __future__ import annotations

import asyncio

import pytest

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo
from cdcflow.core.control.coordinator.coordinator import Coordinator
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.metastore.sqlite import SQLiteMetaStore
from cdcflow.core.errors import MetaStoreIOError
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until


class FlakyStore(SQLiteMetaStore):
    """A real SQLite store whose changefeed writes fail once ``down`` is set (a disk gone bad)."""

    down = False

    async def update_changefeed(self, info, term):
        if self.down:
            raise MetaStoreIOError("metastore: update changefeed failed after 5 attempts: disk I/O error")
        await super().update_changefeed(info, term)


def test_metastore_failure_reaches_the_caller_and_the_coordinator_steps_down(tmp_path):
    async def main():
        store = FlakyStore(str(tmp_path / "meta.db"))
        session = await store.open_session(CaptureInfo("c", "x", "x", "0", 0, 0), 30)
        term = await store.campaign(session)
        center = MessageCenter("c")
        coordinator = Coordinator(store, term, center, PluginManager(), None, bootstrap_wait=0)
        running = asyncio.create_task(coordinator.run())
        await until(lambda: coordinator._tasks, message="the coordinator's tasks to start")
        info = ChangeFeedInfo("cf", {"type": "x"}, [], start_ts=10)
        await coordinator.create(info)
        store.down = True
        with pytest.raises(MetaStoreIOError) as err:
            await coordinator.pause("cf")
        assert err.value.code == 3002
        await asyncio.wait_for(running, 5)  # stepped down
        stored = await store.get_changefeed("cf")
        assert stored is not None and stored[0].state.value == "normal"  # the pause was not half-applied
        await center.close()
        await session.close()
        await store.close()

    asyncio.run(main())
