"""A real capture and its REST API on 127.0.0.1, served from a background thread,
for tests that talk to it synchronously (urllib, ``cdcflow cli`` in-process)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from cdcflow.core.api.security import ApiSecurity
from cdcflow.core.api.server import ApiServer
from cdcflow.core.config.settings import SecuritySettings
from cdcflow.core.control.capture import Capture, CaptureOptions
from cdcflow.core.control.metastore import open_metastore
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing.inprocess import executor_factory
from tests import ticker_source

T = TypeVar("T")


class LiveApi:
    """``with LiveApi(tmp, security) as api:`` — ``api.port``, ``api.scheme``; the capture is the owner."""

    def __init__(self, tmp: Path, security: SecuritySettings | None = None, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.security = ApiSecurity.from_settings(security or SecuritySettings(), env or {})
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.server: ApiServer | None = None
        self._thread = threading.Thread(target=self._run, name="live-api", daemon=True)

    @property
    def url(self) -> str:
        return f"{self.security.scheme}://127.0.0.1:{self.port}"

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the server's event loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    def __enter__(self) -> LiveApi:
        self._thread.start()
        if not self._ready.wait(60) or self._error is not None:
            raise AssertionError(f"the API did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported by __enter__
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        plugins = PluginManager.default(autoload=False)
        plugins.register(sys.modules[ticker_source.__name__])
        store = open_metastore(f"sqlite:///{self.tmp}/meta.db")
        capture = Capture(store, plugins, executor_factory, CaptureOptions(data_dir=str(self.tmp)))
        api = self.server = ApiServer(capture, "127.0.0.1", 0, self.security)
        self.port = await api.start()
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        serving = asyncio.create_task(capture.serve())
        while not capture.is_owner:
            await asyncio.sleep(0.05)
        self._ready.set()
        await self._stop.wait()
        await capture.drain()
        await serving
        await api.stop()
        await store.close()
