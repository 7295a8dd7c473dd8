"""The service GC safepoint a capture keeps in PD, and the checkpoints a resume may take,
against the playground's PD: one capture on SQLite with the in-process executor,
changefeeds created and resumed through the REST API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.api.client import ApiClient, ApiError
from cdcflow.core.api.server import ApiServer
from cdcflow.core.control.capture import Capture, CaptureOptions
from cdcflow.core.control.metastore import open_metastore
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until
from cdcflow.core.testing.inprocess import executor_factory
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.pd_service import GC_WORKER

pytestmark = pytest.mark.integration

Call = Callable[..., Awaitable[Any]]


@dataclass
class Server:
    pg: Playground
    capture: Capture
    call: Call
    tmp: Path

    def body(self, cf: str, pd: str) -> dict[str, Any]:
        return {
            "changefeed_id": cf,
            "source": {"type": "tikv", "pd": [pd], "tidb-status": self.pg.status_address},
            "sinks": [{"type": "file", "path": str(self.tmp / cf), "protocol": "json"}],
        }

    async def get(self, cf: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("GET", f"/api/v2/changefeeds/{cf}")
        return result

    async def advanced(self, cf: str, than: int) -> bool:
        got = await self.get(cf)
        return got["state"] == "normal" and got["checkpoint_tso"] > than


@contextlib.asynccontextmanager
async def server(tmp_path: Path, pg: Playground) -> AsyncIterator[Server]:
    plugins = PluginManager.default()
    store = open_metastore(f"sqlite:///{tmp_path}/meta.db")
    options = CaptureOptions(data_dir=str(tmp_path / "data"), gc_tick=0.5, checkpoint_window=0.2)
    capture = Capture(store, plugins, executor_factory, options)
    api = ApiServer(capture, "127.0.0.1", 0)
    port = await api.start()
    serving = asyncio.create_task(capture.serve())
    client = ApiClient(f"127.0.0.1:{port}")

    async def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return await asyncio.to_thread(client.call, method, path, body)

    try:
        await until(lambda: capture.is_owner, interval=0.1)
        yield Server(pg, capture, call, tmp_path)
    finally:
        await capture.drain()
        await serving
        await api.stop()
        await store.close()


def service_safepoints(pg: Playground) -> dict[str, int]:
    """The service safepoints PD holds, by service id (TiDB's GC worker left out)."""
    pd = pg._require_servers().pd
    assert pd is not None
    return {sid.decode(): point for sid, (point, _) in pd.gc.services.items() if sid != GC_WORKER}


async def _async(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


async def _holds(pg: Playground, ts: int) -> bool:
    return set(service_safepoints(pg).values()) == {ts}


def test_two_spellings_of_one_pd_keep_the_paused_changefeeds_checkpoint(tmp_path: Path) -> None:
    """Changefeeds naming one PD as ``127.0.0.1:P`` and ``localhost:P`` share one service
    safepoint at their minimum: PD's GC stops at the paused one's checkpoint, and it resumes."""

    async def main() -> None:
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.1, ddl_every=0) as pg:
            port = pg.pd_address.rsplit(":", 1)[1]
            async with server(tmp_path, pg) as s:
                start = pg.now()
                await s.call("POST", "/api/v2/changefeeds", {**s.body("by-ip", f"127.0.0.1:{port}"), "start_ts": start})
                await s.call(
                    "POST", "/api/v2/changefeeds", {**s.body("by-name", f"localhost:{port}"), "start_ts": start}
                )
                await until(lambda: s.advanced("by-ip", start), interval=0.1, observe=lambda: s.get("by-ip"))
                await s.call("POST", "/api/v2/changefeeds/by-ip/pause")
                paused = (await s.get("by-ip"))["checkpoint_tso"]
                # the other changefeed moves on, and the GC ticker writes its safepoints several times over
                await until(lambda: s.advanced("by-name", paused + (5000 << 18)), interval=0.2, timeout=60,
                            observe=lambda: s.get("by-name"))  # fmt: skip
                await asyncio.sleep(1.5)
                paused = (await s.get("by-ip"))["checkpoint_tso"]  # after its last flush
                # one service safepoint, at the paused changefeed's checkpoint
                assert list(service_safepoints(pg).values()) == [paused]
                # PD's GC runs as far as the service safepoints let it
                reached = await asyncio.to_thread(pg.advance_gc, pg.now())
                assert reached <= paused, (reached, paused)
                await s.call("POST", "/api/v2/changefeeds/by-ip/resume")
                await until(lambda: s.advanced("by-ip", paused), interval=0.1, timeout=60,
                            observe=lambda: s.get("by-ip"))  # fmt: skip
                assert (await s.get("by-ip"))["error"] is None

    asyncio.run(asyncio.wait_for(main(), 180))


def test_overwrite_checkpoint_ts_out_of_range_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        pg = Playground(stores=1, split_keys=0, resolved_ts_interval=0.1, ddl_every=0)
        async with pg, server(tmp_path, pg) as s:
            start = pg.now()
            await s.call("POST", "/api/v2/changefeeds", {**s.body("cf", pg.pd_address), "start_ts": start})
            await until(lambda: s.advanced("cf", start), interval=0.1, observe=lambda: s.get("cf"))
            await s.call("POST", "/api/v2/changefeeds/cf/pause")
            await asyncio.sleep(1.5)  # past its last checkpoint flush and a GC tick
            paused = await s.get("cf")
            checkpoint = paused["checkpoint_tso"]
            await until(lambda: _holds(pg, checkpoint), interval=0.1, observe=lambda: _async(service_safepoints, pg))
            # GC reaches the changefeed's checkpoint: everything below it is gone
            assert await asyncio.to_thread(pg.advance_gc, checkpoint) == checkpoint
            year_2100 = (4102444800 * 1000) << 18
            for bad in (year_2100, -5, 2**70, checkpoint - 1, "12", 1.5, True):
                with pytest.raises(ApiError) as refused:
                    await s.call("POST", "/api/v2/changefeeds/cf/resume", {"overwrite_checkpoint_ts": bad})
                assert refused.value.status == 400, (bad, refused.value.message)
                assert refused.value.detail["code"] == 1001, (bad, refused.value.detail)
                assert "overwrite_checkpoint_ts" in refused.value.message
                now = await s.get("cf")
                assert (now["state"], now["checkpoint_tso"], now["epoch"]) == (
                    "paused",
                    checkpoint,
                    paused["epoch"],
                ), bad
                # the service safepoint did not move with it
                assert set(service_safepoints(pg).values()) == {checkpoint}, bad
            # the coordinator refuses it too, whoever calls it
            coordinator = s.capture.coordinator
            assert coordinator is not None
            with pytest.raises(ConfigInvalidError) as direct:
                await coordinator.resume("cf", year_2100)
            assert direct.value.code == 1001
            assert (await s.get("cf"))["state"] == "paused"

            valid = checkpoint + (1000 << 18)
            while pg.now() <= valid:
                await asyncio.sleep(0.1)
            await s.call("POST", "/api/v2/changefeeds/cf/resume", {"overwrite_checkpoint_ts": valid})
            await until(lambda: s.advanced("cf", valid), interval=0.1, timeout=60, observe=lambda: s.get("cf"))

    asyncio.run(asyncio.wait_for(main(), 180))
