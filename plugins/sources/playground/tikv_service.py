"""``cdcpb.ChangeData`` served by one playground store (grpc.aio).

``EventFeed`` is the classic stream. ``EventFeedV2`` reads the gRPC metadata
``features`` (comma-separated); it knows ``stream-multiplexing`` and fails the
stream with UNIMPLEMENTED for anything else, or entirely when V2 is disabled
(so clients can be tested on their fallback to ``EventFeed``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from cdcflow.plugins.sources.playground.feed import FeedHub, FeedSession
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, cdcpb_pb2_grpc

__all__ = ["FEATURE_STREAM_MULTIPLEXING", "ChangeDataService"]

FEATURE_STREAM_MULTIPLEXING = "stream-multiplexing"
_KNOWN_FEATURES = {FEATURE_STREAM_MULTIPLEXING}


class ChangeDataService(cdcpb_pb2_grpc.ChangeDataServicer):
    """The ChangeData servicer of store ``store_id``."""

    def __init__(self, hub: FeedHub, store_id: int, *, v2_enabled: bool = True) -> None:
        self.hub = hub
        self.store_id = store_id
        self.v2_enabled = v2_enabled

    async def EventFeed(
        self, requests: AsyncIterator[cdcpb_pb2.ChangeDataRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cdcpb_pb2.ChangeDataEvent]:
        async for message in self._serve(requests, context, multiplexing=False):
            yield message

    async def EventFeedV2(
        self, requests: AsyncIterator[cdcpb_pb2.ChangeDataRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cdcpb_pb2.ChangeDataEvent]:
        if not self.v2_enabled:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "EventFeedV2 is disabled on this store")
        metadata = dict(context.invocation_metadata() or ())
        features = {f.strip() for f in str(metadata.get("features", "")).split(",") if f.strip()}
        unknown = features - _KNOWN_FEATURES
        if unknown:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"unknown features: {', '.join(sorted(unknown))}")
        async for message in self._serve(requests, context, multiplexing=FEATURE_STREAM_MULTIPLEXING in features):
            yield message

    async def _serve(
        self,
        requests: AsyncIterator[cdcpb_pb2.ChangeDataRequest],
        context: grpc.aio.ServicerContext,
        *,
        multiplexing: bool,
    ) -> AsyncIterator[cdcpb_pb2.ChangeDataEvent]:
        session = self.hub.open_session(self.store_id, multiplexing, asyncio.get_running_loop())
        reader = asyncio.create_task(self._read(requests, session))
        try:
            while True:
                message = await session.queue.get()
                if message is None:
                    break
                yield message
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self.hub.close_session(session)
        if session.reset:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "stream reset (fault injected)")

    async def _read(self, requests: AsyncIterator[cdcpb_pb2.ChangeDataRequest], session: FeedSession) -> None:
        # The client half-closing its side does not end the feed: TiKV keeps pushing.
        async for request in requests:
            self.hub.handle_request(session, request)
