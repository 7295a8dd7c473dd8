"""The capture side of scheduling: one :class:`Agent` per changefeed per capture.

The agent receives the scheduler's requests (through the capture's maintainer
manager), carries them out through the changefeed's :class:`SpanExecutor`
and answers. Slow tasks (a prepare that has to catch up, a remove that has to
flush) stay pending and are polled on every later call; the agent sends a
``DispatchTableResponse`` when the executor reports them done, so the
scheduler learns of progress without asking again.

What the agent guarantees:

* a request whose ``(epoch, seq)`` is not above the newest accepted is
  dropped: an older maintainer's, a duplicate, or one overtaken by a later
  request (so a late copy of an old request never undoes a newer one);
* every response carries ``ack``, the newest accepted request ``seq``, and
  its own increasing ``seq``;
* an add for a span that is being removed is not started: the scheduler
  sees ``STOPPING`` and decides again once the remove is over;
* a repeated request is harmless: the executor's add/remove are idempotent
  and the answer reports the span's current status;
* the changefeed checkpoint a heartbeat request carries reaches the executor
  (``SpanExecutor.set_changefeed_checkpoint``) only when it is above every
  one handed before, so the sinks never see it go back, even when a new
  maintainer starts from an older persisted checkpoint.

It does not decide anything: which span runs where is the scheduler's call.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdcflow.core.control.scheduling.protocol import (
    AddSpan,
    AgentMessage,
    CaptureLiveness,
    DispatchTableRequest,
    DispatchTableResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    RemoveSpan,
    SchedulerMessage,
)
from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SpanExecutor, SpanState, SpanStatus

__all__ = ["Agent"]


class Agent:
    """Executes one changefeed's span tasks on one capture and reports status."""

    def __init__(self, changefeed_id: str, capture_id: str, executor: SpanExecutor) -> None:
        self.changefeed_id = changefeed_id
        self.capture_id = capture_id
        self.executor = executor
        self.liveness = CaptureLiveness.ALIVE
        #: Newest maintainer epoch seen; None before the first request.
        self.epoch: int | None = None
        #: Newest request seq accepted in :attr:`epoch`.
        self.ack = 0
        #: The newest changefeed checkpoint handed to the executor (0: none yet).
        self.changefeed_checkpoint = 0
        self._seq = 0
        # Tasks the executor has not finished yet, by span (one task per span).
        self._pending: dict[Span, AddSpan | RemoveSpan] = {}

    def set_stopping(self) -> None:
        """The capture is shutting down: ask the scheduler to move spans away."""
        self.liveness = CaptureLiveness.STOPPING

    @property
    def pending(self) -> dict[Span, AddSpan | RemoveSpan]:
        """Tasks still in progress (a copy)."""
        return dict(self._pending)

    async def handle(self, messages: Sequence[SchedulerMessage]) -> list[AgentMessage]:
        """Carry out ``messages`` (in order), then poll pending tasks.

        Returns the responses to send to the scheduler. Call it on every tick
        of the capture, with an empty ``messages`` when nothing arrived, so
        that pending tasks progress.
        """
        out: list[AgentMessage] = []
        for msg in messages:
            if msg.changefeed_id != self.changefeed_id or msg.capture_id != self.capture_id:
                continue  # misrouted: not ours to answer
            if self.epoch is not None and (msg.epoch, msg.seq) <= (self.epoch, self.ack):
                continue  # a stale maintainer, a duplicate, or overtaken by a later request
            self.epoch, self.ack = msg.epoch, msg.seq
            if isinstance(msg, HeartbeatRequest):
                await self._checkpoint(msg.checkpoint_ts)
                out.append(self._heartbeat())
            else:
                response = await self._dispatch(msg)
                if response is not None:
                    out.append(response)
        out.extend(await self._poll())
        return out

    async def _checkpoint(self, ts: int) -> None:
        if ts > self.changefeed_checkpoint:
            self.changefeed_checkpoint = ts
            await self.executor.set_changefeed_checkpoint(ts)

    def _heartbeat(self) -> HeartbeatResponse:
        spans = tuple(self.executor.status(s) for s in self.executor.spans())
        return HeartbeatResponse(
            self.changefeed_id,
            self.capture_id,
            self._epoch(),
            spans,
            self.liveness,
            seq=self._next(),
            ack=self.ack,
            snapshot=tuple(self.executor.snapshot_reports()),
        )

    async def _dispatch(self, msg: DispatchTableRequest) -> DispatchTableResponse | None:
        task = msg.task
        if isinstance(task, AddSpan):
            status = await self._add(task)
        else:
            status = await self._remove(task)
        return self._response(status) if status is not None else None

    async def _add(self, task: AddSpan) -> SpanStatus:
        span = task.span
        if isinstance(self._pending.get(span), RemoveSpan):
            return self.executor.status(span)  # let the remove finish first
        current = self.executor.status(span)
        if task.is_secondary and current.state is SpanState.REPLICATING:
            return current  # already past phase one: never step back
        done = await self.executor.add_span(span, task.checkpoint_ts, prepare=task.is_secondary)
        if done:
            self._pending.pop(span, None)
        else:
            self._pending[span] = task
        return self.executor.status(span)

    async def _remove(self, task: RemoveSpan) -> SpanStatus:
        span = task.span
        before = self.executor.status(span)
        checkpoint = await self.executor.remove_span(span)
        if checkpoint is None:
            self._pending[span] = task
            return SpanStatus(span, SpanState.STOPPING, before.checkpoint_ts, before.resolved_ts)
        self._pending.pop(span, None)
        last = max(checkpoint, before.checkpoint_ts)
        return SpanStatus(span, SpanState.STOPPED, last, max(last, before.resolved_ts))

    async def _poll(self) -> list[AgentMessage]:
        out: list[AgentMessage] = []
        for span, task in list(self._pending.items()):
            if isinstance(task, AddSpan):
                if await self.executor.add_span(span, task.checkpoint_ts, prepare=task.is_secondary):
                    del self._pending[span]
                    out.append(self._response(self.executor.status(span)))
            else:
                status = await self._remove(task)
                if status.state is SpanState.STOPPED:
                    out.append(self._response(status))
        return out

    def _response(self, status: SpanStatus) -> DispatchTableResponse:
        return DispatchTableResponse(
            self.changefeed_id, self.capture_id, self._epoch(), status, seq=self._next(), ack=self.ack
        )

    def _epoch(self) -> int:
        return self.epoch if self.epoch is not None else 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq
