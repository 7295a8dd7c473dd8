"""The capture: one ``cdcflow server`` process, a node of a cdcflow cluster (seed 001).

A capture registers in the metastore under a session, campaigns for owner
(the owner runs the coordinator), and hosts a maintainer manager and a span
host. When its session is lost — the metastore expired it, e.g. after a
long pause — it "suicides": stops everything it runs and joins again with a
new session and a new capture id, so that it never acts on work that has
been handed to others meanwhile. While joined it also sweeps its data
directory for the files of removed changefeeds (:mod:`.reclaim`).
:meth:`Capture.drain` is the graceful shutdown: resign ownership (the
checkpoints are flushed first), stop the maintainers, close the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from cdcflow.core.config.settings import (
    DEFAULT_API_ADDR,
    DEFAULT_DATA_DIR,
    DEFAULT_GC_TTL,
    DEFAULT_RECLAIM_INTERVAL,
    ServerSettings,
)
from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo
from cdcflow.core.control.coordinator.controller import DEFAULT_HEARTBEAT_TIMEOUT
from cdcflow.core.control.coordinator.coordinator import DEFAULT_CHECKPOINT_WINDOW, Coordinator
from cdcflow.core.control.coordinator.spec import connector_for
from cdcflow.core.control.gc.keeper import GCSafepointKeeper
from cdcflow.core.control.gc.manager import DEFAULT_GC_TICK, GCManager
from cdcflow.core.control.maintainer.manager import MaintainerManager
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.grpc import GrpcTransport, MessageServer, TLSConfig
from cdcflow.core.control.metastore.base import MetaStore, NotOwnerError, Session
from cdcflow.core.control.metastore.timed import TimedMetaStore
from cdcflow.core.control.reclaim import ChangefeedFilesSweeper
from cdcflow.core.control.span_host import SpanHost
from cdcflow.core.data.span_executor import ExecutorFactory
from cdcflow.core.errors import CdcflowError
from cdcflow.core.metrics import CaptureMetrics, Snapshot
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.version import __version__

__all__ = ["DEFAULT_MESSAGE_ADDR", "DEFAULT_SESSION_TTL", "Capture", "CaptureOptions"]

log = logging.getLogger(__name__)

#: host:port of the inter-capture message server; port 0: picked by the OS.
DEFAULT_MESSAGE_ADDR = "127.0.0.1:0"
#: Seconds a capture's session survives without a keepalive.
DEFAULT_SESSION_TTL = 10.0


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    """How a capture runs: the server-section settings it applies itself (the fields
    named as in :class:`ServerSettings`, see :meth:`from_server`; the others reach its
    span executors through ``server``) and the process's own knobs, which
    connectors.yaml does not set."""

    api_addr: str = DEFAULT_API_ADDR
    #: host:port of the message server; the port is picked by the OS when 0.
    message_addr: str = DEFAULT_MESSAGE_ADDR
    data_dir: str = DEFAULT_DATA_DIR
    session_ttl: float = DEFAULT_SESSION_TTL
    gc_ttl: float = DEFAULT_GC_TTL
    gc_tick: float = DEFAULT_GC_TICK
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    checkpoint_window: float = DEFAULT_CHECKPOINT_WINDOW
    #: Seconds between sweeps of data_dir for the files of removed changefeeds (0: no sweep).
    reclaim_interval: float = DEFAULT_RECLAIM_INTERVAL
    tls: TLSConfig | None = None
    #: Record metrics (server.metrics); off: /metrics serves only what it reads when scraped.
    metrics: bool = True
    #: The server section the capture runs with (handed to span executors: Spark, data dir).
    server: ServerSettings | None = None

    @classmethod
    def from_server(cls, server: ServerSettings, **changes: Any) -> CaptureOptions:
        """The options of a capture run with ``server``: the section's values of the fields
        both have (API address, data directory, GC TTL), then ``changes`` (command-line
        flags; those that are None were not given and change nothing)."""
        values: dict[str, Any] = {name: getattr(server, name) for name in _SERVER_FIELDS}
        security = server.security
        if security.tls:  # captures talk gRPC with the API's TLS material unless flags say otherwise
            values["tls"] = TLSConfig(security.ca, security.cert, security.key)
        values.update((name, value) for name, value in changes.items() if value is not None)
        return cls(server=server, **values)


#: The fields CaptureOptions takes from the server section.
_SERVER_FIELDS = tuple(name for name in CaptureOptions.__dataclass_fields__ if name in ServerSettings.model_fields)


class Capture:
    def __init__(
        self, store: MetaStore, plugins: PluginManager, executor_factory: ExecutorFactory, options: CaptureOptions
    ) -> None:
        #: This capture's metrics, in a registry of its own (None: metrics off).
        self.metrics: CaptureMetrics | None = CaptureMetrics() if options.metrics else None
        self.store: MetaStore = store if self.metrics is None else TimedMetaStore(store, self.metrics)
        self.plugins = plugins
        self.executor_factory = executor_factory
        self.options = options
        self.info: CaptureInfo | None = None
        self.session: Session | None = None
        self.center: MessageCenter | None = None
        self.manager: MaintainerManager | None = None
        self.coordinator: Coordinator | None = None
        self._live: list[str] = []
        self._stopping = asyncio.Event()
        self._server = MessageServer(options.message_addr, options.tls)
        self.joined = asyncio.Event()
        self.rejoins = 0

    @property
    def message_addr(self) -> str:
        host = self.options.message_addr.rpartition(":")[0]
        return f"{host}:{self._server.port}"

    @property
    def is_owner(self) -> bool:
        return self.coordinator is not None and not self.coordinator.stopped.is_set()

    def live_captures(self) -> list[str]:
        return list(self._live)

    async def serve(self) -> None:
        """Run until :meth:`drain`; re-join after every session loss."""
        await self._server.start()
        try:
            while not self._stopping.is_set():
                await self._serve_once()
                if not self._stopping.is_set():
                    self.rejoins += 1
                    log.warning("capture lost its session; stopping everything and joining again")
        finally:
            await self._server.stop()

    async def _serve_once(self) -> None:
        capture_id = uuid.uuid4().hex[:12]
        self.info = CaptureInfo(
            capture_id, self.message_addr, self.options.api_addr, __version__, os.getpid(), time.time()
        )
        self.session = await self.store.open_session(self.info, self.options.session_ttl)
        self.center = MessageCenter(capture_id, GrpcTransport(capture_id, self.options.tls))
        self._server.center = self.center
        self._live = [capture_id]
        host = SpanHost(
            capture_id,
            self.center,
            self.executor_factory,
            self.plugins,
            self.options.data_dir,
            self.live_captures,
            self.options.server,
            self.metrics,
        )
        self.manager = MaintainerManager(capture_id, self.center, host, self.plugins, self.live_captures)
        tasks = [
            asyncio.create_task(self._watch_captures(), name="capture-watch"),
            asyncio.create_task(self._campaign(self.session), name="capture-campaign"),
        ]
        if self.options.reclaim_interval > 0:
            # The removed changefeeds' files: swept now, then every reclaim-interval (never
            # those of a changefeed with an executor here).
            sweeper = ChangefeedFilesSweeper(self.store, self.options.data_dir, host.changefeeds_here, self.metrics)
            tasks.append(asyncio.create_task(sweeper.run(self.options.reclaim_interval), name="capture-reclaim"))
        self.joined.set()
        stop = asyncio.create_task(self._stopping.wait())
        lost = asyncio.create_task(self.session.lost.wait())
        try:
            await asyncio.wait([stop, lost, *tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.joined.clear()
            await self._tear_down([*tasks, stop, lost])

    async def _tear_down(self, tasks: list[asyncio.Task[object]]) -> None:
        coordinator = self.coordinator
        if coordinator is not None:
            coordinator.stop()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if coordinator is not None and self.session is not None and not self.session.lost.is_set():
            with contextlib.suppress(CdcflowError):
                await self.store.resign(coordinator.term)  # after the last checkpoint flush
        if self.manager is not None:
            await self.manager.close()
        if self.session is not None and not self.session.lost.is_set():
            with contextlib.suppress(CdcflowError):
                await self.session.close()
        if self.center is not None:
            await self.center.close()
        self._server.center = None
        self.manager = self.center = self.coordinator = None

    async def _watch_captures(self) -> None:
        assert self.center is not None
        async for captures in self.store.watch_captures():
            self._live = [c.id for c in captures]
            self.center.set_peers({c.id: c.advertise_addr for c in captures})

    async def _campaign(self, session: Session) -> None:
        assert self.center is not None
        while not session.lost.is_set():
            term = await self.store.campaign(session)
            log.info("capture %s is the owner (term %d)", term.capture_id, term.term)
            gc = GCManager(f"cdcflow-{self.store.url}", self._keeper_for, gc_ttl=self.options.gc_ttl)
            self.coordinator = Coordinator(
                self.store,
                term,
                self.center,
                self.plugins,
                gc,
                checkpoint_window=self.options.checkpoint_window,
                gc_tick=self.options.gc_tick,
                heartbeat_timeout=self.options.heartbeat_timeout,
            )
            try:
                await self.coordinator.run()
            except NotOwnerError:
                pass
            finally:
                self.coordinator = None
                await gc.close()
            with contextlib.suppress(CdcflowError):
                await self.store.resign(term)
            await asyncio.sleep(0.5)  # let another capture win after a resign

    def _keeper_for(self, info: ChangeFeedInfo) -> tuple[str, GCSafepointKeeper] | None:
        try:
            source = connector_for(info, self.plugins).source.instantiate()
        except CdcflowError:
            return None
        keeper = getattr(source, "gc_safepoint_keeper", lambda: None)()
        if keeper is None:
            return None
        return json.dumps(info.source, sort_keys=True), keeper

    async def metrics_snapshot(self) -> Snapshot:
        """What a scrape of ``/metrics`` reads: the metastore's changefeeds and captures,
        and the state of every changefeed running here (on the event loop, briefly)."""
        records = await self.store.list_changefeeds()
        captures = await self.store.list_captures()
        executors = {}
        host = self.manager.host if self.manager is not None else None
        for changefeed_id, run in list(host.runs.items()) if host is not None else []:
            stats = run.executor.stats()
            if stats is not None:
                executors[changefeed_id] = stats
        coordinator = self.coordinator
        if self.metrics is not None:
            self.metrics.forget(info.id for info, _ in records)
        return Snapshot(
            changefeeds=records,
            captures=len(captures),
            is_owner=self.is_owner,
            term=coordinator.term.term if coordinator is not None and self.is_owner else 0,
            rejoins=self.rejoins,
            executors=executors,
        )

    async def resign(self) -> None:
        """Give up ownership (the API's owner/resign); another capture campaigns and wins."""
        if self.coordinator is not None:
            self.coordinator.stop()

    async def drain(self) -> None:
        """Graceful shutdown: resign, stop maintainers, close the session."""
        self._stopping.set()
