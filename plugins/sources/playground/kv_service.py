"""``tikvpb.Tikv`` served by one playground store: the transactional reads of a snapshot.

``KvScan`` reads the MVCC store at the request's ``version``, bounded by the
region the request names; a key locked by a transaction with start ts at or
below that version comes back as ``KvPair.error.locked`` (LockInfo), which a
reader resolves before reading again. ``KvCheckTxnStatus`` and
``KvResolveLock`` are the two steps of that resolution (Percolator, as TiKV
serves it: see :mod:`.mvcc`).

Every request is checked against the region map as a TiKV store checks it:
the peer's store, the region id (RegionNotFound), the leader (NotLeader, with
the leader's peer), the epoch version (EpochNotMatch, with the current
regions) and the keys (KeyNotInRegion). :class:`KvFaults` answers the next
requests of a store with a region error on demand.
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

__all__ = ["KV_FAULTS", "KvFaults", "KvService", "lock_info"]

#: The region errors :meth:`KvFaults.inject` knows.
KV_FAULTS = ("not_leader", "epoch_not_match", "region_not_found", "server_is_busy")

_ACTION = {
    "": kvrpcpb_pb2.NoAction,
    "ttl_expired": kvrpcpb_pb2.TTLExpireRollback,
    "lock_not_exist": kvrpcpb_pb2.LockNotExistRollback,
}


class KvFaults:
    """Region errors to answer the next KV requests of a store with (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[str]] = defaultdict(list)
        #: Requests answered with an injected error, per kind.
        self.served: dict[str, int] = defaultdict(int)

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
    """The Tikv servicer of store ``store_id`` (scan, check txn status, resolve lock)."""

    def __init__(self, cluster: Cluster, store_id: int, faults: KvFaults) -> None:
        self.cluster = cluster
        self.store_id = store_id
        self.faults = faults

    async def KvScan(
        self, request: kvrpcpb_pb2.ScanRequest, context: grpc.aio.ServicerContext
    ) -> kvrpcpb_pb2.ScanResponse:
        if request.reverse:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the playground does not scan in reverse")
        enc_start = encode_key(request.start_key)
        enc_end = encode_key(request.end_key) if request.end_key else b""
        with self.cluster.lock:
            checked = self._check(request.context, enc_start)
            if checked.error is not None:
                return kvrpcpb_pb2.ScanResponse(region_error=checked.error)
            region = checked.region
            assert region is not None
            # A store reads its region only: the client goes on from the region's end.
            if region.end and (not enc_end or enc_end > region.end):
                enc_end = region.end
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
            if checked.error is not None:
                return kvrpcpb_pb2.CheckTxnStatusResponse(region_error=checked.error)
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
            if checked.error is not None:
                return kvrpcpb_pb2.ResolveLockResponse(region_error=checked.error)
            region = checked.region
            assert region is not None
            self.cluster.mvcc.resolve(
                request.start_version, request.commit_version, region.start, region.end, list(request.keys)
            )
        return kvrpcpb_pb2.ResolveLockResponse()

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
