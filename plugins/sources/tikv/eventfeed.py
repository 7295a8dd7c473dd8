"""The EventFeed client: committed key changes and resolved timestamps of spans, from TiKV.

For each span (one :meth:`EventFeedClient.feed`), the span is split by the
regions PD reports, and each region gets one ChangeDataRequest on the
ChangeData stream of its leader's store. Entries are matched per region
(:mod:`~cdcflow.plugins.sources.tikv.matcher`); store-level resolved ts moves
the resolved ts of the region's key range (:class:`RangeTs`) once the region
is INITIALIZED, and the span's frontier (the minimum over its ranges) is
yielded as a :class:`ResolvedEvent` whenever it moves forward.

Region errors (the reference's §3.3):

* NotLeader → subscribe the region again at the new leader's store;
* EpochNotMatch / RegionNotFound → reload the range from PD and split it again;
* ServerIsBusy / Congested → back off, then as EpochNotMatch;
* DuplicateRequest → the feed fails (a client bug; retryable by restarting it);
* Compatibility → :class:`UnsupportedProtocolError`; ClusterIDMismatch → fatal;
* a broken stream → every region on it is resubscribed.

What the regions hold before their changes are yielded (pending prewrites,
changes until INITIALIZED) is accounted to the client's
:class:`~cdcflow.plugins.sources.tikv.spill.FeedMemory` and spilled to disk
past its budget, without changing what is yielded or in which order.

Lock resolution: a region whose resolved ts has not moved for
``resolve_lock_interval`` seconds (TiCDC's 20 s by default) may be held back by
an abandoned Percolator lock (a client prewrote and died). The feed's resolver
lists the region's locks below the current TSO with ``KvScanLock`` and
resolves those whose transaction is decided — committed, or rolled back
because its TTL expired — with :class:`~.locks.LockResolver` (the snapshot
reader's check-then-resolve); a live transaction's lock is left to its owner.
At most ``resolve_lock_budget`` locks per region per pass; a failed pass is
logged and retried with backoff (region errors re-locate the range). TiKV's
resolved ts then moves past the resolved locks. Not for ``rawkv`` (no locks).

A resubscribed range always starts at its own resolved ts, which is at or
above everything already yielded as resolved: nothing is lost, and only
changes above the span's frontier may be yielded twice (the Source.feed
contract). Changes are never yielded at or below a resolved ts already
yielded for the span.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from cdcflow.core.data.events import RawKVEvent, ResolvedEvent, Span
from cdcflow.core.errors import CdcflowError, ErrorCode, Retryable, Severity, UnsupportedProtocolError
from cdcflow.plugins.sources.tikv.channels import TLSFiles, open_channel
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, kvrpcpb_pb2, metapb_pb2
from cdcflow.plugins.sources.tikv.locks import LockResolver, LockStats, RetryError
from cdcflow.plugins.sources.tikv.matcher import Committed, Matcher, UnmatchedCommitError, check_commit_ts
from cdcflow.plugins.sources.tikv.pd import PDClient, PDRejectedError
from cdcflow.plugins.sources.tikv.rangets import RangeTs
from cdcflow.plugins.sources.tikv.regions import RegionInfo, clip, region_key
from cdcflow.plugins.sources.tikv.spill import FeedMemory
from cdcflow.plugins.sources.tikv.stream import StoreStream
from cdcflow.plugins.sources.tikv.subscription import (
    END,
    FeedEvent,
    RegionState,
    Subscription,
    drain,
    error_name,
    max_end,
)
from cdcflow.plugins.sources.tikv.tidb.keys import decode_bytes

__all__ = ["KV_APIS", "ClusterIDMismatchError", "EventFeedClient", "FeedEvent"]

log = logging.getLogger(__name__)


def _retired(state: RegionState) -> bool:
    # Read afresh after an await, which may have retired the region (a type
    # checker would otherwise keep the value narrowed from before the await).
    return state.retired


KV_APIS = {
    "tidb": cdcpb_pb2.ChangeDataRequest.TiDB,
    "rawkv": cdcpb_pb2.ChangeDataRequest.RawKV,
    "txnkv": cdcpb_pb2.ChangeDataRequest.TxnKV,
}
_VERSION = "cdcflow"


class ClusterIDMismatchError(CdcflowError):
    """A TiKV store belongs to another cluster than the PD it was found through (1001: check the pd endpoints)."""

    code = ErrorCode.ErrConfigInvalid
    default_severity = Severity.FATAL


class DuplicateRequestError(CdcflowError):
    """A store reports a region subscribed twice on one stream (6001: the ChangeData protocol was broken)."""

    code = ErrorCode.ErrUnsupportedProtocol
    default_retryable = Retryable.RETRY


class _Resplit(Exception):
    """PD's regions do not cover the range yet (a split in flight); ask again."""


