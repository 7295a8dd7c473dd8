"""StoreStream.send: a write that fails because the gRPC call was cancelled under it (the stream
broke or was closed meanwhile) is a broken stream to the caller, not the end of its task."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2
from cdcflow.plugins.sources.tikv.stream import StoreStream


class FakeCall:
    """A ChangeData call whose writes wait on ``release`` and then raise ``error`` (if any)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.error: BaseException | None = None
        self.cancelled = False

    async def write(self, request: Any) -> None:
        await self.release.wait()
        if self.error is not None:
            raise self.error

    async def read(self) -> Any:
        await asyncio.Event().wait()

    def cancel(self) -> None:
        self.cancelled = True


class FakeChannel:
    def __init__(self, call: FakeCall) -> None:
        self.call = call

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return lambda **_: self.call


class Owner:
    def __init__(self) -> None:
        self.broken: list[BaseException] = []

    async def on_event(self, stream: Any, handle: Any, event: Any) -> None: ...

    async def on_resolved(self, stream: Any, handle: Any, ts: int) -> None: ...

    async def on_stream_broken(self, stream: Any, error: BaseException, *, unimplemented: bool) -> None:
        self.broken.append(error)


def _stream(call: FakeCall, owner: Owner) -> StoreStream:
    return StoreStream(owner, "127.0.0.1:20160", FakeChannel(call), v2=True)  # type: ignore[arg-type]


def test_a_write_on_a_call_cancelled_under_it_breaks_the_stream() -> None:
    async def body() -> None:
        call, owner = FakeCall(), Owner()
        stream = _stream(call, owner)
        call.error = asyncio.CancelledError()  # what grpc raises for a locally cancelled call
        call.release.set()
        with pytest.raises(ConnectionError, match="cancelled while writing"):
            await stream.send(cdcpb_pb2.ChangeDataRequest(region_id=1))
        assert stream.broken and call.cancelled
        assert len(owner.broken) == 1 and isinstance(owner.broken[0], ConnectionError)
        with pytest.raises(ConnectionError, match="is broken"):
            await stream.send(cdcpb_pb2.ChangeDataRequest(region_id=2))
        await stream.close()

    asyncio.run(body())


def test_a_sender_cancelled_while_writing_is_cancelled_and_the_stream_stays() -> None:
    async def body() -> None:
        call, owner = FakeCall(), Owner()
        stream = _stream(call, owner)
        sender = asyncio.create_task(stream.send(cdcpb_pb2.ChangeDataRequest(region_id=1)))
        await asyncio.sleep(0)
        sender.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sender
        assert not stream.broken and not owner.broken
        await stream.close()

    asyncio.run(body())
