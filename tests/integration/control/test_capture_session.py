"""A capture whose session is lost stops everything and joins again, clean."""

from __future__ import annotations

import asyncio
import sys

import pytest

from cdcflow.core.api.server import ApiServer
from cdcflow.core.control.capture import Capture, CaptureOptions
from cdcflow.core.control.coordinator.spec import info_from_connector, validate_section
from cdcflow.core.control.metastore import open_metastore
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until
from tests import ticker_source
from tests.etcd_server import EtcdServer

pytestmark = pytest.mark.integration


def test_session_loss_makes_the_capture_rejoin_under_a_new_id(tmp_path):
    etcd = EtcdServer(tmp_path)
    pm = PluginManager.default(autoload=False)
    pm.register(sys.modules[ticker_source.__name__])

    async def main():
        store = open_metastore(f"etcd://{etcd.endpoint}/s")
        executor = pm.executors.factory("in-process")
        capture = Capture(store, pm, executor, CaptureOptions(session_ttl=2, data_dir=str(tmp_path)))
        api = ApiServer(capture, "127.0.0.1", 0)
        await api.start()
        serving = asyncio.create_task(capture.serve())
        await until(lambda: capture.coordinator is not None and bool(capture.coordinator._tasks), interval=0.1)
        section = {
            "name": "cf",
            "source": {"type": "ticker"},
            "sinks": [{"type": "file", "path": str(tmp_path / "out"), "protocol": "json"}],
        }
        await capture.coordinator.create(info_from_connector(validate_section(section, pm), section))

        async def checkpoint():
            record = await store.get_changefeed("cf")
            return record[1].checkpoint_ts

        first = await checkpoint()
        await until(lambda: _greater(checkpoint, first), interval=0.1, observe=checkpoint)
        old_id = capture.info.id
        # the metastore drops the session (as after a long pause): the lease is revoked
        await asyncio.to_thread(store.client.revoke_lease, capture.session.lease.id)
        await until(lambda: capture.rejoins == 1 and capture.joined.is_set(), interval=0.1)
        assert capture.info.id != old_id
        assert [c.id for c in await store.list_captures()] == [capture.info.id]
        before = await checkpoint()
        # the changefeed runs again under the new session
        await until(lambda: _greater(checkpoint, before), interval=0.1, observe=checkpoint)
        await capture.drain()
        await serving
        await api.stop()
        await store.close()

    try:
        asyncio.run(main())
    finally:
        etcd.stop()


async def _greater(fn, than):
    return await fn() > than
