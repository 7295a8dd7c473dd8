"""No password a changefeed is created with is shown again: not by the REST API,
not by `cdcflow cli --json` or its tables, not in the logs; the SQLite metastore
that holds them is readable by its owner only."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from cdcflow.core.api.client import ApiClient
from cdcflow.core.api.server import ApiServer
from cdcflow.core.cli import main as cli_main
from cdcflow.core.control.capture import Capture, CaptureOptions
from cdcflow.core.control.metastore import open_metastore
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until
from cdcflow.core.testing.inprocess import executor_factory
from tests import ticker_source

SECRETS = ("hunter2", "secret@pw4", "pw4@", "s3cret")


def test_no_secret_is_shown_anywhere(tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    plugins = PluginManager.default(autoload=False)
    plugins.register(sys.modules[ticker_source.__name__])
    shown: list[str] = []

    async def main():
        store = open_metastore(f"sqlite:///{tmp_path}/meta.db")
        capture = Capture(store, plugins, executor_factory, CaptureOptions(data_dir=str(tmp_path)))
        api = ApiServer(capture, "127.0.0.1", 0)
        port = await api.start()
        serving = asyncio.create_task(capture.serve())
        client = ApiClient(f"127.0.0.1:{port}")

        async def call(method, path, body=None):
            return await asyncio.to_thread(client.call, method, path, body)

        async def cli(*argv):
            code = await asyncio.to_thread(cli_main.main, ["cli", "--server", f"127.0.0.1:{port}", *argv])
            assert code == 0
            out, _ = capsys.readouterr()
            shown.append(out)
            return out

        try:
            await until(lambda: capture.is_owner, interval=0.1)
            body = {
                "changefeed_id": "cf-secret",
                "source": {"type": "ticker"},
                "sinks": [
                    {"uri": "kafka://mock/t?sasl-user=u&sasl-password=hunter2"},
                    # Unreachable: the sink retries, logging a 2001 that names it.
                    {"uri": "mysql://u:secret@pw4@127.0.0.1:1/?retry-timeout=1"},
                    {"type": "mysql", "host": "127.0.0.1", "port": 1, "password": "s3cret"},
                ],
            }
            created = await call("POST", "/api/v2/changefeeds", body)
            shown.append(json.dumps(created))
            assert created["sinks"][0]["uri"] == "kafka://mock/t?sasl-user=u&sasl-password=******"
            assert created["sinks"][1]["uri"] == "mysql://u:******@127.0.0.1:1/?retry-timeout=1"
            assert created["sinks"][2]["password"] == "******"
            shown.append(json.dumps(await call("GET", "/api/v2/changefeeds")))
            shown.append(json.dumps(await call("GET", "/api/v2/changefeeds/cf-secret")))
            listed = json.loads(await cli("--json", "changefeed", "list"))
            assert listed["items"][0]["sinks"][0]["uri"].endswith("sasl-password=******")
            await cli("--json", "changefeed", "query", "-c", "cf-secret")
            await cli("changefeed", "query", "-c", "cf-secret")
            await cli("changefeed", "list")
            for name in ("meta.db", "meta.db-wal", "meta.db-shm"):  # the WAL files exist while it is open
                assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
        finally:
            await capture.drain()
            await serving
            await api.stop()
            await store.close()

    asyncio.run(main())
    shown.append(caplog.text)
    text = "\n".join(shown)
    assert "cf-secret" in text and "******" in text
    for secret in SECRETS:
        assert secret not in text, secret