class EventFeedClient:
    """Feeds of spans over shared per-store ChangeData streams. One per source."""

    def __init__(
        self,
        pd: PDClient,
        *,
        kv_api: str = "tidb",
        tls: TLSFiles | None = None,
        retry_timeout: float = 60.0,
        backoff_max: float = 2.0,
        queue_size: int = 4096,
        memory: FeedMemory | None = None,
        resolve_lock_interval: float = 20.0,
        resolve_lock_budget: int = 1024,
    ) -> None:
        if kv_api not in KV_APIS:
            raise ValueError(f"kv_api must be one of {sorted(KV_APIS)}, not {kv_api!r}")
        if resolve_lock_interval < 0:
            raise ValueError(f"resolve_lock_interval must be at least 0, got {resolve_lock_interval}")
        if resolve_lock_budget < 1:
            raise ValueError(f"resolve_lock_budget must be at least 1, got {resolve_lock_budget}")
        self.pd = pd
        self.kv_api = kv_api
        # TiDB and txnkv keys are stored memcomparable-encoded; rawkv (API v1) keys as they are.
        self.encoded_keys = kv_api != "rawkv"
        self._tls = tls
        self._retry_timeout = retry_timeout
        self._backoff_max = backoff_max
        self._queue_size = queue_size
        #: What the regions hold (prewrites, early commits, changes until INITIALIZED), against
        #: its budget; unbounded when not given.
        self.memory = memory if memory is not None else FeedMemory()
        self._request_ids = itertools.count(1)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[tuple[str, int], StoreStream] = {}
        self._stream_lock = asyncio.Lock()
        #: Store addresses that answered EventFeedV2 with UNIMPLEMENTED.
        self.v1_stores: set[str] = set()
        self._subs: set[Subscription] = set()
        #: Changes received while regions were still scanning (before INITIALIZED), for metrics.
        self.incremental_scan_rows = 0
        #: Seconds a region's resolved ts may stand still before its locks are resolved (0: never).
        self.resolve_lock_interval = resolve_lock_interval if kv_api != "rawkv" else 0.0
        self._resolve_lock_budget = resolve_lock_budget
        self._locks = LockResolver(pd, tls=tls)
        #: Lock-resolution passes over lagging regions (and failed ones), for metrics and tests.
        self.resolve_lock_passes = 0
        self.resolve_lock_failures = 0

    @property
    def lock_stats(self) -> LockStats:
        """What the resolver of lagging regions did: locks met, committed, rolled back, left alive."""
        return self._locks.stats

    async def close(self) -> None:
        """Close every stream; open feeds end (their iterators stop)."""
        for sub in list(self._subs):
            sub.closed = True
            drain(sub.out)
            sub.out.put_nowait(END)
            for task in sub.tasks:
                task.cancel()
        for stream in list(self._streams.values()):
            await stream.close()
        self._streams.clear()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        await self._locks.close()
        for sub in list(self._subs):
            for state in list(sub.regions.values()):
                self._retire(state)
        self.memory.close()

    def region_counts(self, lagging_before_ms: int) -> tuple[int, int, int]:
        """(subscribed, initializing, lagging) regions over every open feed; lagging: initialized
        with a resolved ts whose physical time is before ``lagging_before_ms`` (Unix ms)."""
        subscribed = initializing = lagging = 0
        for sub in list(self._subs):
            for state in list(sub.regions.values()):
                subscribed += 1
                if not state.initialized:
                    initializing += 1
                elif (state.resolved_ts >> 18) < lagging_before_ms:
                    lagging += 1
        return subscribed, initializing, lagging

    # -- the feed -------------------------------------------------------------

    async def feed(self, span: Span, start_ts: int) -> AsyncIterator[FeedEvent]:
        """Committed changes of ``span`` above ``start_ts`` and the span's resolved ts, until cancelled."""
        start = region_key(span.start, encoded=self.encoded_keys)
        end = region_key(span.end, encoded=self.encoded_keys)
        sub = Subscription(
            request_id=next(self._request_ids),
            span=span,
            start=start,
            end=end,
            ranges=RangeTs(start, end, start_ts),
            out=asyncio.Queue(self._queue_size),
            emitted_resolved=start_ts,
        )
        self._subs.add(sub)
        self._spawn(sub, self._subscribe_range(sub, start, end, delay=0.0))
        if self.resolve_lock_interval > 0:
            self._spawn(sub, self._resolve_locks_loop(sub))
        try:
            while True:
                item = await sub.out.get()
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, RawKVEvent | ResolvedEvent)
                yield item
        finally:
            self._subs.discard(sub)
            await self._unsubscribe(sub)

    def _spawn(self, sub: Subscription, coro: Any) -> None:
        if sub.closed:
            coro.close()
            return
        task: asyncio.Task[None] = asyncio.create_task(coro)
        sub.tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(sub, t))

    def _task_done(self, sub: Subscription, task: asyncio.Task[None]) -> None:
        """Forget a finished task; one that died of an unexpected error fails the feed instead of a silent hole."""
        sub.tasks.discard(task)
        if task.cancelled() or task.exception() is None or sub.closed:
            return
        exc = task.exception()
        log.error("%s: subscription task failed", sub.span, exc_info=exc)
        sub.closed = True
        drain(sub.out)
        sub.out.put_nowait(
            CdcflowError(f"{sub.span}: internal error while subscribing regions: {exc!r}", retryable=Retryable.RETRY)
        )

    async def _unsubscribe(self, sub: Subscription) -> None:
        sub.closed = True
        # A stream reader blocked on this feed's full queue must not hold up the other feeds.
        drain(sub.out)
        for task in list(sub.tasks):
            task.cancel()
        await asyncio.gather(*sub.tasks, return_exceptions=True)
        for state in list(sub.regions.values()):
            self._retire(state)
            req = cdcpb_pb2.ChangeDataRequest(
                header=self._header(),
                region_id=state.region_id,
                request_id=sub.request_id,
                deregister=cdcpb_pb2.ChangeDataRequest.Deregister(),
            )
            with contextlib.suppress(ConnectionError):  # a broken stream took the registration along
                await state.stream.send(req)
        for key, stream in list(self._streams.items()):
            if key[1] == sub.request_id:  # a per-subscription EventFeed (v1) stream
                del self._streams[key]
                await stream.close()

    async def _fail(self, sub: Subscription, error: BaseException) -> None:
        if not sub.closed:
            sub.closed = True
            await sub.out.put(error)

    # -- subscribing regions ------------------------------------------------

    async def _subscribe_range(self, sub: Subscription, start: bytes, end: bytes, *, delay: float) -> None:
        """Split region-space ``[start, end)`` by PD's regions and subscribe each from its range's ts."""
        try:
            if delay:
                await asyncio.sleep(delay)
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(self._retry_timeout),
                wait=wait_random_exponential(multiplier=0.05, max=self._backoff_max),
                retry=retry_if_exception_type((_Resplit, ConnectionError, PDRejectedError)),
                reraise=True,
            ):
                with attempt:
                    await self._subscribe_once(sub, start, end)
        except asyncio.CancelledError:
            raise
        except CdcflowError as exc:
            await self._fail(sub, exc)
        except (_Resplit, ConnectionError) as exc:
            await self._fail(
                sub,
                CdcflowError(
                    f"cannot subscribe {sub.span} after {self._retry_timeout:g}s: {exc}",
                    severity=Severity.WARN,
                    retryable=Retryable.RETRY,
                ),
            )

    async def _subscribe_once(self, sub: Subscription, start: bytes, end: bytes) -> None:
        key = start
        while not sub.closed:
            regions = await self.pd.regions_for(key, end)
            if not regions or not regions[0].contains(key):
                self.pd.regions.invalidate_range(key, end)
                raise _Resplit(f"no region holds key {key.hex()} yet")
            for region in regions:
                if region.start > key:
                    self.pd.regions.invalidate_range(key, end)
                    raise _Resplit(f"hole in PD's regions at {key.hex()}")
                lo, hi = clip(key, end, region)
                await self._subscribe_region(sub, region, lo, hi)
                key = hi
                if not key or (end and key >= end):
                    return

    async def _subscribe_region(self, sub: Subscription, region: RegionInfo, start: bytes, end: bytes) -> None:
        # One at a time per feed: two tasks (say, resubscribing the two halves of a merged
        # region) must not both register the same region, which a store refuses.
        async with sub.subscribing:
            await self._subscribe_region_locked(sub, region, start, end)

    async def _subscribe_region_locked(self, sub: Subscription, region: RegionInfo, start: bytes, end: bytes) -> None:
        old = sub.regions.get(region.id)
        if old is not None:
            # The region already serves another part of this span (regions merged into it).
            # A store takes one registration per region and request id, so the new one
            # covers both parts, from the older part's ts: nothing of either is lost.
            start, end = min(start, old.start), max_end(end, old.end)
            self._retire(old)
            await self._deregister(old)
        ts = sub.ranges.min_ts(start, end)
        address = await self.pd.store_address(region.leader_store_id)
        stream = await self._stream(address, sub.request_id)
        state = RegionState(
            sub=sub,
            region=region,
            start=start,
            end=end,
            checkpoint_ts=ts,
            stream=stream,
            matcher=Matcher(ts, self.memory),
            resolved_ts=ts,
            advanced_at=asyncio.get_running_loop().time(),
        )
        sub.regions[region.id] = state
        stream.add(state)
        req = cdcpb_pb2.ChangeDataRequest(
            header=self._header(),
            region_id=region.id,
            region_epoch=metapb_pb2.RegionEpoch(conf_ver=region.conf_ver, version=region.version),
            checkpoint_ts=ts,
            start_key=start,
            end_key=end,
            request_id=sub.request_id,
            extra_op=kvrpcpb_pb2.ReadOldValue,
            kv_api=KV_APIS[self.kv_api],
        )
        try:
            await stream.send(req)
        except ConnectionError:
            # The stream's breakage resubscribes every region on it, this one included.
            log.debug("region %d: stream to %s broke while subscribing", region.id, address)

    def _header(self) -> cdcpb_pb2.Header:
        return cdcpb_pb2.Header(cluster_id=self.pd.cluster_id, ticdc_version=_VERSION)

    async def _stream(self, address: str, request_id: int) -> StoreStream:
        async with self._stream_lock:
            v2 = address not in self.v1_stores
            key = (address, 0 if v2 else request_id)
            stream = self._streams.get(key)
            if stream is None or stream.broken:
                channel = self._channels.get(address)
                if channel is None:
                    channel = self._channels[address] = open_channel(address, self._tls)
                stream = self._streams[key] = StoreStream(self, address, channel, v2=v2)
            return stream

    def _retire(self, state: RegionState) -> None:
        state.retired = True
        state.matcher.close()
        state.stream.remove(state)
        if state.sub.regions.get(state.region_id) is state:
            del state.sub.regions[state.region_id]

    def _resubscribe(self, state: RegionState, *, delay: float = 0.0) -> None:
        """Retire ``state`` and subscribe its range again from PD's current regions."""
        self._retire(state)
        self.pd.regions.invalidate(state.region_id)
        self._spawn(state.sub, self._subscribe_range(state.sub, state.start, state.end, delay=delay))

    def _backoff(self, sub: Subscription) -> float | None:
        """The delay before the next retry of ``sub``, or None when it has failed for too long.

        Exponential with jitter in the number of failures since the span last
        made progress (a region INITIALIZED, or the frontier moved); a span
        that keeps failing for ``retry_timeout``
        seconds (and at least 10 times) gives up, so an unreachable store
        surfaces as a Warning instead of retrying silently forever.
        """
        now = asyncio.get_running_loop().time()
        if sub.failing_since is None:
            sub.failing_since = now
        sub.failures += 1
        if sub.failures >= 10 and now - sub.failing_since > self._retry_timeout:
            return None
        return min(float(self._backoff_max), 0.02 * 2.0 ** min(sub.failures, 16)) * random.uniform(0.5, 1.0)

    async def _retry_later(self, states: list[RegionState], *, at_least: float = 0.0) -> None:
        """Resubscribe ``states`` after a backoff (per subscription), or fail a subscription that keeps failing."""
        by_sub: dict[int, list[RegionState]] = {}
        for state in states:
            by_sub.setdefault(id(state.sub), []).append(state)
        for group in by_sub.values():
            sub = group[0].sub
            delay = self._backoff(sub)
            if delay is None:
                for state in group:
                    self._retire(state)
                stores = sorted({state.stream.address for state in group})
                await self._fail(
                    sub,
                    CdcflowError(
                        f"{sub.span}: TiKV store(s) {', '.join(stores)} kept failing for "
                        f"{self._retry_timeout:g}s ({sub.failures} attempts)",
                        detail={"stores": stores, "failures": sub.failures},
                        severity=Severity.WARN,
                        retryable=Retryable.RETRY,
                    ),
                )
                continue
            for state in group:
                self._resubscribe(state, delay=max(delay, at_least))

    # -- what the streams report ----------------------------------------------

    async def on_event(self, stream: StoreStream, handle: Any, event: cdcpb_pb2.Event) -> None:
        state: RegionState = handle
        if state.retired:
            return
        kind = event.WhichOneof("event")
        if kind == "entries":
            try:
                await self._on_entries(state, event.entries.entries)
            except UnmatchedCommitError as exc:
                log.warning("region %d: %s; resubscribing from %d", state.region_id, exc, state.resolved_ts)
                await self._deregister(state)
                self._resubscribe(state)
        elif kind == "error":
            await self._on_region_error(state, event.error)
        elif kind == "resolved_ts":
            await self.on_resolved(stream, state, event.resolved_ts)
        # admin and long_txn events carry nothing a feed needs.

    async def _on_entries(self, state: RegionState, rows: Any) -> None:
        matcher = state.matcher
        for row in rows:
            if state.retired:
                return  # retired while a change was being emitted: its range is resubscribed
            kind = row.type
            if kind == cdcpb_pb2.Event.INITIALIZED:
                state.initialized = True
                state.advanced_at = asyncio.get_running_loop().time()
                # A region subscribed successfully: progress, even while a long transaction's
                # lock holds the span's resolved ts (and so its frontier) still.
                state.sub.failures, state.sub.failing_since = 0, None
                matcher.initialized()
                for change in matcher.release():
                    await self._emit(state, change)
                    if _retired(state):
                        return
            elif kind == cdcpb_pb2.Event.COMMITTED:
                check_commit_ts(row)
                await self._deliver(state, matcher.committed(row))
            elif kind == cdcpb_pb2.Event.PREWRITE:
                for change in matcher.prewrite(row, state.initialized):
                    await self._deliver(state, change)
            elif kind == cdcpb_pb2.Event.COMMIT:
                check_commit_ts(row)
                await self._deliver(state, matcher.commit(row, state.initialized))
            elif kind == cdcpb_pb2.Event.ROLLBACK:
                matcher.rollback(row)

    async def _deliver(self, state: RegionState, change: Committed | None) -> None:
        """Emit ``change`` now once the region is INITIALIZED; before that, hold it.

        The incremental scan and the live stream run concurrently, so a live
        commit of a key may arrive before the scan's older commits of the same
        key (and TiKV scans a key's versions newest first). Until the scan is
        complete every change of the region is held, then released in
        commit-ts order (:meth:`Matcher.release`).
        """
        if change is None:
            return
        if state.initialized:
            await self._emit(state, change)
        else:
            self.incremental_scan_rows += 1
            state.matcher.hold(change)

    async def _emit(self, state: RegionState, change: Committed | None) -> None:
        sub = state.sub
        if change is None or sub.closed:
            return
        if change.commit_ts <= sub.emitted_resolved or not sub.span.contains(change.key):
            # At or below a resolved ts already yielded: delivered before (TiKV never sends
            # a new change there). Outside the span: older stores do not filter by range.
            return
        await sub.out.put(
            RawKVEvent(
                span=sub.span,
                key=change.key,
                value=change.value,
                old_value=change.old_value,
                start_ts=change.start_ts,
                commit_ts=change.commit_ts,
                delete=change.delete,
            )
        )

    async def on_resolved(self, stream: StoreStream, handle: Any, ts: int) -> None:
        state: RegionState = handle
        # A region's resolved ts counts only once its incremental scan is complete.
        if state.retired or not state.initialized or ts <= state.resolved_ts:
            return
        state.resolved_ts = ts
        state.advanced_at = asyncio.get_running_loop().time()
        state.resolve_backoff = 0.0
        sub = state.sub
        sub.ranges.forward(state.start, state.end, ts)
        frontier = sub.ranges.frontier
        if frontier > sub.emitted_resolved and not sub.closed:
            sub.emitted_resolved = frontier
            sub.failures, sub.failing_since = 0, None
            await sub.out.put(ResolvedEvent(sub.span, frontier))

    async def on_stream_broken(self, stream: StoreStream, error: BaseException, *, unimplemented: bool) -> None:
        if unimplemented:
            log.info("store %s has no EventFeedV2; falling back to EventFeed", stream.address)
            self.v1_stores.add(stream.address)
        for key, known in list(self._streams.items()):
            if known is stream:
                del self._streams[key]
        states = list(stream.handles.values())
        if unimplemented:
            for state in states:
                self._resubscribe(state)
        else:
            await self._retry_later(states)

    async def _deregister(self, state: RegionState) -> None:
        req = cdcpb_pb2.ChangeDataRequest(
            header=self._header(),
            region_id=state.region_id,
            request_id=state.request_id,
            deregister=cdcpb_pb2.ChangeDataRequest.Deregister(),
        )
        with contextlib.suppress(ConnectionError):
            await state.stream.send(req)

    async def _on_region_error(self, state: RegionState, error: cdcpb_pb2.Error) -> None:
        sub = state.sub
        region_id = state.region_id
        if error.HasField("not_leader"):
            leader = error.not_leader.leader
            self._retire(state)
            if leader.store_id:
                moved = self.pd.regions.update_leader(region_id, leader.store_id)
                region = moved or state.region.with_leader(leader.store_id)
                log.info("region %d: leader moved to store %d", region_id, leader.store_id)
                self._spawn(sub, self._subscribe_at(sub, region, state.start, state.end))
            else:
                self._resubscribe(state, delay=0.05)
        elif error.HasField("epoch_not_match") or error.HasField("region_not_found"):
            log.info("region %d: %s; reloading from PD", region_id, error_name(error))
            self._resubscribe(state)
        elif error.HasField("server_is_busy") or error.HasField("congested"):
            backoff_ms = error.server_is_busy.backoff_ms if error.HasField("server_is_busy") else 0
            log.info("region %d: %s; backing off", region_id, error_name(error))
            # The store's hint, but never longer than the retry timeout: a bogus hint must not stall the feed.
            await self._retry_later([state], at_least=min(backoff_ms / 1000, self._retry_timeout))
        elif error.HasField("duplicate_request"):
            await self._fail(
                sub,
                DuplicateRequestError(
                    f"store {state.stream.address} reports region {region_id} subscribed twice for {sub.span}"
                ),
            )
        elif error.HasField("compatibility"):
            required = error.compatibility.required_version
            await self._fail(
                sub,
                UnsupportedProtocolError(
                    f"TiKV store {state.stream.address} requires a change-data client version {required}",
                    detail={"store": state.stream.address, "required_version": required},
                ),
            )
        elif error.HasField("cluster_id_mismatch"):
            mismatch = error.cluster_id_mismatch
            await self._fail(
                sub,
                ClusterIDMismatchError(
                    f"TiKV store {state.stream.address} is in cluster {mismatch.current}, "
                    f"PD said {mismatch.request}: check the pd endpoints of the source",
                    detail={"current": mismatch.current, "request": mismatch.request},
                ),
            )
        else:
            log.warning("region %d: unknown region error %s; reloading from PD", region_id, error)
            await self._retry_later([state])

    # -- resolving the locks of lagging regions ---------------------------------------------

    async def _resolve_locks_loop(self, sub: Subscription) -> None:
        """Resolve the locks of ``sub``'s regions whose resolved ts stood still for the interval."""
        interval = self.resolve_lock_interval
        loop = asyncio.get_running_loop()
        while not sub.closed:
            await asyncio.sleep(min(1.0, interval / 4))
            for state in list(sub.regions.values()):
                now = loop.time()
                if state.retired or not state.initialized or sub.closed:
                    continue
                if now - state.advanced_at < interval or now < state.resolve_after:
                    continue
                await self._resolve_region_locks(state)

    async def _resolve_region_locks(self, state: RegionState) -> None:
        """One pass over ``state``'s range: resolve the decided locks below the current TSO."""
        loop = asyncio.get_running_loop()
        interval = self.resolve_lock_interval
        self.resolve_lock_passes += 1
        try:
            # Below the ts the region should resolve to (now), not below the checkpoint: every
            # lock that holds the region back is older than that.
            target = await self.pd.tso()
            lo, hi = self._raw_range(state)
            result = await self._locks.resolve_range(lo, hi, target, budget=self._resolve_lock_budget)
        except (CdcflowError, RetryError, grpc.aio.AioRpcError, ConnectionError) as exc:
            self.resolve_lock_failures += 1
            state.resolve_backoff = min(max(2 * state.resolve_backoff, 0.1), interval)
            state.resolve_after = loop.time() + state.resolve_backoff
            log.warning(
                "region %d: resolving locks below its resolved ts %d failed (%s); retrying in %.1fs",
                state.region_id,
                state.resolved_ts,
                exc,
                state.resolve_backoff,
            )
            return
        state.resolve_backoff = 0.0
        # Truncated at the budget: go on at the next tick. Otherwise give TiKV an interval to move
        # the resolved ts past what was resolved (or a live transaction time to finish).
        state.resolve_after = loop.time() + (0.0 if result.truncated else interval)
        if result.locks:
            log.info(
                "region %d: resolved ts %d stood still for %.0fs; %d lock(s) below %d, %d of live transactions left",
                state.region_id,
                state.resolved_ts,
                loop.time() - state.advanced_at,
                result.locks,
                target,
                result.alive,
            )

    def _raw_range(self, state: RegionState) -> tuple[bytes, bytes]:
        """``state``'s region-space range as the raw keys the KV service takes (empty end: +infinity)."""
        if not self.encoded_keys:
            return state.start, state.end
        lo = decode_bytes(state.start)[0] if state.start else b""
        hi = decode_bytes(state.end)[0] if state.end else b""
        return lo, hi

    async def _subscribe_at(self, sub: Subscription, region: RegionInfo, start: bytes, end: bytes) -> None:
        try:
            await self._subscribe_region(sub, region, start, end)
        except (PDRejectedError, ConnectionError):
            # The hinted store is unknown or gone: fall back to PD's view of the range.
            self._spawn(sub, self._subscribe_range(sub, start, end, delay=0.05))
        except CdcflowError as exc:
            await self._fail(sub, exc)
