"""Scheduling: which capture replicates which span of a changefeed (seed 002).

Three parties, one protocol.

**Maintainer** (one per changefeed, on some capture) owns a
:class:`Scheduler` plugin instance, chosen by the connector's ``scheduler:``
section in connectors.yaml (``plugins.schedulers`` registry, ``type:`` →
class, ``cls(config)``). It drives it::

    scheduler = choice.instantiate()              # Scheduler[...]
    scheduler.bind(changefeed_id, epoch)          # epoch: grows per maintainer start
    every tick (e.g. 100 ms):
        result = scheduler.tick(
            checkpoint_ts=persisted_checkpoint,   # new spans start from here
            spans=current_spans,                  # every span to replicate now
            captures=alive_capture_ids,           # membership from the metastore
            messages=agent_responses_since_last_tick,
        )
        for msg in result.messages:               # HeartbeatRequest | DispatchTableRequest
            send(msg.capture_id, msg)             # to that capture's agent
        if result.watermark is not None:          # min over spans; never regresses
            report(result.watermark.checkpoint_ts, result.watermark.resolved_ts)

A capture missing from ``captures`` is dead: its spans are rescheduled. A
capture present but not yet heard from is asked for a heartbeat first; the
scheduler places nothing until every live capture has answered once (so a
new maintainer learns what already runs before adding anything). The
watermark is None while any span is absent.

Manual operations for the API and CLI, called between ticks on the
maintainer that owns the changefeed: :meth:`Scheduler.move_table`
(``cdcflow cli changefeed move-table -c ID --table-id T --target-capture C``),
:meth:`Scheduler.rebalance`, and :meth:`Scheduler.replication_status` for
``GET``-style status (:class:`SpanReplication`, JSON via ``to_dict()``).

**Agent** (one per changefeed per capture, created by the capture's
maintainer manager with the changefeed's :class:`~cdcflow.core.data.span_executor.SpanExecutor`)
executes requests::

    agent = Agent(changefeed_id, capture_id, executor)
    every tick: responses = await agent.handle(requests_received_since_last_tick)
                for r in responses: send_to_maintainer(r)   # HeartbeatResponse | DispatchTableResponse
    on graceful shutdown: agent.set_stopping()   # the scheduler moves spans away

**Messages** (:mod:`cdcflow.core.control.scheduling.protocol`) are frozen dataclasses
carrying ``changefeed_id``, ``capture_id`` (the agent's capture) and the
maintainer ``epoch``; :func:`encode_message` / :func:`decode_message` give a
JSON-able form for transports. Requests: :class:`HeartbeatRequest` (with
the changefeed checkpoint, which the maintainer fills in and the agent hands
to its executor), :class:`DispatchTableRequest` with an :class:`AddSpan` (``checkpoint_ts``,
``is_secondary``: True = phase one, prepare; False = phase two, replicate)
or a :class:`RemoveSpan`. Responses: :class:`HeartbeatResponse` (status of
every span loaded there: state, checkpoint ts, resolved ts; and the capture's
:class:`CaptureLiveness`) and :class:`DispatchTableResponse` (one span's status
after a task; ``STOPPED`` with the last checkpoint after a remove).

What is guaranteed: any message may be lost, repeated or reordered; the
scheduler re-sends what is still needed on later ticks and never regresses a
checkpoint. What is not: delivery — the transport may drop messages, and
heartbeats are how both sides resynchronise.
"""

from cdcflow.core.control.scheduling.agent import Agent
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
    decode_message,
    encode_message,
)
from cdcflow.core.control.scheduling.scheduler import (
    InvalidScheduleRequestError,
    ReplicationState,
    Scheduler,
    SpanReplication,
    TickResult,
    Watermark,
)

__all__ = [
    "AddSpan",
    "Agent",
    "AgentMessage",
    "CaptureLiveness",
    "DispatchTableRequest",
    "DispatchTableResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "InvalidScheduleRequestError",
    "RemoveSpan",
    "ReplicationState",
    "Scheduler",
    "SchedulerMessage",
    "SpanReplication",
    "TickResult",
    "Watermark",
    "decode_message",
    "encode_message",
]
