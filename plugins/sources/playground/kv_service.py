"""``tikvpb.Tikv`` served by one playground store: the transactional reads of a snapshot.

``KvScan`` reads the MVCC store at the request's ``version``, bounded by the
region the request names; a key locked by a transaction with start ts at or
below that version comes back as ``KvPair.error.locked`` (LockInfo), which a
reader resolves before reading again. ``KvCheckTxnStatus`` and
``KvResolveLock`` are the two steps of that resolution (Percolator, as TiKV
serves it: see :mod:`.mvcc`). ``KvScanLock`` lists the locks of the region
in ``[start_key, end_key)`` with start ts at or below ``max_version`` (up to
``limit``), which a change-data client whose region's resolved ts lags behind
resolves the same way (a lock holds the region's resolved ts below its start
ts until it is resolved: :mod:`.feed`).

Every request is checked against the region map as a TiKV store checks it:
the peer's store, the region id (RegionNotFound), the leader (NotLeader, with
the leader's peer), the epoch version (EpochNotMatch, with the current
regions) and the keys (KeyNotInRegion). :class:`KvFaults` answers the next
requests of a store with a region error on demand, and can churn the regions
under the value scans (:meth:`KvFaults.churn`: a split or a leader move just
before a scan is served, so the scan itself meets the region error it causes).
:class:`KvStats` counts what the stores answered: requests per method, region
errors per kind (natural or injected), status checks per locked transaction.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass

import grpc

from cdcflow.plugins.sources.playground._keys import encode_key
from cdcflow.plugins.sources.playground.cluster import Cluster
from cdcflow.plugins.sources.playground.errors import PlaygroundError
from cdcflow.plugins.sources.playground.feed import region_to_pb
from cdcflow.plugins.sources.playground.mvcc import Lock, Op
from cdcflow.plugins.sources.playground.regions import Region
from cdcflow.plugins.sources.tikv.kvproto import errorpb_pb2, kvrpcpb_pb2, metapb_pb2, tikvpb_pb2_grpc

__all__ = ["KV_FAULTS", "KvFaults", "KvService", "KvStats", "lock_info"]

#: The region errors :meth:`KvFaults.inject` knows.
KV_FAULTS = ("not_leader", "epoch_not_match", "region_not_found", "server_is_busy")

_ACTION = {
    "": kvrpcpb_pb2.NoAction,
    "ttl_expired": kvrpcpb_pb2.TTLExpireRollback,
    "lock_not_exist": kvrpcpb_pb2.LockNotExistRollback,
}


class KvStats:
    """What the stores' ``tikvpb.Tikv`` services answered (thread-safe counters)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[str, int] = defaultdict(int)
        self._region_errors: dict[str, int] = defaultdict(int)
        self._txn_checks: dict[int, int] = defaultdict(int)

    def count(self, method: str, region_error: errorpb_pb2.Error | None = None) -> None:
        with self._lock:
            self._requests[method] += 1
            if region_error is not None:
                self._region_errors[_region_error_kind(region_error)] += 1

    def count_txn_check(self, lock_ts: int) -> None:
        with self._lock:
            self._txn_checks[lock_ts] += 1

    def requests(self) -> dict[str, int]:
        """Requests served per method (``KvScan``, ``KvScanLock``, ``KvCheckTxnStatus``, ``KvResolveLock``)."""
        with self._lock:
            return dict(self._requests)

    def region_errors(self) -> dict[str, int]:
        """Region errors answered per kind (``not_leader``, ``epoch_not_match``, …), natural or injected."""
        with self._lock:
            return dict(self._region_errors)

    def txn_checks(self, lock_ts: int) -> int:
        """``KvCheckTxnStatus`` requests about the transaction with start ts ``lock_ts``."""
        with self._lock:
            return self._txn_checks.get(lock_ts, 0)


def _region_error_kind(error: errorpb_pb2.Error) -> str:
    for kind in ("not_leader", "region_not_found", "key_not_in_region", "epoch_not_match", "server_is_busy"):
        if error.HasField(kind):
            return kind
    return "store_not_match" if error.HasField("store_not_match") else "other"


