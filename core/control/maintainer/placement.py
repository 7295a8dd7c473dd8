"""Where the maintainer meets the scheduler plugin: the one module that knows
:mod:`cdcflow.core.control.scheduling`'s interface (seed 002).

The maintainer hands :class:`Placement` the agents' responses as they arrive
and ticks it; each tick returns the requests to send (to the agent on each
request's capture) and, when every span replicates, the watermark (the
minimum checkpoint and resolved ts over spans). Messages cross captures as
JSON (the protocol's ``encode_message`` / ``decode_message``); on the way out
heartbeat requests are stamped with the changefeed checkpoint the maintainer
holds after the tick, so every capture's sinks learn it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from cdcflow.core.control.scheduling import (
    AgentMessage,
    DispatchTableResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    ReplicationState,
    Scheduler,
    SchedulerMessage,
    Watermark,
    decode_message,
    encode_message,
)
from cdcflow.core.data.events import Span

__all__ = ["Placement", "decode", "encode"]


def encode(message: SchedulerMessage | AgentMessage) -> dict[str, Any]:
    return encode_message(message)


def decode(payload: dict[str, Any]) -> SchedulerMessage | AgentMessage:
    """``decode_message``, keeping the sequence numbers the agent and the
    scheduler use to drop duplicates and overtaken requests."""
    message = decode_message(payload)
    seq = int(payload.get("seq", message.seq))
    if isinstance(message, HeartbeatResponse | DispatchTableResponse):
        return dataclasses.replace(message, seq=seq, ack=int(payload.get("ack", message.ack)))
    return dataclasses.replace(message, seq=seq)


class Placement:
    """One maintainer incarnation's scheduler, with its inbox of agent responses."""

    def __init__(self, scheduler: Scheduler[Any], changefeed_id: str, epoch: int, spans: Sequence[Span]) -> None:
        self.scheduler = scheduler
        self.spans = list(spans)
        scheduler.bind(changefeed_id, epoch)
        self._inbox: list[AgentMessage] = []
        #: The highest checkpoint received per span (what makes a response wake a tick).
        self._checkpoints: dict[Span, int] = {}

    def set_spans(self, spans: Sequence[Span]) -> None:
        """The changefeed's spans from now on (tables were created or dropped); the
        next ticks add the new ones and remove those no longer listed."""
        self.spans = list(spans)

    def receive(self, payload: dict[str, Any]) -> bool:
        """An agent's response (as JSON); applied on the next tick. Others' are dropped.

        Returns whether it moves a span's checkpoint above any this placement received
        before (then a tick now may move the watermark: the maintainer ticks at once).
        A repeat of a checkpoint already received returns False, so responses to the
        heartbeat requests of such a tick do not wake it again."""
        message = decode(payload)
        if not isinstance(message, HeartbeatResponse | DispatchTableResponse) or not self.scheduler.accepts(message):
            return False
        self._inbox.append(message)
        statuses = message.spans if isinstance(message, HeartbeatResponse) else (message.status,)
        moved = False
        for status in statuses:
            if status.checkpoint_ts > self._checkpoints.get(status.span, 0):
                self._checkpoints[status.span] = status.checkpoint_ts
                moved = True
        return moved

    def tick(
        self, checkpoint_ts: int, captures: Collection[str], *, stopping: bool = False
    ) -> tuple[list[SchedulerMessage], Watermark | None]:
        """Requests to send (see :meth:`outgoing`), and the watermark if it can advance.

        ``stopping``: the changefeed stops here; the scheduler is told it has no
        spans any more, so that it removes them from their captures.
        """
        inbox, self._inbox = self._inbox, []
        result = self.scheduler.tick(
            checkpoint_ts=checkpoint_ts, spans=[] if stopping else self.spans, captures=captures, messages=inbox
        )
        return list(result.messages), result.watermark

    @staticmethod
    def outgoing(requests: Sequence[SchedulerMessage], checkpoint_ts: int) -> list[tuple[str, dict[str, Any]]]:
        """``requests`` as (capture, JSON), heartbeat requests carrying the
        changefeed checkpoint ``checkpoint_ts``."""
        stamped = (
            dataclasses.replace(m, checkpoint_ts=checkpoint_ts) if isinstance(m, HeartbeatRequest) else m
            for m in requests
        )
        return [(m.capture_id, encode(m)) for m in stamped]

    def absent(self) -> int:
        """How many spans run nowhere now."""
        return sum(1 for r in self.scheduler.replication_status() if r.state is ReplicationState.ABSENT)

    def replicating(self) -> int:
        return sum(1 for r in self.scheduler.replication_status() if r.state is ReplicationState.REPLICATING)
