"""The etcd metastore (``etcd://host:port[,host:port][/prefix]``): the cluster store.

* A session is an etcd lease kept alive in the background; the capture's key
  is attached to it, so a dead capture's registration vanishes with its lease.
* The owner key is put with ``version == 0`` in a transaction, attached to
  the owner's lease; its create revision is the owner term.
* Every coordinator write is one transaction that also compares the owner
  key's value and create revision: a deposed owner's writes fail as a whole.
* Changefeed records are replaced only if their mod revision is the one read
  (optimistic concurrency), and the stored version is checked first.

Calls go through the maintained etcd v3 client ``pyetcd`` (etcd-sdk-python)
on worker threads; connection failures are retried with backoff and end in
:class:`~cdcflow.core.errors.MetaStoreIOError` (3002).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

import pyetcd
from pyetcd import exceptions as etcd_errors
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo, ChangeFeedStatus
from cdcflow.core.control.metastore.base import (
    POLL_INTERVAL,
    MetaStore,
    MetaStoreConflictError,
    NotOwnerError,
    OwnerTerm,
    Session,
)
from cdcflow.core.errors import DuplicateChangefeedIDError, MetaStoreIOError

__all__ = ["EtcdMetaStore"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_TRANSIENT = (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError, etcd_errors.NoServerAvailableError)


class EtcdSession(Session):
    def __init__(self, store: EtcdMetaStore, capture: CaptureInfo, ttl: float, lease: Any) -> None:
        super().__init__(capture, ttl)
        self.lease = lease
        self._store = store
        self._task = asyncio.create_task(self._keep_alive(), name=f"etcd-session-{capture.id}")

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        last_ok = loop.time()
        while not self.lost.is_set():
            await asyncio.sleep(self.ttl / 3)
            try:
                ttl = await asyncio.to_thread(self._refresh)
            except etcd_errors.Etcd3Exception as exc:
                log.warning("keepalive of capture %s failed: %s", self.capture.id, exc)
                if loop.time() - last_ok > self.ttl:
                    self.lost.set()
                continue
            if ttl <= 0:
                log.warning("the lease of capture %s expired", self.capture.id)
                self.lost.set()
            else:
                last_ok = loop.time()

    def _refresh(self) -> int:
        responses = list(self._store.client.refresh_lease(self.lease.id))
        return int(responses[0].TTL) if responses else 0

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(etcd_errors.Etcd3Exception):
            await asyncio.to_thread(self._store.client.revoke_lease, self.lease.id)
        self.lost.set()


class EtcdMetaStore(MetaStore):
    def __init__(
        self, endpoints: list[str], *, prefix: str = "cdcflow", timeout: float = 5.0, retries: int = 5
    ) -> None:
        if not endpoints:
            raise MetaStoreIOError("an etcd metastore URL needs at least one host:port")
        self.url = f"etcd://{','.join(endpoints)}/{prefix}"
        self.prefix = f"/{prefix}"
        self._retries = retries
        eps = []
        for ep in endpoints:
            host, _, port = ep.rpartition(":")
            eps.append(pyetcd.Endpoint(host, int(port), secure=False))
        self.client = pyetcd.MultiEndpointEtcd3Client(endpoints=eps, timeout=timeout, failover=True)
        self.tx = self.client.transactions

    # -- plumbing -------------------------------------------------------------------------

    def _key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts))

    async def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(_TRANSIENT),
                stop=stop_after_attempt(self._retries),
                wait=wait_exponential(multiplier=0.1, max=2.0),
                reraise=True,
            ):
                with attempt:
                    return await asyncio.to_thread(fn)
        except etcd_errors.Etcd3Exception as exc:
            raise MetaStoreIOError(
                f"metastore {self.url}: {what} failed after {self._retries} attempts: {exc or type(exc).__name__}",
                detail={"url": self.url, "operation": what},
            ) from exc
        raise AssertionError("unreachable")

    def _owner_compares(self, term: OwnerTerm) -> list[Any]:
        key = self._key("owner")
        return [self.tx.value(key) == term.capture_id, self.tx.create(key) == term.term]

    def _raise_not_owner(self, term: OwnerTerm) -> None:
        value, meta = self.client.get(self._key("owner"))
        if value is None or value.decode() != term.capture_id or meta.create_revision != term.term:
            raise NotOwnerError(
                f"capture {term.capture_id} is no longer the owner (term {term.term})",
                detail={"capture_id": term.capture_id, "term": term.term},
            )

    # -- sessions ----------------------------------------------------------------------------

    async def open_session(self, capture: CaptureInfo, ttl: float) -> Session:
        def register() -> Any:
            lease = self.client.lease(max(1, int(ttl)))
            self.client.put(self._key("capture", capture.id), json.dumps(capture.to_json()), lease=lease)
            return lease

        lease = await self._call("register capture", register)
        return EtcdSession(self, capture, ttl, lease)

    async def list_captures(self) -> list[CaptureInfo]:
        def read() -> list[CaptureInfo]:
            items = [CaptureInfo.from_json(json.loads(v)) for v, _ in self.client.get_prefix(self._key("capture", ""))]
            return sorted(items, key=lambda c: c.id)

        return await self._call("list captures", read)

    async def watch_captures(self) -> AsyncIterator[list[CaptureInfo]]:
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def on_event(_: Any) -> None:
            loop.call_soon_threadsafe(changed.set)

        watch_id = await self._call(
            "watch captures", lambda: self.client.add_watch_prefix_callback(self._key("capture", ""), on_event)
        )
        try:
            last: list[CaptureInfo] | None = None
            while True:
                changed.clear()
                captures = await self.list_captures()
                if captures != last:
                    last = captures
                    yield captures
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), 1.0)  # a watch that broke is covered by the poll
        finally:
            with contextlib.suppress(Exception):
                self.client.cancel_watch(watch_id)

    # -- owner ------------------------------------------------------------------------------------

    async def campaign(self, session: Session) -> OwnerTerm:
        assert isinstance(session, EtcdSession)
        me, key = session.capture.id, self._key("owner")

        def try_acquire() -> OwnerTerm | None:
            self.client.transaction(
                compare=[self.tx.version(key) == 0],
                success=[self.tx.put(key, me, lease=session.lease)],
                failure=[],
            )
            value, meta = self.client.get(key)
            if value is not None and value.decode() == me:
                return OwnerTerm(me, meta.create_revision)
            return None

        while True:
            if session.lost.is_set():
                raise NotOwnerError(f"capture {me} lost its session while campaigning")
            won = await self._call("campaign", try_acquire)
            if won is not None:
                return won
            await asyncio.sleep(POLL_INTERVAL)

    async def get_owner(self) -> OwnerTerm | None:
        def read() -> OwnerTerm | None:
            value, meta = self.client.get(self._key("owner"))
            return None if value is None else OwnerTerm(value.decode(), meta.create_revision)

        return await self._call("get owner", read)

    async def resign(self, term: OwnerTerm) -> None:
        await self._call(
            "resign",
            lambda: self.client.transaction(
                compare=self._owner_compares(term), success=[self.tx.delete(self._key("owner"))], failure=[]
            ),
        )

    # -- changefeeds --------------------------------------------------------------------------

    async def create_changefeed(self, info: ChangeFeedInfo, status: ChangeFeedStatus, term: OwnerTerm) -> None:
        info_key, status_key = self._key("changefeed", "info", info.id), self._key("changefeed", "status", info.id)

        def create() -> None:
            ok, _ = self.client.transaction(
                compare=[*self._owner_compares(term), self.tx.version(info_key) == 0],
                success=[
                    self.tx.put(info_key, json.dumps(info.to_json())),
                    self.tx.put(status_key, json.dumps(status.to_json())),
                ],
                failure=[],
            )
            if not ok:
                self._raise_not_owner(term)
                raise DuplicateChangefeedIDError(
                    f"changefeed {info.id} already exists", detail={"changefeed_id": info.id}
                )

        await self._call("create changefeed", create)

    def _read_one(self, changefeed_id: str) -> tuple[ChangeFeedInfo, ChangeFeedStatus] | None:
        value, _ = self.client.get(self._key("changefeed", "info", changefeed_id))
        if value is None:
            return None
        status, _ = self.client.get(self._key("changefeed", "status", changefeed_id))
        st = ChangeFeedStatus.from_json(json.loads(status)) if status else ChangeFeedStatus(0, 0)
        return ChangeFeedInfo.from_json(json.loads(value)), st

    async def get_changefeed(self, changefeed_id: str) -> tuple[ChangeFeedInfo, ChangeFeedStatus] | None:
        return await self._call("get changefeed", lambda: self._read_one(changefeed_id))

    async def list_changefeeds(self) -> list[tuple[ChangeFeedInfo, ChangeFeedStatus]]:
        def read() -> list[tuple[ChangeFeedInfo, ChangeFeedStatus]]:
            infos = {
                (i := ChangeFeedInfo.from_json(json.loads(v))).id: i
                for v, _ in self.client.get_prefix(self._key("changefeed", "info", ""))
            }
            statuses = {
                meta.key.decode().rsplit("/", 1)[-1]: ChangeFeedStatus.from_json(json.loads(v))
                for v, meta in self.client.get_prefix(self._key("changefeed", "status", ""))
            }
            return [(infos[k], statuses.get(k, ChangeFeedStatus(0, 0))) for k in sorted(infos)]

        return await self._call("list changefeeds", read)

    async def update_changefeed(self, info: ChangeFeedInfo, term: OwnerTerm) -> None:
        key = self._key("changefeed", "info", info.id)

        def update() -> None:
            value, meta = self.client.get(key)
            stored = json.loads(value)["version"] if value is not None else None
            if stored != info.version - 1:
                raise MetaStoreConflictError(
                    f"changefeed {info.id} is at version {stored}, not {info.version - 1} (changed or removed)",
                    detail={"changefeed_id": info.id, "expected_version": info.version - 1},
                )
            ok, _ = self.client.transaction(
                compare=[*self._owner_compares(term), self.tx.mod(key) == meta.mod_revision],
                success=[self.tx.put(key, json.dumps(info.to_json()))],
                failure=[],
            )
            if not ok:
                self._raise_not_owner(term)
                raise MetaStoreConflictError(
                    f"changefeed {info.id} changed while it was written", detail={"changefeed_id": info.id}
                )

        await self._call("update changefeed", update)

    async def delete_changefeed(self, changefeed_id: str, term: OwnerTerm) -> None:
        def delete() -> None:
            ok, _ = self.client.transaction(
                compare=self._owner_compares(term),
                success=[
                    self.tx.delete(self._key("changefeed", "info", changefeed_id)),
                    self.tx.delete(self._key("changefeed", "status", changefeed_id)),
                    self.tx.delete(self._key("changefeed", "snapshot", changefeed_id)),
                ],
                failure=[],
            )
            if not ok:
                self._raise_not_owner(term)

        await self._call("delete changefeed", delete)

    async def update_checkpoints(self, statuses: Mapping[str, ChangeFeedStatus], term: OwnerTerm) -> dict[str, int]:
        def update() -> dict[str, int]:
            written: dict[str, int] = {}
            for cf, st in statuses.items():
                key = self._key("changefeed", "status", cf)
                value, meta = self.client.get(key)
                if value is None:
                    continue
                old = ChangeFeedStatus.from_json(json.loads(value))
                new = ChangeFeedStatus(
                    max(old.checkpoint_ts, st.checkpoint_ts), max(old.resolved_ts, st.resolved_ts), old.version + 1
                )
                if (new.checkpoint_ts, new.resolved_ts) == (old.checkpoint_ts, old.resolved_ts):
                    continue
                ok, _ = self.client.transaction(
                    compare=[*self._owner_compares(term), self.tx.mod(key) == meta.mod_revision],
                    success=[self.tx.put(key, json.dumps(new.to_json()))],
                    failure=[],
                )
                if not ok:
                    self._raise_not_owner(term)
                    continue  # raced with a removal; the next round retries
                written[cf] = new.checkpoint_ts
            return written

        return await self._call("update checkpoints", update)

    async def save_snapshot_record(self, changefeed_id: str, record: Mapping[str, Any], term: OwnerTerm) -> None:
        info_key = self._key("changefeed", "info", changefeed_id)

        def save() -> None:
            ok, _ = self.client.transaction(
                compare=[*self._owner_compares(term), self.tx.version(info_key) > 0],
                success=[self.tx.put(self._key("changefeed", "snapshot", changefeed_id), json.dumps(dict(record)))],
                failure=[],
            )
            if not ok:
                self._raise_not_owner(term)  # else the changefeed was removed: nothing to keep

        await self._call("save snapshot record", save)

    async def list_snapshot_records(self) -> dict[str, dict[str, Any]]:
        def read() -> dict[str, dict[str, Any]]:
            return {
                meta.key.decode().rsplit("/", 1)[-1]: json.loads(v)
                for v, meta in self.client.get_prefix(self._key("changefeed", "snapshot", ""))
            }

        return await self._call("list snapshot records", read)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
