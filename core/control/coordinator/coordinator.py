"""The coordinator: runs on the owner and carries out the controller's decisions
(seed 000 "协调器").

All controller work happens on one task (an actor loop), so events, ticks and
lifecycle requests are applied one at a time. For each batch of decisions the
coordinator persists changefeed records first (optimistic concurrency; on a
conflict it re-reads the record), then sends commands. Checkpoints are queued
and written in one batch per window (monotonic, owner-checked), after which
each maintainer gets a CheckpointTsMessage. GC safepoints are updated on a
ticker and at once on create and resume.

When a write says this capture is no longer the owner (NotOwnerError), the
coordinator stops: the capture campaigns again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cdcflow.core.control.changefeed import ChangeFeedInfo, ChangefeedNotFoundError, ChangeFeedStatus
from cdcflow.core.control.coordinator.controller import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    AddMaintainer,
    Controller,
    Decisions,
    RemoveMaintainer,
)
from cdcflow.core.control.gc.manager import DEFAULT_GC_TICK, GCManager
from cdcflow.core.control.gc.manager import overwrite_checkpoint_ts as checked_overwrite
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import (
    AddMaintainerRequest,
    BlockStatusRequest,
    CheckpointTsMessage,
    CoordinatorBootstrapRequest,
    CoordinatorBootstrapResponse,
    MaintainerHeartbeat,
    Message,
    RemoveMaintainerRequest,
    Topic,
)
from cdcflow.core.control.metastore.base import MetaStore, MetaStoreConflictError, NotOwnerError, OwnerTerm
from cdcflow.core.errors import CdcflowError, DuplicateChangefeedIDError, MetaStoreIOError
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["DEFAULT_CHECKPOINT_WINDOW", "Coordinator"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds over which checkpoints are batched into one metastore write.
DEFAULT_CHECKPOINT_WINDOW = 0.5
#: A heartbeat's new checkpoint is written at once when the last write is at least this old.
MIN_CHECKPOINT_WRITE_INTERVAL = 0.2


class Coordinator:
    def __init__(
        self,
        store: MetaStore,
        term: OwnerTerm,
        center: MessageCenter,
        plugins: PluginManager,
        gc: GCManager | None = None,
        *,
        checkpoint_window: float = DEFAULT_CHECKPOINT_WINDOW,
        min_write_interval: float = MIN_CHECKPOINT_WRITE_INTERVAL,
        gc_tick: float = DEFAULT_GC_TICK,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        bootstrap_wait: float = 2.0,
    ) -> None:
        self.store = store
        self.term = term
        self.center = center
        self.plugins = plugins
        self.gc = gc
        self.controller = Controller(heartbeat_timeout=heartbeat_timeout)
        self.checkpoint_window = checkpoint_window
        self.gc_tick = gc_tick
        self.bootstrap_wait = bootstrap_wait
        self._work: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._pending: dict[str, ChangeFeedStatus] = {}
        #: When checkpoints were last written (monotonic clock), and the checkpoint written
        #: last per changefeed.
        self._last_flush = 0.0
        self._written: dict[str, int] = {}
        #: The write of a new checkpoint due once the last write is min_write_interval old.
        self._due: asyncio.Task[None] | None = None
        #: A heartbeat's new checkpoint is written once the last write is this old.
        self.min_write_interval = min_write_interval
        self._bootstrap: dict[str, Any] = {}
        self._captures: list[str] = []
        self.stopped = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def capture_id(self) -> str:
        return self.term.capture_id

    # -- running ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve as coordinator until stopped or deposed."""
        self.center.register(Topic.COORDINATOR, self._on_message)
        try:
            await self._throne()
            self._tasks = [
                asyncio.create_task(self._actor(), name="coordinator-actor"),
                asyncio.create_task(self._ticker(), name="coordinator-ticker"),
                asyncio.create_task(self._watch_captures(), name="coordinator-captures"),
            ]
            if self.gc is not None:
                self._tasks.append(asyncio.create_task(self._gc_ticker(), name="coordinator-gc"))
            await self.stopped.wait()
        finally:
            await self._step_down()

    async def _throne(self) -> None:
        """Load the changefeeds, bootstrap every manager, adopt or place maintainers."""
        self.controller.load(await self.store.list_changefeeds(), await self.store.list_snapshot_records())
        self._captures = [c.id for c in await self.store.list_captures()]
        self.center.set_peers({c.id: c.advertise_addr for c in await self.store.list_captures()})
        self._bootstrap = {}
        request = CoordinatorBootstrapRequest(self.capture_id, self.capture_id, self.term.term)
        for capture in self._captures:
            self.center.send(capture, Topic.MAINTAINER_MANAGER, request)
        deadline = time.monotonic() + self.bootstrap_wait
        while time.monotonic() < deadline and set(self._bootstrap) < set(self._captures):
            await asyncio.sleep(0.05)
        decisions = self.controller.bootstrap(self._bootstrap, self._captures, time.time())
        await self._carry_out(decisions)
        if self.gc is not None:
            await self._update_gc()

    async def _step_down(self) -> None:
        self.center.unregister(Topic.COORDINATOR, self._on_message)
        if self._due is not None:
            self._tasks.append(self._due)
            self._due = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(CdcflowError):
            await self._flush_checkpoints()

    def stop(self) -> None:
        self.stopped.set()

    async def _actor(self) -> None:
        while True:
            job = await self._work.get()
            try:
                await job()
            except NotOwnerError:
                log.warning("capture %s is no longer the owner; stepping down", self.capture_id)
                self.stop()
                return
            except MetaStoreIOError as exc:
                # The store already retried with backoff. The in-memory view may now be
                # ahead of what is stored, so step down: the next coordinator (possibly
                # this capture again) re-reads everything from the metastore.
                log.error("metastore failed; the coordinator steps down and starts again: %s", exc)
                self.stop()
                return

    def _submit(self, fn: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        async def job() -> None:
            try:
                result = await fn()
            except (NotOwnerError, MetaStoreIOError) as exc:
                if not future.done():
                    future.set_exception(exc)
                if isinstance(exc, MetaStoreConflictError):
                    return
                raise
            except Exception as exc:  # noqa: BLE001 - handed to the caller through the future
                if not future.done():
                    future.set_exception(exc)
                return
            if not future.done():
                future.set_result(result)

        self._work.put_nowait(job)
        return future

    async def _on_message(self, message: Message) -> None:
        if isinstance(message, CoordinatorBootstrapResponse):
            if message.coordinator_version == self.term.term:
                self._bootstrap[message.sender] = message.statuses
                if self._tasks:  # a capture that joined after the throne
                    reply = message

                    async def adopt() -> None:
                        decisions = self.controller.bootstrap(
                            {reply.sender: reply.statuses}, self._captures, time.time()
                        )
                        await self._carry_out(decisions)

                    self._submit(adopt)
        elif isinstance(message, BlockStatusRequest):
            block = message

            async def blocked() -> None:
                log.info("changefeed %s is blocked: %s", block.changefeed_id, block.reason or "no longer")
                await self._carry_out(self.controller.on_block_status(block.sender, block, time.time()))

            self._submit(blocked)
        elif isinstance(message, MaintainerHeartbeat):
            if message.coordinator_version != self.term.term:
                return
            beat = message

            async def heartbeat() -> None:
                await self._carry_out(self.controller.on_heartbeat(beat.sender, beat.statuses, time.time()))
                if self._checkpoint_moved():
                    # A new checkpoint is written as soon as the last write is
                    # MIN_CHECKPOINT_WRITE_INTERVAL old: now, or by a flush due then, not
                    # at the ticker's next tick (up to a window later). A resolved ts alone
                    # waits for the ticker.
                    if time.monotonic() - self._last_flush >= self.min_write_interval:
                        await self._flush_checkpoints()
                    else:
                        self._flush_when_due()

            self._submit(heartbeat)

    def _checkpoint_moved(self) -> bool:
        """Whether a pending status carries a checkpoint above the last one written."""
        return any(st.checkpoint_ts > self._written.get(cf, 0) for cf, st in self._pending.items())

    def _flush_when_due(self) -> None:
        """Write the pending checkpoints once the last write is ``min_write_interval`` old
        (one such flush at a time; it writes whatever is pending then)."""
        if self._due is not None and not self._due.done():
            return

        async def flush() -> None:
            await asyncio.sleep(max(0.0, self._last_flush + self.min_write_interval - time.monotonic()))

            async def write() -> None:
                if self._checkpoint_moved():  # else the ticker wrote it meanwhile
                    await self._flush_checkpoints()

            await self._await_quietly(self._submit(write), "checkpoint write")

        self._due = asyncio.create_task(flush(), name="coordinator-checkpoint-due")

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.checkpoint_window)

            async def tick() -> None:
                await self._carry_out(self.controller.tick(time.time()))
                await self._flush_checkpoints()

            await self._await_quietly(self._submit(tick), "tick")

    async def _gc_ticker(self) -> None:
        while True:
            await asyncio.sleep(self.gc_tick)
            await self._await_quietly(self._submit(self._update_gc), "GC safepoint update")

    @staticmethod
    async def _await_quietly(future: asyncio.Future[None], what: str) -> None:
        """Periodic work must outlive one failure (the actor steps down on metastore errors)."""
        try:
            await future
        except CdcflowError as exc:
            log.warning("coordinator %s failed: %s", what, exc)
        except Exception:
            log.exception("coordinator %s failed", what)

    async def _watch_captures(self) -> None:
        known: set[str] = set(self._captures)
        async for captures in self.store.watch_captures():
            self.center.set_peers({c.id: c.advertise_addr for c in captures})
            ids = [c.id for c in captures]
            joined = set(ids) - known
            known = set(ids)
            self._captures = ids
            request = CoordinatorBootstrapRequest(self.capture_id, self.capture_id, self.term.term)
            for capture in joined:
                self.center.send(capture, Topic.MAINTAINER_MANAGER, request)
            self._submit(self._captures_changed(list(ids)))

    def _captures_changed(self, captures: list[str]) -> Callable[[], Awaitable[None]]:
        async def changed() -> None:
            await self._carry_out(self.controller.on_captures(captures, time.time()))

        return changed

    # -- carrying out decisions ----------------------------------------------------------

    async def _carry_out(self, decisions: Decisions) -> None:
        for info in decisions.infos:
            try:
                await self.store.update_changefeed(info, self.term)
            except MetaStoreConflictError:
                record = await self.store.get_changefeed(info.id)
                if record is not None:
                    self.controller.reload(*record)
                log.warning("changefeed %s changed under the coordinator; re-read it", info.id)
        for changefeed_id in decisions.removed:
            await self.store.delete_changefeed(changefeed_id, self.term)
            self._pending.pop(changefeed_id, None)
        for cf, old, new, error in decisions.state_changes:
            self.plugins.changefeed_state_changed(cf, old.value, new.value, error)
        for command in decisions.commands:
            self._send(command)
        self._pending.update(decisions.checkpoints)
        for cf, snapshot in decisions.snapshot_records.items():
            await self._keep_snapshot_record(cf, snapshot)

    async def _keep_snapshot_record(self, changefeed_id: str, record: dict[str, Any]) -> None:
        """Store the snapshot record a maintainer reported when it changed; a complete one,
        once stored, is acknowledged to the maintainer (on every report of it, so that a
        lost acknowledgement is sent again), which then places the tables."""
        rt = self.controller.changefeeds.get(changefeed_id)
        if rt is None:
            return
        if record != rt.snapshot_record:
            await self.store.save_snapshot_record(changefeed_id, record, self.term)
            rt.snapshot_record = record
        if record.get("complete") and rt.capture is not None:
            ack = CheckpointTsMessage(
                self.capture_id, self.term.term, changefeed_id, rt.info.epoch, rt.status.checkpoint_ts, True
            )
            self.center.send(rt.capture, Topic.MAINTAINER_MANAGER, ack)

    def _send(self, command: AddMaintainer | RemoveMaintainer) -> None:
        message: Message
        if isinstance(command, AddMaintainer):
            rt = self.controller.changefeeds.get(command.changefeed_id)
            if rt is None or rt.info.epoch != command.epoch:
                return  # superseded within the same batch
            message = AddMaintainerRequest(
                self.capture_id,
                self.capture_id,
                self.term.term,
                command.changefeed_id,
                command.epoch,
                rt.info.to_json(),
                rt.status.checkpoint_ts,
                rt.snapshot_record,
            )
        else:
            message = RemoveMaintainerRequest(
                self.capture_id, self.capture_id, self.term.term, command.changefeed_id, command.epoch
            )
        self.center.send(command.capture, Topic.MAINTAINER_MANAGER, message)

    async def _flush_checkpoints(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        self._last_flush = time.monotonic()
        try:
            written = await self.store.update_checkpoints(batch, self.term)
        except CdcflowError:
            for cf, status in batch.items():  # keep them for the next window; newer ones win
                newer = self._pending.get(cf)
                if newer is None or newer.checkpoint_ts < status.checkpoint_ts:
                    self._pending[cf] = status
            raise
        for cf, checkpoint in written.items():
            self._written[cf] = max(self._written.get(cf, 0), checkpoint)
            rt = self.controller.changefeeds.get(cf)
            if rt is not None and rt.capture is not None:
                self.center.send(
                    rt.capture,
                    Topic.MAINTAINER_MANAGER,
                    CheckpointTsMessage(self.capture_id, self.term.term, cf, rt.info.epoch, checkpoint),
                )

    async def _update_gc(self) -> None:
        if self.gc is None:
            return
        records = [(rt.info, rt.status) for rt in self.controller.changefeeds.values()]
        stale = await self.gc.update(records, time.time())
        for cf, error in stale.items():
            await self._carry_out(self.controller.fail_stale(cf, error, time.time()))

    # -- lifecycle requests (from the API) ------------------------------------------------------

    async def create(self, info: ChangeFeedInfo) -> ChangeFeedInfo:
        async def create() -> ChangeFeedInfo:
            if info.id in self.controller.changefeeds:
                raise DuplicateChangefeedIDError(
                    f"changefeed {info.id} already exists", detail={"changefeed_id": info.id}
                )
            status = ChangeFeedStatus(info.start_ts, info.start_ts)
            now = time.time()
            # A changefeed's epochs only grow, across its id's incarnations too: a capture
            # ignores a maintainer at or below an epoch it removed, so one created again under
            # a removed changefeed's id starts above any epoch that one reached (restarts add 1).
            created = info.with_changes(epoch=max(info.epoch, int(now * 1000)))
            await self.store.create_changefeed(created, status, self.term)
            await self._carry_out(self.controller.create(created, status, now))
            await self._update_gc()
            return self.controller.changefeeds[info.id].info

        return await self._submit(create)

    def _runtime(self, changefeed_id: str) -> None:
        if changefeed_id not in self.controller.changefeeds:
            raise ChangefeedNotFoundError(
                f"changefeed {changefeed_id} does not exist", detail={"changefeed_id": changefeed_id}
            )

    async def pause(self, changefeed_id: str) -> None:
        async def pause() -> None:
            self._runtime(changefeed_id)
            await self._carry_out(self.controller.pause(changefeed_id, time.time()))

        await self._submit(pause)

    async def resume(self, changefeed_id: str, overwrite_checkpoint_ts: int | None = None) -> None:
        """Resume a paused or warning changefeed, from ``overwrite_checkpoint_ts`` when given:
        it must be a TSO the upstream can serve (see :meth:`GCManager.check_resume_ts`), else
        ConfigInvalidError (1001) and nothing changes."""
        overwrite = overwrite_checkpoint_ts

        async def resume() -> None:
            self._runtime(changefeed_id)
            if overwrite is not None:
                ts = checked_overwrite(changefeed_id, overwrite)
                if self.gc is not None:
                    await self.gc.check_resume_ts(self.controller.changefeeds[changefeed_id].info, ts)
            decisions = self.controller.resume(changefeed_id, time.time(), overwrite)
            await self._carry_out(decisions)
            await self._update_gc()

        await self._submit(resume)

    async def remove(self, changefeed_id: str) -> None:
        async def remove() -> None:
            self._runtime(changefeed_id)
            await self._carry_out(self.controller.remove(changefeed_id, time.time()))
            await self._update_gc()

        await self._submit(remove)

    async def update(self, info: ChangeFeedInfo) -> ChangeFeedInfo:
        async def update() -> ChangeFeedInfo:
            self._runtime(info.id)
            await self._carry_out(self.controller.update(info))
            return self.controller.changefeeds[info.id].info

        return await self._submit(update)
