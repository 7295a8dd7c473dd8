"""The changefeed lifecycle end to end on one capture over SQLite: REST API,
coordinator, maintainer, span agent and the in-process executor."""

from __future__ import annotations

import asyncio
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdcflow.core.api.client import ApiClient, ApiError
from cdcflow.core.api.server import ApiServer
from cdcflow.core.control.capture import Capture, CaptureOptions
from cdcflow.core.control.metastore import open_metastore
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until
from cdcflow.core.testing.inprocess import executor_factory
from tests import ticker_source


def test_lifecycle_on_sqlite(tmp_path):
    plugins = PluginManager.default(autoload=False)
    plugins.register(sys.modules[ticker_source.__name__])

    async def main():
        store = open_metastore(f"sqlite:///{tmp_path}/meta.db")
        capture = Capture(store, plugins, executor_factory, CaptureOptions(data_dir=str(tmp_path)))
        api = ApiServer(capture, "127.0.0.1", 0)
        port = await api.start()
        serving = asyncio.create_task(capture.serve())
        client = ApiClient(f"127.0.0.1:{port}")

        async def call(method, path, body=None):
            return await asyncio.to_thread(client.call, method, path, body)

        async def get(cf):
            return await call("GET", f"/api/v2/changefeeds/{cf}")

        await until(lambda: capture.is_owner, interval=0.1)
        body = {
            "changefeed_id": "cf-1",
            "source": {"type": "ticker"},
            "sinks": [{"type": "file", "path": str(tmp_path / "out"), "protocol": "json"}],
            "filter": {"rules": ["*.*"], "case-sensitive": True},
            "memory_quota": "64MiB",
        }
        created = await call("POST", "/api/v2/changefeeds", body)
        assert created["state"] == "normal"
        assert created["memory_quota"] == 64 * 2**20 and created["filter"]["case-sensitive"] is True
        start = created["checkpoint_tso"]
        await until(lambda: _advanced(get, "cf-1", start), interval=0.1, observe=lambda: get("cf-1"))
        assert list((tmp_path / "out").rglob("*.jsonl"))  # rows reached the sink

        with pytest.raises(ApiError) as dup:
            await call("POST", "/api/v2/changefeeds", body)
        assert dup.value.status == 409 and dup.value.detail["code"] == 1002
        bad = {**body, "changefeed_id": "cf-bad", "sinks": [{"type": "file", "protocol": 7, "bogus": 1}]}
        with pytest.raises(ApiError) as invalid:
            await call("POST", "/api/v2/changefeeds", bad)
        assert invalid.value.detail["code"] == 1001 and "sinks[0].bogus" in invalid.value.message

        await call("POST", "/api/v2/changefeeds/cf-1/pause")
        await call("POST", "/api/v2/changefeeds/cf-1/pause")  # a no-op success
        paused = await get("cf-1")
        assert paused["state"] == "paused"
        # An update changes what it names and keeps every other setting.
        updated = await call("PUT", "/api/v2/changefeeds/cf-1", {"description": "renamed"})
        assert updated["description"] == "renamed" and updated["memory_quota"] == 64 * 2**20
        assert updated["filter"] == created["filter"]
        paused = await get("cf-1")
        # Time passes on purpose (not a wait on a condition): the paused changefeed's
        # checkpoint is read a while after the pause, when a running feed would have moved it.
        await asyncio.sleep(1.5)
        assert (await get("cf-1"))["checkpoint_tso"] == (await get("cf-1"))["checkpoint_tso"]
        await call("POST", "/api/v2/changefeeds/cf-1/resume")
        resumed = await get("cf-1")
        assert resumed["state"] == "normal" and resumed["epoch"] > paused["epoch"]
        await until(lambda: _advanced(get, "cf-1", paused["checkpoint_tso"]), interval=0.1, observe=lambda: get("cf-1"))

        failing = {**body, "changefeed_id": "cf-fail", "source": {"type": "ticker", "fail": True}}
        await call("POST", "/api/v2/changefeeds", failing)

        async def failed():
            return (await get("cf-fail"))["state"] == "failed"

        await until(failed, interval=0.1, observe=lambda: get("cf-fail"))
        with pytest.raises(ApiError) as refused:
            await call("POST", "/api/v2/changefeeds/cf-fail/resume")
        assert refused.value.status == 400 and "failed" in refused.value.message

        metrics = samples(await asyncio.to_thread(_text, f"http://127.0.0.1:{port}/metrics"))
        assert metrics[("cdcflow_changefeed_state", (("changefeed", "cf-fail"),))] == 2
        assert metrics[("cdcflow_changefeed_checkpoint_lag_seconds", (("changefeed", "cf-1"),))] >= 0
        assert metrics[("cdcflow_capture_is_owner", ())] == 1
        assert metrics[("cdcflow_changefeeds", (("state", "failed"),))] == 1
        assert metrics[("cdcflow_metastore_operation_duration_seconds_count", (("operation", "list_changefeeds"),))] > 0

        captures = await call("GET", "/api/v2/captures")
        assert captures["total"] == 1 and captures["items"][0]["is_owner"]
        await call("DELETE", "/api/v2/changefeeds/cf-1")
        with pytest.raises(ApiError) as gone:
            await get("cf-1")
        assert gone.value.status == 404
        # Created again under the removed one's id, on the capture that ran the removed one's
        # maintainer (epoch up to 3 here): it runs, its epoch above any of the removed one's.
        again = await call("POST", "/api/v2/changefeeds", body)
        assert again["epoch"] > resumed["epoch"]
        await until(lambda: _advanced(get, "cf-1", again["checkpoint_tso"]), interval=0.1, observe=lambda: get("cf-1"))

        await capture.drain()
        await serving
        await api.stop()
        await store.close()

    asyncio.run(main())


async def _advanced(get, cf, than):
    return (await get(cf))["checkpoint_tso"] > than


def _text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition, by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
