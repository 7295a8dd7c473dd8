"""The EventFeed hub: region subscriptions, routing of changes, resolved ts.

Every open ``EventFeed``/``EventFeedV2`` stream is a :class:`FeedSession` bound
to one store. A registered region request becomes a :class:`Subscription`.
The hub observes the MVCC store and the region map (under the cluster lock)
and turns what happens into ``cdcpb`` messages queued on the sessions:

* register: checks (cluster id, injected busy, region exists, leader here,
  epoch, key range, duplicates on a non-multiplexed stream), then the
  incremental scan from ``checkpoint_ts`` — COMMITTED for writes above it,
  PREWRITE for current locks — then INITIALIZED; live changes follow (with
  ``scan_delay`` > 0 the scan is delivered late, so live rows overtake it);
* live: PREWRITE (value, and old value if ``ReadOldValue``), COMMIT (key,
  op and timestamps only — the value is the PREWRITE's) and ROLLBACK rows,
  in Events of about 32 KiB and messages of at most 64 Events, as TiKV sends;
* split / merge / leader move: EpochNotMatch / RegionNotFound / NotLeader to
  the subscriptions of the changed regions, which are then dropped;
* resolved ts: per region min(fresh TSO, oldest lock start ts in the region),
  never lower than a value already reported, only for initialized regions;
  batched per ``request_id`` on multiplexed streams, per stream otherwise
  (request id 0, as TiKV does without ``stream-multiplexing``).

Queues are filled with ``loop.call_soon_threadsafe`` while the cluster lock is
held, so every session receives messages in the order things happened.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cdcflow.plugins.sources.playground._keys import encode_key
from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.mvcc import Change, ChangeKind, Op
from cdcflow.plugins.sources.playground.regions import Region, RegionEvent, RegionEventKind
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, errorpb_pb2, kvrpcpb_pb2, metapb_pb2

__all__ = ["FeedHub", "FeedSession", "Subscription", "region_to_pb"]

#: Rows per Event in incremental scans (TiKV batches scans too).
SCAN_BATCH = 256
#: As TiKV's CDC endpoint: an Event carries at most about 32 KiB of rows, a
#: ChangeDataEvent at most 64 Events, so a huge transaction reaches a client as
#: many bounded messages (what a client buffers per message stays small).
EVENT_MAX_BYTES = 32 * 1024
MESSAGE_MAX_EVENTS = 64
#: What a row costs in an Event beyond its key and values (timestamps, tags).
_ROW_OVERHEAD = 32

_LOG_TYPE = {
    ChangeKind.PREWRITE: cdcpb_pb2.Event.PREWRITE,
    ChangeKind.COMMIT: cdcpb_pb2.Event.COMMIT,
    ChangeKind.ROLLBACK: cdcpb_pb2.Event.ROLLBACK,
}
_OP = {Op.PUT: cdcpb_pb2.Event.Row.PUT, Op.DELETE: cdcpb_pb2.Event.Row.DELETE}
_session_ids = itertools.count(1)


def region_to_pb(region: Region) -> metapb_pb2.Region:
    return metapb_pb2.Region(
        id=region.id,
        start_key=region.start,
        end_key=region.end,
        region_epoch=metapb_pb2.RegionEpoch(conf_ver=region.conf_ver, version=region.version),
        peers=[metapb_pb2.Peer(id=peer, store_id=store) for store, peer in region.peers],
    )


def _peer_pb(region: Region) -> metapb_pb2.Peer:
    peer_id, store_id = region.leader_peer
    return metapb_pb2.Peer(id=peer_id, store_id=store_id)


@dataclass(eq=False)
class FeedSession:
    """One EventFeed stream on one store. ``queue`` carries messages; None ends the stream."""

    store_id: int
    multiplexing: bool
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[cdcpb_pb2.ChangeDataEvent | None] = field(default_factory=asyncio.Queue)
    id: int = field(default_factory=lambda: next(_session_ids))
    reset: bool = False

    def send(self, message: cdcpb_pb2.ChangeDataEvent | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, message)


@dataclass(eq=False)
class Subscription:
    session: FeedSession
    region_id: int
    request_id: int
    start: bytes
    end: bytes
    checkpoint_ts: int
    old_value: bool
    resolved_ts: int = 0
    initialized: bool = False

    def covers(self, enc_key: bytes) -> bool:
        return self.start <= enc_key and (not self.end or enc_key < self.end)


class FeedHub:
    """See the module docstring. All public methods are thread-safe."""

    def __init__(self, cluster: Cluster, *, scan_delay: float = 0.0) -> None:
        self.cluster = cluster
        #: > 0: deliver incremental scans that many seconds late, after live rows (see _incremental_scan).
        self.scan_delay = scan_delay
        self._subs: dict[int, list[Subscription]] = defaultdict(list)  # region id -> subscriptions
        self._sessions: set[FeedSession] = set()
        self._busy: dict[int, list[str]] = defaultdict(list)  # store id -> injected errors
        cluster.mvcc.subscribe(self._on_changes)
        cluster.regions.subscribe(self._on_region_event)

    # -- sessions ------------------------------------------------------------------------------

    def open_session(self, store_id: int, multiplexing: bool, loop: asyncio.AbstractEventLoop) -> FeedSession:
        session = FeedSession(store_id, multiplexing, loop)
        with self.cluster.lock:
            self._sessions.add(session)
        return session

    def close_session(self, session: FeedSession) -> None:
        with self.cluster.lock:
            self._sessions.discard(session)
            for region_id in list(self._subs):
                self._subs[region_id] = [s for s in self._subs[region_id] if s.session is not session]

    def reset_store(self, store_id: int) -> int:
        """Break every stream of ``store_id`` (they fail with UNAVAILABLE); return how many."""
        with self.cluster.lock:
            sessions = [s for s in self._sessions if s.store_id == store_id]
            for session in sessions:
                session.reset = True
                session.send(None)
            return len(sessions)

    def inject_busy(self, store_id: int, count: int = 1, *, congested: bool = False) -> None:
        """Answer the next ``count`` registrations on ``store_id`` with ServerIsBusy (or Congested)."""
        with self.cluster.lock:
            self._busy[store_id].extend(["congested" if congested else "busy"] * count)

    def subscriptions(self) -> list[Subscription]:
        with self.cluster.lock:
            return [s for subs in self._subs.values() for s in subs]

    # -- requests ------------------------------------------------------------------------------

    def handle_request(self, session: FeedSession, request: cdcpb_pb2.ChangeDataRequest) -> None:
        """Register or deregister as ``request`` says; answers go to ``session``."""
        with self.cluster.lock:
            if request.WhichOneof("request") == "deregister":
                self._deregister(session, request)
            else:
                self._register(session, request)

    def _deregister(self, session: FeedSession, request: cdcpb_pb2.ChangeDataRequest) -> None:
        for region_id, subs in self._subs.items():
            if request.region_id and region_id != request.region_id:
                continue
            self._subs[region_id] = [
                s for s in subs if not (s.session is session and s.request_id == request.request_id)
            ]

    def _register(self, session: FeedSession, request: cdcpb_pb2.ChangeDataRequest) -> None:
        error = self._check(session, request)
        if error is not None:
            self._send_error(session, request.region_id, request.request_id, error)
            return
        region = self.cluster.regions.by_id(request.region_id)
        assert region is not None
        sub = Subscription(
            session,
            region.id,
            request.request_id,
            max(request.start_key, region.start),
            request.end_key,
            request.checkpoint_ts,
            request.extra_op == kvrpcpb_pb2.ReadOldValue,
        )
        self._subs[region.id].append(sub)
        self._incremental_scan(sub)

    def _check(self, session: FeedSession, request: cdcpb_pb2.ChangeDataRequest) -> cdcpb_pb2.Error | None:
        cluster_id = self.cluster.cluster_id
        if request.header.cluster_id != cluster_id:
            mismatch = cdcpb_pb2.ClusterIDMismatch(current=cluster_id, request=request.header.cluster_id)
            return cdcpb_pb2.Error(cluster_id_mismatch=mismatch)
        busy = self._busy[session.store_id]
        if busy:
            if busy.pop(0) == "congested":
                return cdcpb_pb2.Error(congested=cdcpb_pb2.Congested(region_id=request.region_id))
            return cdcpb_pb2.Error(server_is_busy=errorpb_pb2.ServerIsBusy(reason="injected", backoff_ms=20))
        region = self.cluster.regions.by_id(request.region_id)
        if region is None:
            return cdcpb_pb2.Error(region_not_found=errorpb_pb2.RegionNotFound(region_id=request.region_id))
        if region.leader_store != session.store_id:
            return cdcpb_pb2.Error(not_leader=errorpb_pb2.NotLeader(region_id=region.id, leader=_peer_pb(region)))
        epoch = request.region_epoch
        in_range = region.contains(request.start_key) and (
            not region.end or (request.end_key and request.end_key <= region.end)
        )
        if epoch.version != region.version or epoch.conf_ver != region.conf_ver or not in_range:
            current = self.cluster.regions.overlapping(request.start_key, request.end_key) or [region]
            return cdcpb_pb2.Error(
                epoch_not_match=errorpb_pb2.EpochNotMatch(current_regions=map(region_to_pb, current))
            )
        if not session.multiplexing and any(s.session is session for s in self._subs[region.id]):
            return cdcpb_pb2.Error(duplicate_request=cdcpb_pb2.DuplicateRequest(region_id=region.id))
        return None

    def _incremental_scan(self, sub: Subscription) -> None:
        committed, locks = self.cluster.mvcc.feed_scan(sub.start, sub.end, sub.checkpoint_ts)
        rows = [self._row(c, sub, cdcpb_pb2.Event.COMMITTED) for c in committed]
        rows += [self._row(c, sub, cdcpb_pb2.Event.PREWRITE) for c in locks]
        batches = [rows[i : i + SCAN_BATCH] for i in range(0, len(rows), SCAN_BATCH)]
        if self.scan_delay <= 0:
            self._finish_scan(sub, batches)
            return
        # As in TiKV, the scan (of the snapshot taken just now) and live traffic run
        # concurrently: live rows registered from now on may overtake the scan's rows.
        loop = sub.session.loop
        loop.call_soon_threadsafe(lambda: loop.create_task(self._deliver_scan_later(sub, batches)))

    async def _deliver_scan_later(self, sub: Subscription, batches: list[list[cdcpb_pb2.Event.Row]]) -> None:
        await asyncio.sleep(self.scan_delay)
        with self.cluster.lock:
            if sub in self._subs.get(sub.region_id, ()):
                self._finish_scan(sub, batches)

    def _finish_scan(self, sub: Subscription, batches: list[list[cdcpb_pb2.Event.Row]]) -> None:
        for batch in batches:
            self._send_rows(sub, batch)
        self._send_rows(sub, [cdcpb_pb2.Event.Row(type=cdcpb_pb2.Event.INITIALIZED)])
        sub.initialized = True
        sub.resolved_ts = sub.checkpoint_ts

    # -- live changes ----------------------------------------------------------------------------

    def _on_changes(self, changes: Sequence[Change]) -> None:
        batches: dict[int, tuple[Subscription, list[cdcpb_pb2.Event.Row]]] = {}
        for change in changes:
            enc = encode_key(change.key)
            region = self.cluster.regions.locate(enc)
            for sub in self._subs.get(region.id, ()):
                if sub.covers(enc):
                    batches.setdefault(id(sub), (sub, []))[1].append(self._row(change, sub, _LOG_TYPE[change.kind]))
        for sub, rows in batches.values():
            self._send_rows(sub, rows)

    @staticmethod
    def _row(change: Change, sub: Subscription, log_type: int) -> cdcpb_pb2.Event.Row:
        # A live COMMIT carries no value and no old value (as TiKV's, outside 1PC):
        # the client takes both from the matching PREWRITE.
        bare = log_type == cdcpb_pb2.Event.COMMIT
        return cdcpb_pb2.Event.Row(
            start_ts=change.start_ts,
            commit_ts=change.commit_ts,
            type=log_type,  # type: ignore[arg-type]
            op_type=_OP[change.op],
            key=change.key,
            value=b"" if bare else change.value,
            old_value=change.old_value if sub.old_value and not bare else b"",
        )

    def _send_rows(self, sub: Subscription, rows: Iterable[cdcpb_pb2.Event.Row]) -> None:
        events: list[cdcpb_pb2.Event] = []
        batch: list[cdcpb_pb2.Event.Row] = []
        size = 0
        for row in rows:
            batch.append(row)
            size += _ROW_OVERHEAD + len(row.key) + len(row.value) + len(row.old_value)
            if size >= EVENT_MAX_BYTES:
                events.append(self._event(sub, batch))
                batch, size = [], 0
                if len(events) == MESSAGE_MAX_EVENTS:
                    sub.session.send(cdcpb_pb2.ChangeDataEvent(events=events))
                    events = []
        if batch:
            events.append(self._event(sub, batch))
        if events:
            sub.session.send(cdcpb_pb2.ChangeDataEvent(events=events))

    @staticmethod
    def _event(sub: Subscription, rows: list[cdcpb_pb2.Event.Row]) -> cdcpb_pb2.Event:
        return cdcpb_pb2.Event(
            region_id=sub.region_id,
            request_id=sub.request_id,
            entries=cdcpb_pb2.Event.Entries(entries=rows),
        )

    def _send_error(self, session: FeedSession, region_id: int, request_id: int, error: cdcpb_pb2.Error) -> None:
        event = cdcpb_pb2.Event(region_id=region_id, request_id=request_id, error=error)
        session.send(cdcpb_pb2.ChangeDataEvent(events=[event]))

    # -- region changes -------------------------------------------------------------------------

    def _on_region_event(self, event: RegionEvent) -> None:
        for old in event.old:
            subs = self._subs.pop(old.id, [])
            for sub in subs:
                self._send_error(sub.session, old.id, sub.request_id, self._region_error(event, old))

    def _region_error(self, event: RegionEvent, old: Region) -> cdcpb_pb2.Error:
        if event.kind is RegionEventKind.LEADER:
            new = event.new[0]
            return cdcpb_pb2.Error(not_leader=errorpb_pb2.NotLeader(region_id=new.id, leader=_peer_pb(new)))
        if event.kind is RegionEventKind.MERGE and old.id not in {r.id for r in event.new}:
            return cdcpb_pb2.Error(region_not_found=errorpb_pb2.RegionNotFound(region_id=old.id))
        current = [region_to_pb(r) for r in event.new]
        return cdcpb_pb2.Error(epoch_not_match=errorpb_pb2.EpochNotMatch(current_regions=current))

    # -- resolved ts -------------------------------------------------------------------------------

    def advance_resolved_ts(self) -> None:
        """Send every session the resolved ts of its initialized regions (one tick)."""
        with self.cluster.lock:
            now = self.cluster.oracle.next()
            min_lock: dict[int, int] = {}
            for session in self._sessions:
                groups: dict[tuple[int, int], list[int]] = defaultdict(list)
                for region_id, subs in self._subs.items():
                    for sub in subs:
                        if sub.session is not session or not sub.initialized:
                            continue
                        if region_id not in min_lock:
                            min_lock[region_id] = self._region_resolved(region_id, now)
                        sub.resolved_ts = max(sub.resolved_ts, min_lock[region_id])
                        request_id = sub.request_id if session.multiplexing else 0
                        groups[(request_id, sub.resolved_ts)].append(region_id)
                for (request_id, ts), regions in groups.items():
                    resolved = cdcpb_pb2.ResolvedTs(regions=regions, ts=ts, request_id=request_id)
                    session.send(cdcpb_pb2.ChangeDataEvent(resolved_ts=resolved))

    def _region_resolved(self, region_id: int, now: int) -> int:
        region = self.cluster.regions.by_id(region_id)
        assert region is not None
        oldest = self.cluster.mvcc.min_lock_ts(region.start, region.end)
        return now if oldest is None else min(now, oldest)
