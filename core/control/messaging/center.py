"""The message center: topic-addressed delivery between captures (seed 000).

A handler is registered per topic on each capture. A message for the local
capture is queued in process; a message for another capture goes over that
capture's gRPC stream (:mod:`cdcflow.core.control.messaging.grpc`). Delivery is in
order per (sender, topic) and at most once: a message sent while a peer is
unreachable is dropped. The protocol on top tolerates that — heartbeats
repeat every second and commands are idempotent and repeated until their
effect is seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from cdcflow.core.control.messaging.messages import Message, Topic

__all__ = ["Handler", "MessageCenter", "RemoteTransport"]

log = logging.getLogger(__name__)

Handler = Callable[[Message], Awaitable[None]]


class RemoteTransport(Protocol):
    """Sends to other captures (the gRPC transport implements it)."""

    def send(self, target: str, address: str, topic: Topic, message: Message) -> bool: ...

    async def close(self) -> None: ...


class MessageCenter:
    """One per capture. ``send`` never blocks; it returns False when the target is unknown."""

    def __init__(self, capture_id: str, remote: RemoteTransport | None = None, queue_size: int = 65536) -> None:
        self.capture_id = capture_id
        self.remote = remote
        self._handlers: dict[Topic, Handler] = {}
        self._queues: dict[Topic, asyncio.Queue[Message]] = {t: asyncio.Queue(queue_size) for t in Topic}
        self._workers = [asyncio.create_task(self._work(t), name=f"mc-{t.value}") for t in Topic]
        self._peers: dict[str, str] = {}

    def register(self, topic: Topic, handler: Handler) -> None:
        """Route ``topic`` to ``handler`` (replacing any previous one)."""
        self._handlers[topic] = handler

    def unregister(self, topic: Topic, handler: Handler | None = None) -> None:
        if handler is None or self._handlers.get(topic) is handler:
            self._handlers.pop(topic, None)

    def set_peers(self, peers: dict[str, str]) -> None:
        """The live captures by id, with the address of their message server."""
        self._peers = dict(peers)

    def send(self, target: str, topic: Topic, message: Message) -> bool:
        """Queue ``message`` for ``topic`` on capture ``target``."""
        if target == self.capture_id:
            return self.deliver(topic, message)
        address = self._peers.get(target)
        if address is None or self.remote is None:
            log.debug("no route to capture %s for %s", target, type(message).__name__)
            return False
        return self.remote.send(target, address, topic, message)

    def deliver(self, topic: Topic, message: Message) -> bool:
        """Hand an incoming (or local) message to the topic's queue."""
        try:
            self._queues[topic].put_nowait(message)
        except asyncio.QueueFull:
            log.warning("%s queue is full; dropped %s", topic.value, type(message).__name__)
            return False
        return True

    async def _work(self, topic: Topic) -> None:
        queue = self._queues[topic]
        while True:
            message = await queue.get()
            handler = self._handlers.get(topic)
            if handler is None:
                continue
            try:
                await handler(message)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("handler of %s failed on %s", topic.value, type(message).__name__)

    async def close(self) -> None:
        for worker in self._workers:
            worker.cancel()
        for worker in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        if self.remote is not None:
            await self.remote.close()
