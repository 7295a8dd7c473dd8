"""The maintainer manager: one per capture (seed 000).

It receives the coordinator's commands on MaintainerManagerTopic, checks the
coordinator's id and version (a command of an older coordinator version is
dropped; a newer one is adopted), creates and removes maintainers, routes
per-changefeed messages to them, and sends the coordinator heartbeats: each
changed maintainer status at once (looked for every 100 ms, and at once when a
maintainer's checkpoint moves), all of them at least every second. It also
holds the capture's span host.

Idempotence: AddMaintainer of an epoch at or below the running (or last
removed) one does nothing; RemoveMaintainer removes only incarnations at or
below its epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.control.maintainer.maintainer import Maintainer
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import (
    AddMaintainerRequest,
    BlockStatusRequest,
    CheckpointTsMessage,
    CoordinatorBootstrapRequest,
    CoordinatorBootstrapResponse,
    MaintainerHeartbeat,
    MaintainerStatus,
    Message,
    RemoveMaintainerRequest,
    SchedulingMessage,
    Topic,
)
from cdcflow.core.control.span_host import SpanHost
from cdcflow.core.data.snapshot_ranges import SnapshotRecord
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["MaintainerManager"]

log = logging.getLogger(__name__)
#: Seconds between looks for changed maintainer statuses (a changed one is sent then).
POLL = 0.1
HEARTBEAT_EVERY = 1.0


class MaintainerManager:
    def __init__(
        self,
        capture_id: str,
        center: MessageCenter,
        host: SpanHost,
        plugins: PluginManager,
        live_captures: Callable[[], list[str]],
    ) -> None:
        self.capture_id = capture_id
        self.center = center
        self.host = host
        self.plugins = plugins
        self.live_captures = live_captures
        self.coordinator_id: str | None = None
        self.coordinator_version = 0
        self.maintainers: dict[str, Maintainer] = {}
        self._removed: dict[str, int] = {}
        self._closed: list[MaintainerStatus] = []
        self._last_sent: dict[str, MaintainerStatus] = {}
        self._last_block: dict[str, str] = {}
        #: Set when a maintainer's checkpoint moved: its heartbeat goes at once, not POLL later.
        self._progress = asyncio.Event()
        center.register(Topic.MAINTAINER_MANAGER, self._on_manager_message)
        center.register(Topic.MAINTAINER, self._on_maintainer_message)
        self._task = asyncio.create_task(self._heartbeat_loop(), name=f"maintainer-manager-{capture_id}")

    # -- coordinator checks -------------------------------------------------------------------

    def _accept(self, coordinator_id: str, version: int) -> bool:
        if version < self.coordinator_version:
            log.info(
                "dropped a command of coordinator %s version %d (now %d)",
                coordinator_id,
                version,
                self.coordinator_version,
            )
            return False
        if version > self.coordinator_version or coordinator_id != self.coordinator_id:
            self.coordinator_id, self.coordinator_version = coordinator_id, version
            self._last_sent.clear()
        return True

    # -- messages -------------------------------------------------------------------------------

    async def _on_manager_message(self, message: Message) -> None:
        if isinstance(message, CoordinatorBootstrapRequest):
            if self._accept(message.coordinator_id, message.coordinator_version):
                statuses = tuple(m.status() for m in self.maintainers.values())
                self.center.send(
                    message.coordinator_id,
                    Topic.COORDINATOR,
                    CoordinatorBootstrapResponse(self.capture_id, self.coordinator_version, statuses),
                )
        elif isinstance(message, AddMaintainerRequest):
            if self._accept(message.coordinator_id, message.coordinator_version):
                await self._add(message)
        elif isinstance(message, RemoveMaintainerRequest):
            if self._accept(message.coordinator_id, message.coordinator_version):
                await self._remove(message.changefeed_id, message.epoch)
        elif isinstance(message, CheckpointTsMessage):
            maintainer = self.maintainers.get(message.changefeed_id)
            if maintainer is not None and maintainer.epoch == message.epoch:
                maintainer.on_checkpoint(message.checkpoint_ts)
                if message.snapshot_complete:
                    maintainer.on_snapshot_kept()
        elif isinstance(message, SchedulingMessage):
            await self.host.on_request(message)

    async def _on_maintainer_message(self, message: Message) -> None:
        if isinstance(message, SchedulingMessage):
            maintainer = self.maintainers.get(message.changefeed_id)
            if maintainer is not None:
                maintainer.on_scheduling(message)

    async def _add(self, req: AddMaintainerRequest) -> None:
        current = self.maintainers.get(req.changefeed_id)
        if req.epoch <= self._removed.get(req.changefeed_id, 0):
            return  # reordered: this incarnation was already removed
        if current is not None:
            if current.epoch >= req.epoch:
                return  # a repeat
            await self._remove(req.changefeed_id, current.epoch)
        maintainer = Maintainer(
            self.capture_id,
            self.center,
            ChangeFeedInfo.from_json(req.info),
            req.checkpoint_ts,
            self.plugins,
            self.live_captures,
            snapshot_record=SnapshotRecord.from_json(req.snapshot_record) if req.snapshot_record else None,
        )
        maintainer.on_progress = self._progress.set
        self.maintainers[req.changefeed_id] = maintainer
        maintainer.start()
        log.info("maintainer of %s epoch %d started on %s", req.changefeed_id, req.epoch, self.capture_id)

    async def _remove(self, changefeed_id: str, epoch: int) -> None:
        self._removed[changefeed_id] = max(epoch, self._removed.get(changefeed_id, 0))
        maintainer = self.maintainers.get(changefeed_id)
        if maintainer is None or maintainer.epoch > epoch:
            return
        del self.maintainers[changefeed_id]
        self._last_sent.pop(changefeed_id, None)
        self._closed.append(await maintainer.close())  # the CloseAck, sent with the next heartbeat
        await self.host.remove_changefeed(changefeed_id, epoch)

    # -- heartbeats -----------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        last_full = 0.0
        while True:
            # Every POLL, or at once when a maintainer's checkpoint moved.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL):
                    await self._progress.wait()
            self._progress.clear()
            if self.coordinator_id is None:
                continue
            now = loop.time()
            statuses = {cf: m.status() for cf, m in self.maintainers.items()}
            if now - last_full >= HEARTBEAT_EVERY:
                changed = list(statuses.values())
                last_full = now
            else:
                changed = [s for cf, s in statuses.items() if self._last_sent.get(cf) != s]
            self._send_block_status()
            changed.extend(self._closed)
            self._closed = []
            if not changed:
                continue
            self._last_sent.update(statuses)
            self.center.send(
                self.coordinator_id,
                Topic.COORDINATOR,
                MaintainerHeartbeat(self.capture_id, self.coordinator_version, tuple(changed)),
            )

    def _send_block_status(self) -> None:
        """BlockStatusRequest for each maintainer whose block reason changed."""
        assert self.coordinator_id is not None
        for cf, m in self.maintainers.items():
            if self._last_block.get(cf, "") != m.block_reason:
                self._last_block[cf] = m.block_reason
                block = BlockStatusRequest(self.capture_id, cf, m.epoch, m.block_reason, m.checkpoint_ts)
                self.center.send(self.coordinator_id, Topic.COORDINATOR, block)

    async def close(self) -> None:
        """Stop every maintainer (graceful drain) and the span host."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for cf, maintainer in list(self.maintainers.items()):
            await self._remove(cf, maintainer.epoch)
        await self.host.close()
        self.center.unregister(Topic.MAINTAINER_MANAGER, self._on_manager_message)
        self.center.unregister(Topic.MAINTAINER, self._on_maintainer_message)
