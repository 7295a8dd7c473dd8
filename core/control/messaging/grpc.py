"""The gRPC transport of the message center: one client stream per peer.

Each capture serves ``cdcflow.messaging.MessageCenter/SendMessages``; a sender
keeps one stream open per target capture and reconnects with backoff when it
breaks. Envelopes carry the intended target's capture id, and a receiver
drops envelopes meant for another id (a capture that re-joined under a new
id after losing its session must not act on its predecessor's messages).
TLS is used when a CA, certificate and key are configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import Message, Topic, decode, encode
from cdcflow.core.control.messaging.pb import messaging_pb2, messaging_pb2_grpc

__all__ = ["GrpcTransport", "MessageServer", "TLSConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """PEM files: the CA that signs every capture's certificate, and this capture's pair."""

    ca: str
    cert: str
    key: str

    def server_credentials(self) -> Any:
        return grpc.ssl_server_credentials(
            [(Path(self.key).read_bytes(), Path(self.cert).read_bytes())],
            root_certificates=Path(self.ca).read_bytes(),
            require_client_auth=True,
        )

    def channel_credentials(self) -> Any:
        return grpc.ssl_channel_credentials(
            Path(self.ca).read_bytes(), Path(self.key).read_bytes(), Path(self.cert).read_bytes()
        )


class _Servicer(messaging_pb2_grpc.MessageCenterServicer):
    def __init__(self, server: MessageServer) -> None:
        self.server = server

    async def SendMessages(self, request_iterator: AsyncIterator[Any], context: Any) -> Any:
        received = 0
        async for envelope in request_iterator:
            received += 1
            center = self.server.center
            if center is None or envelope.target != center.capture_id:
                continue
            try:
                message = decode(envelope.payload)
                center.deliver(Topic(envelope.topic), message)
            except ValueError:
                log.warning("dropped an undecodable message from %s", envelope.sender)
        return messaging_pb2.StreamAck(received=received)


class MessageServer:
    """Serves incoming streams into the capture's current message center."""

    def __init__(self, listen: str, tls: TLSConfig | None = None) -> None:
        self.center: MessageCenter | None = None
        self._server = grpc.aio.server()
        messaging_pb2_grpc.add_MessageCenterServicer_to_server(_Servicer(self), self._server)
        if tls is None:
            self.port = self._server.add_insecure_port(listen)
        else:
            self.port = self._server.add_secure_port(listen, tls.server_credentials())

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(grace=0.5)


class _Peer:
    def __init__(self, target: str, address: str, tls: TLSConfig | None) -> None:
        self.target = target
        self.address = address
        self.tls = tls
        self.queue: asyncio.Queue[Any] = asyncio.Queue(65536)
        self.task = asyncio.create_task(self._run(), name=f"grpc-peer-{target}")

    async def _run(self) -> None:
        delay = 0.1
        while True:
            channel = (
                grpc.aio.secure_channel(self.address, self.tls.channel_credentials())
                if self.tls
                else grpc.aio.insecure_channel(self.address)
            )
            try:
                stub = messaging_pb2_grpc.MessageCenterStub(channel)
                await stub.SendMessages(self._envelopes())
            except grpc.aio.AioRpcError as exc:
                log.debug("stream to %s (%s) broke: %s", self.target, self.address, exc.code())
            finally:
                await channel.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _envelopes(self) -> AsyncIterator[Any]:
        while True:
            yield await self.queue.get()

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class GrpcTransport:
    """Implements :class:`~cdcflow.core.control.messaging.center.RemoteTransport` over gRPC."""

    def __init__(self, sender: str, tls: TLSConfig | None = None) -> None:
        self.sender = sender
        self.tls = tls
        self._peers: dict[tuple[str, str], _Peer] = {}

    def send(self, target: str, address: str, topic: Topic, message: Message) -> bool:
        peer = self._peers.get((target, address))
        if peer is None:
            peer = self._peers[(target, address)] = _Peer(target, address, self.tls)
        envelope = messaging_pb2.Envelope(topic=topic.value, sender=self.sender, target=target, payload=encode(message))
        try:
            peer.queue.put_nowait(envelope)
        except asyncio.QueueFull:
            return False
        return True

    async def close(self) -> None:
        for peer in self._peers.values():
            await peer.close()
        self._peers.clear()