class KvFaults:
    """Region errors to answer the next KV requests of a store with, and region churn
    under the value scans (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[str]] = defaultdict(list)
        #: Requests answered with an injected error, per kind.
        self.served: dict[str, int] = defaultdict(int)
        self._churn_every = 0
        self._churn_left = 0
        self._scans = 0
        self._changes = 0
        #: Churn done so far: ``split`` and ``leader`` (moves), each before a value scan.
        self.churned: dict[str, int] = defaultdict(int)

    def churn(self, every: int, times: int) -> None:
        """From now on, before every ``every``-th KvScan that reads values (key-only scans
        are not counted), split the region it reads or move its leader, alternately, until
        ``times`` changes were made (``times=0``: stop churning)."""
        if every < 1:
            raise PlaygroundError(f"every must be at least 1, got {every}")
        if times < 0:
            raise PlaygroundError(f"times must be at least 0, got {times}")
        with self._lock:
            self._churn_every, self._churn_left, self._scans, self._changes = every, times, 0, 0

    def churn_now(self) -> str | None:
        """For a value scan about to be served: the change to make first (``split`` or
        ``leader``), or None."""
        with self._lock:
            if not self._churn_left:
                return None
            self._scans += 1
            if self._scans % self._churn_every:
                return None
            self._churn_left -= 1
            self._changes += 1
            return "split" if self._changes % 2 else "leader"

    def churned_one(self, kind: str) -> None:
        with self._lock:
            self.churned[kind] += 1

    def inject(self, store_id: int, kind: str, count: int = 1) -> None:
        if kind not in KV_FAULTS:
            raise PlaygroundError(f"unknown KV region error {kind!r}; choose one of {', '.join(KV_FAULTS)}")
        if count < 1:
            raise PlaygroundError(f"count must be at least 1, got {count}")
        with self._lock:
            self._pending[store_id].extend([kind] * count)

    def clear(self) -> None:
        """Drop every fault not served yet."""
        with self._lock:
            self._pending.clear()

    def take(self, store_id: int) -> str | None:
        with self._lock:
            pending = self._pending.get(store_id)
            if not pending:
                return None
            kind = pending.pop(0)
            self.served[kind] += 1
            return kind


def lock_info(key: bytes, lock: Lock) -> kvrpcpb_pb2.LockInfo:
    return kvrpcpb_pb2.LockInfo(
        primary_lock=lock.primary,
        lock_version=lock.start_ts,
        key=key,
        lock_ttl=lock.ttl_ms,
        lock_type=kvrpcpb_pb2.Put if lock.op is Op.PUT else kvrpcpb_pb2.Del,
    )


@dataclass(frozen=True)
class _Checked:
    region: Region | None
    error: errorpb_pb2.Error | None


class KvService(tikvpb_pb2_grpc.TikvServicer):
    """The Tikv servicer of store ``store_id`` (scan, scan locks, check txn status, resolve lock)."""

    def __init__(self, cluster: Cluster, store_id: int, faults: KvFaults, stats: KvStats | None = None) -> None:
        self.cluster = cluster
        self.store_id = store_id
        self.faults = faults
        self.stats = stats if stats is not None else KvStats()

    async def KvScan(
        self, request: kvrpcpb_pb2.ScanRequest, context: grpc.aio.ServicerContext
    ) -> kvrpcpb_pb2.ScanResponse:
        if request.reverse:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the playground does not scan in reverse")
        enc_start = encode_key(request.start_key)
        enc_end = encode_key(request.end_key) if request.end_key else b""
        with self.cluster.lock:
            if not request.key_only:
                self._churn(enc_start)
            error, enc_end = self._range_here("KvScan", request.context, enc_start, enc_end)
            if error is not None:
                return kvrpcpb_pb2.ScanResponse(region_error=error)
            entries = self.cluster.mvcc.read_range(
                enc_start, enc_end, request.version, request.limit, key_only=request.key_only
            )
        pairs = []
        for key, value, lock in entries:
            if lock is not None:
                pairs.append(kvrpcpb_pb2.KvPair(key=key, error=kvrpcpb_pb2.KeyError(locked=lock_info(key, lock))))
            else:
                pairs.append(kvrpcpb_pb2.KvPair(key=key, value=value))
        return kvrpcpb_pb2.ScanResponse(pairs=pairs)

    async def KvCheckTxnStatus(
        self, request: kvrpcpb_pb2.CheckTxnStatusRequest, context: grpc.aio.ServicerContext
    ) -> kvrpcpb_pb2.CheckTxnStatusResponse:
        with self.cluster.lock:
            checked = self._check(request.context, encode_key(request.primary_key))
            self.stats.count("KvCheckTxnStatus", checked.error)
            if checked.error is not None:
                return kvrpcpb_pb2.CheckTxnStatusResponse(region_error=checked.error)
            self.stats.count_txn_check(request.lock_ts)
            status = self.cluster.mvcc.check_txn_status(
                request.primary_key,
                request.lock_ts,
                request.current_ts,
                rollback_if_not_exist=request.rollback_if_not_exist,
            )
        response = kvrpcpb_pb2.CheckTxnStatusResponse(
            lock_ttl=status.lock_ttl, commit_version=status.commit_ts, action=_ACTION[status.action]
        )
        if status.lock is not None:
            response.lock_info.CopyFrom(lock_info(request.primary_key, status.lock))
        return response

    async def KvResolveLock(
        self, request: kvrpcpb_pb2.ResolveLockRequest, context: grpc.aio.ServicerContext
    ) -> kvrpcpb_pb2.ResolveLockResponse:
        with self.cluster.lock:
            first = encode_key(request.keys[0]) if request.keys else None
            checked = self._check(request.context, first)
            self.stats.count("KvResolveLock", checked.error)
            if checked.error is not None:
                return kvrpcpb_pb2.ResolveLockResponse(region_error=checked.error)
            region = checked.region
            assert region is not None
            self.cluster.mvcc.resolve(
                request.start_version, request.commit_version, region.start, region.end, list(request.keys)
            )
        return kvrpcpb_pb2.ResolveLockResponse()

    async def KvScanLock(
        self, request: kvrpcpb_pb2.ScanLockRequest, context: grpc.aio.ServicerContext
    ) -> kvrpcpb_pb2.ScanLockResponse:
        enc_start = encode_key(request.start_key)
        enc_end = encode_key(request.end_key) if request.end_key else b""
        with self.cluster.lock:
            error, enc_end = self._range_here("KvScanLock", request.context, enc_start, enc_end)
            if error is not None:
                return kvrpcpb_pb2.ScanLockResponse(region_error=error)
            locks = self.cluster.mvcc.scan_locks(enc_start, enc_end, request.max_version, request.limit)
        return kvrpcpb_pb2.ScanLockResponse(locks=[lock_info(key, lock) for key, lock in locks])

    def _churn(self, enc_start: bytes) -> None:
        """Split the region holding ``enc_start`` in the middle of its keys from there, or move
        its leader to the next store, when :meth:`KvFaults.churn_now` says so (under the
        cluster lock: the scan about to be checked meets the change)."""
        kind = self.faults.churn_now()
        if kind is None:
            return
        regions = self.cluster.regions
        region = regions.locate(enc_start)
        if kind == "split":
            middle = self.cluster.mvcc.middle_key(enc_start, region.end)
            if middle is not None and middle > region.start:
                regions.split(region.id, middle)
                self.faults.churned_one("split")
                return
            # Too few keys left to split: move the leader instead.
        stores = list(self.cluster.store_ids())
        regions.transfer_leader(region.id, stores[(stores.index(region.leader_store) + 1) % len(stores)])
        self.faults.churned_one("leader")

    def _range_here(
        self, method: str, ctx: kvrpcpb_pb2.Context, enc_start: bytes, enc_end: bytes
    ) -> tuple[errorpb_pb2.Error | None, bytes]:
        """For a scan of ``method`` from ``enc_start``: (the region error, or None, and the
        end this store answers up to). A store reads its region only: the client goes on
        from the region's end. Counted in :attr:`stats`."""
        checked = self._check(ctx, enc_start)
        self.stats.count(method, checked.error)
        if checked.error is not None:
            return checked.error, enc_end
        region = checked.region
        assert region is not None
        if region.end and (not enc_end or enc_end > region.end):
            enc_end = region.end
        return None, enc_end

    def _check(self, ctx: kvrpcpb_pb2.Context, enc_key: bytes | None) -> _Checked:
        """The region of ``ctx`` if this store may serve it for ``enc_key``, else the region error."""
        fault = self.faults.take(self.store_id)
        region = self.cluster.regions.by_id(ctx.region_id)
        if fault == "server_is_busy":
            return _Checked(None, errorpb_pb2.Error(server_is_busy=errorpb_pb2.ServerIsBusy(reason="injected")))
        if ctx.peer.store_id and ctx.peer.store_id != self.store_id:
            mismatch = errorpb_pb2.StoreNotMatch(request_store_id=ctx.peer.store_id, actual_store_id=self.store_id)
            return _Checked(None, errorpb_pb2.Error(message="store not match", store_not_match=mismatch))
        if region is None or fault == "region_not_found":
            not_found = errorpb_pb2.RegionNotFound(region_id=ctx.region_id)
            return _Checked(None, errorpb_pb2.Error(message="region not found", region_not_found=not_found))
        if region.leader_store != self.store_id or fault == "not_leader":
            # An injected NotLeader names no leader (an election in progress): the client asks PD.
            leader = _leader_peer(region) if fault != "not_leader" else metapb_pb2.Peer()
            not_leader = errorpb_pb2.NotLeader(region_id=region.id, leader=leader)
            return _Checked(None, errorpb_pb2.Error(message="not leader", not_leader=not_leader))
        if ctx.region_epoch.version != region.version or fault == "epoch_not_match":
            current = [region, *self._neighbours(region)]
            epoch = errorpb_pb2.EpochNotMatch(current_regions=[region_to_pb(r) for r in current])
            return _Checked(None, errorpb_pb2.Error(message="epoch not match", epoch_not_match=epoch))
        if enc_key is not None and not region.contains(enc_key):
            not_in = errorpb_pb2.KeyNotInRegion(
                key=enc_key, region_id=region.id, start_key=region.start, end_key=region.end
            )
            return _Checked(None, errorpb_pb2.Error(message="key not in region", key_not_in_region=not_in))
        return _Checked(region, None)

    def _neighbours(self, region: Region) -> list[Region]:
        out = []
        before = self.cluster.regions.previous(region.start) if region.start else None
        if before is not None:
            out.append(before)
        if region.end:
            out.append(self.cluster.regions.locate(region.end))
        return out


def _leader_peer(region: Region) -> metapb_pb2.Peer:
    peer_id, store_id = region.leader_peer
    return metapb_pb2.Peer(id=peer_id, store_id=store_id)
