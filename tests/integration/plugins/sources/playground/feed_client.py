"""A small EventFeed client for the tests, on the generated gRPC stubs (the real protocol)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, cdcpb_pb2_grpc, kvrpcpb_pb2, pdpb_pb2, pdpb_pb2_grpc
from cdcflow.plugins.sources.tikv.tidb.keys import encode_bytes

Event = cdcpb_pb2.Event


class PD:
    def __init__(self, pg: Playground) -> None:
        self.channel = grpc.insecure_channel(pg.pd_address)
        self.stub = pdpb_pb2_grpc.PDStub(self.channel)
        self.header = pdpb_pb2.RequestHeader(cluster_id=pg.cluster_id)

    def region(self, raw_key: bytes) -> Any:
        return self.stub.GetRegion(pdpb_pb2.GetRegionRequest(header=self.header, region_key=encode_bytes(raw_key)))

    def store_address(self, store_id: int) -> str:
        stores = self.stub.GetAllStores(pdpb_pb2.GetAllStoresRequest(header=self.header)).stores
        return next(s.address for s in stores if s.id == store_id)

    def close(self) -> None:
        self.channel.close()


class Feed:
    """One EventFeed stream: send requests, collect events and the final status in a thread."""

    def __init__(self, address: str, *, v2: bool = False, features: str = "stream-multiplexing") -> None:
        self.channel = grpc.insecure_channel(address)
        stub = cdcpb_pb2_grpc.ChangeDataStub(self.channel)
        self._requests: queue.Queue[Any] = queue.Queue()
        self.messages: list[Any] = []
        self.error: grpc.RpcError | None = None
        self._cond = threading.Condition()
        if v2:
            self._call = stub.EventFeedV2(self._iter(), metadata=[("features", features)])
        else:
            self._call = stub.EventFeed(self._iter())
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _iter(self) -> Iterator[Any]:
        while (request := self._requests.get()) is not None:
            yield request

    def _collect(self) -> None:
        try:
            for message in self._call:
                with self._cond:
                    self.messages.append(message)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def send(self, request: Any) -> None:
        self._requests.put(request)

    def register(self, pg: Playground, region: Any, checkpoint_ts: int, request_id: int = 1, **kw: Any) -> None:
        self.send(
            cdcpb_pb2.ChangeDataRequest(
                header=cdcpb_pb2.Header(cluster_id=kw.pop("cluster_id", pg.cluster_id)),
                region_id=region.id,
                region_epoch=kw.pop("epoch", region.region_epoch),
                checkpoint_ts=checkpoint_ts,
                start_key=region.start_key,
                end_key=region.end_key,
                request_id=request_id,
                extra_op=kvrpcpb_pb2.ReadOldValue,
                **kw,
            )
        )

    def wait_for(self, predicate: Callable[[list[Any]], Any], timeout: float = 20.0) -> Any:
        """Wait until ``predicate(messages)`` is truthy (or the stream failed); return its value."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                result = predicate(self.messages)
                if result or self.error is not None:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out; got {len(self.messages)} messages: {self.messages[-5:]}")
                self._cond.wait(remaining)

    def rows(self) -> list[Any]:
        with self._cond:
            return [row for m in self.messages for e in m.events if e.HasField("entries") for row in e.entries.entries]

    def errors(self) -> list[Any]:
        with self._cond:
            return [e for m in self.messages for e in m.events if e.HasField("error")]

    def resolved(self) -> list[Any]:
        with self._cond:
            return [m.resolved_ts for m in self.messages if m.HasField("resolved_ts")]

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._thread.join(10)
        self.channel.close()


def rows_of(messages: list[Any], log_type: int) -> list[Any]:
    return [
        row
        for m in messages
        for e in m.events
        if e.HasField("entries")
        for row in e.entries.entries
        if row.type == log_type
    ]
