"""One ChangeData bidi stream to one TiKV store, shared by the region subscriptions on it.

EventFeedV2 is opened with the gRPC metadata ``features: stream-multiplexing``
so that one stream carries every subscription to the store; a store that
answers UNIMPLEMENTED is remembered and spoken to with EventFeed (one stream
per store and subscription, because without multiplexing a store refuses a
second registration of the same region on one stream).

The stream only moves bytes: it routes each Event to the subscription state
registered for ``(request_id, region_id)`` and tells its owner when the
stream breaks. What the events mean is decided by the owner
(:mod:`cdcflow.plugins.sources.tikv.eventfeed`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import grpc

from cdcflow.plugins.sources.tikv.channels import call_cancelled
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, cdcpb_pb2_grpc

__all__ = ["FEATURES_METADATA", "StoreStream", "StreamOwner"]

log = logging.getLogger(__name__)

FEATURES_METADATA = (("features", "stream-multiplexing"),)


class RegionHandle(Protocol):
    @property
    def request_id(self) -> int: ...

    @property
    def region_id(self) -> int: ...


class StreamOwner(Protocol):
    """What a stream reports to (the EventFeed client)."""

    async def on_event(self, stream: StoreStream, handle: Any, event: cdcpb_pb2.Event) -> None: ...

    async def on_resolved(self, stream: StoreStream, handle: Any, ts: int) -> None: ...

    async def on_stream_broken(self, stream: StoreStream, error: BaseException, *, unimplemented: bool) -> None: ...


class StoreStream:
    """A live ChangeData call; ``handles`` maps ``(request_id, region_id)`` to subscription states."""

    def __init__(self, owner: StreamOwner, address: str, channel: grpc.aio.Channel, *, v2: bool) -> None:
        self.owner = owner
        self.address = address
        self.v2 = v2
        self.handles: dict[tuple[int, int], Any] = {}
        self.broken = False
        stub = cdcpb_pb2_grpc.ChangeDataStub(channel)
        self._call: Any = stub.EventFeedV2(metadata=FEATURES_METADATA) if v2 else stub.EventFeed()
        self._send_lock = asyncio.Lock()
        self._reader = asyncio.create_task(self._read(), name=f"eventfeed-{address}")

    def __repr__(self) -> str:
        return f"StoreStream({self.address}, v2={self.v2}, regions={len(self.handles)})"

    def add(self, handle: RegionHandle) -> None:
        self.handles[(handle.request_id, handle.region_id)] = handle

    def remove(self, handle: RegionHandle) -> None:
        if self.handles.get((handle.request_id, handle.region_id)) is handle:
            del self.handles[(handle.request_id, handle.region_id)]

    async def send(self, request: cdcpb_pb2.ChangeDataRequest) -> None:
        """Write ``request``; a failed write breaks the stream (its regions get rescheduled)."""
        if self.broken:
            raise ConnectionError(f"stream to {self.address} is broken")
        try:
            async with self._send_lock:
                await self._call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            await self._break(exc)
            raise ConnectionError(f"stream to {self.address} broke on write: {exc}") from exc
        except asyncio.CancelledError:
            if not call_cancelled():
                raise
            # For the caller a call cancelled under its write is a broken stream, whose
            # regions get rescheduled, not the end of its task.
            error = ConnectionError(f"stream to {self.address} was cancelled while writing")
            await self._break(error)
            raise error from None

    async def close(self) -> None:
        self.broken = True
        self._call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)

    def _lookup(self, request_id: int, region_id: int) -> list[Any]:
        handle = self.handles.get((request_id, region_id))
        if handle is not None:
            return [handle]
        if request_id:
            return []
        # Resolved ts of a stream without multiplexing may carry no request id.
        return [h for (_, rid), h in self.handles.items() if rid == region_id]

    async def _read(self) -> None:
        try:
            while True:
                resp = await self._call.read()
                if resp is grpc.aio.EOF:
                    raise ConnectionError(f"store {self.address} closed the ChangeData stream")
                if resp is None:  # grpc gives None for a frame that does not parse as a ChangeDataEvent
                    log.warning("store %s sent a frame that is not a ChangeDataEvent; reconnecting", self.address)
                    raise ConnectionError(f"store {self.address} sent a malformed ChangeData frame")
                await self._dispatch(resp)
        except asyncio.CancelledError:
            raise
        except (grpc.aio.AioRpcError, ConnectionError) as exc:
            await self._break(exc)
        except Exception as exc:  # a bug must not leave the stream's regions unattended
            log.exception("ChangeData stream to %s failed while handling an event", self.address)
            await self._break(exc)

    async def _dispatch(self, resp: cdcpb_pb2.ChangeDataEvent) -> None:
        for event in resp.events:
            for handle in self._lookup(event.request_id, event.region_id):
                await self.owner.on_event(self, handle, event)
        if resp.HasField("resolved_ts"):
            rts = resp.resolved_ts
            for region_id in rts.regions:
                for handle in self._lookup(rts.request_id, region_id):
                    await self.owner.on_resolved(self, handle, rts.ts)

    async def _break(self, exc: BaseException) -> None:
        if self.broken:
            return
        self.broken = True
        unimplemented = (
            self.v2 and isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNIMPLEMENTED
        )
        log.info("ChangeData stream to %s broke (%s); %d regions to resubscribe", self.address, exc, len(self.handles))
        self._call.cancel()
        await self.owner.on_stream_broken(self, exc, unimplemented=unimplemented)
