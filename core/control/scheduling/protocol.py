"""The messages between a changefeed's scheduler and the agents on captures (seed 002).

Two kinds of exchange, each a request from the maintainer's scheduler to one
capture's agent and a response back:

* ``HeartbeatRequest`` → ``HeartbeatResponse``: the agent reports every span
  of the changefeed loaded on its capture, with state, checkpoint ts and
  resolved ts, and whether the capture is shutting down. The request carries
  the changefeed checkpoint the maintainer holds (the minimum over all spans),
  which the agent hands to its executor for the sinks.
* ``DispatchTableRequest`` → ``DispatchTableResponse``: add a span (phase one:
  ``is_secondary=True``, load and catch up without writing downstream; phase
  two: ``is_secondary=False``, replicate) or remove it; the response carries
  the span's status once the agent has acted (and again when a slow task
  finishes).

Every message names its changefeed, the capture of the agent (target of a
request, sender of a response), the maintainer's ``epoch`` and the sender's
``seq`` (strictly increasing per sender). Responses also carry ``ack``: the
highest request ``seq`` the agent has accepted in that epoch.

* An agent drops a request whose ``(epoch, seq)`` is not above the newest it
  accepted: a stale maintainer after failover, a duplicate, or a request
  overtaken by a later one. So a late duplicate of an old "replicate" request
  can never bring a span back.
* A scheduler drops responses of another epoch and, per capture, responses
  whose ``seq`` is not above the newest it accepted (reordering becomes
  loss). With ``ack`` it knows whether a report that a span is absent already
  reflects its latest request or predates it.

Messages may be lost, repeated or reordered: both sides tolerate it, and
schedulers re-send what is still needed when a heartbeat shows it was lost.

:func:`encode_message` / :func:`decode_message` turn messages into JSON-able
dicts and back, for transports between processes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeAlias

from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SnapshotReport, SpanState, SpanStatus

__all__ = [
    "AddSpan",
    "AgentMessage",
    "CaptureLiveness",
    "DispatchTableRequest",
    "DispatchTableResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "RemoveSpan",
    "SchedulerMessage",
    "decode_message",
    "encode_message",
]


class CaptureLiveness(enum.Enum):
    """Whether a capture takes new spans (``ALIVE``) or is shutting down
    gracefully and wants its spans moved away (``STOPPING``)."""

    ALIVE = "alive"
    STOPPING = "stopping"


@dataclass(frozen=True, slots=True)
class AddSpan:
    """Load ``span`` from ``checkpoint_ts``.

    ``is_secondary=True`` is phase one (prepare: feed and buffer, write
    nothing downstream); ``False`` is phase two (replicate downstream).
    """

    span: Span
    checkpoint_ts: int
    is_secondary: bool


@dataclass(frozen=True, slots=True)
class RemoveSpan:
    """Stop ``span`` and release it; the response reports its last checkpoint."""

    span: Span


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """Scheduler → agent: report your spans.

    ``checkpoint_ts``: the changefeed checkpoint (every change of every span at
    or below it is flushed by every sink of every capture); 0 when the sender
    does not know it. Schedulers leave it 0: the maintainer fills it in.
    """

    changefeed_id: str
    capture_id: str
    epoch: int
    seq: int = 0
    checkpoint_ts: int = 0


@dataclass(frozen=True, slots=True)
class DispatchTableRequest:
    """Scheduler → agent: carry out ``task`` on your capture."""

    changefeed_id: str
    capture_id: str
    epoch: int
    task: AddSpan | RemoveSpan
    seq: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    """Agent → scheduler: every span of the changefeed loaded on the capture.

    A span absent from ``spans`` is not loaded there (state ``ABSENT``).
    ``snapshot``: where the initial snapshots read on the capture are (its own
    spans', each snapshot range's), for the changefeed's progress.
    """

    changefeed_id: str
    capture_id: str
    epoch: int
    spans: tuple[SpanStatus, ...]
    liveness: CaptureLiveness = CaptureLiveness.ALIVE
    seq: int = 0
    ack: int = 0
    snapshot: tuple[SnapshotReport, ...] = ()


@dataclass(frozen=True, slots=True)
class DispatchTableResponse:
    """Agent → scheduler: where a dispatched task stands for ``status.span``.

    After a remove that finished, ``status.state`` is ``STOPPED`` and
    ``status.checkpoint_ts`` is the span's last checkpoint on that capture.
    """

    changefeed_id: str
    capture_id: str
    epoch: int
    status: SpanStatus
    seq: int = 0
    ack: int = 0


#: What a scheduler sends (to the agent on ``capture_id``).
SchedulerMessage: TypeAlias = HeartbeatRequest | DispatchTableRequest
#: What an agent sends back (from the agent on ``capture_id``).
AgentMessage: TypeAlias = HeartbeatResponse | DispatchTableResponse


def _span_dict(span: Span) -> dict[str, Any]:
    return {"table_id": span.table_id, "start": span.start.hex(), "end": span.end.hex()}


def _span(d: dict[str, Any]) -> Span:
    return Span(int(d["table_id"]), bytes.fromhex(d["start"]), bytes.fromhex(d["end"]))


def _status_dict(s: SpanStatus) -> dict[str, Any]:
    return {
        "span": _span_dict(s.span),
        "state": s.state.value,
        "checkpoint_ts": s.checkpoint_ts,
        "resolved_ts": s.resolved_ts,
    }


def _status(d: dict[str, Any]) -> SpanStatus:
    return SpanStatus(_span(d["span"]), SpanState(d["state"]), int(d["checkpoint_ts"]), int(d["resolved_ts"]))


def _report_dict(r: SnapshotReport) -> dict[str, Any]:
    return {
        "span": _span_dict(r.span) if r.span is not None else None,
        "unit": r.unit,
        "phase": r.phase,
        "parts_done": r.parts_done,
        "parts_total": r.parts_total,
        "rows_done": r.rows_done,
        "rows_estimate": r.rows_estimate,
        "started_at": r.started_at,
    }


def _report(d: dict[str, Any]) -> SnapshotReport:
    return SnapshotReport(
        _span(d["span"]) if d.get("span") is not None else None,
        str(d["unit"]),
        str(d["phase"]),
        int(d["parts_done"]),
        int(d["parts_total"]),
        int(d["rows_done"]),
        int(d["rows_estimate"]),
        float(d["started_at"]),
    )


def encode_message(msg: SchedulerMessage | AgentMessage) -> dict[str, Any]:
    """A JSON-able dict for ``msg``; :func:`decode_message` reverses it."""
    head: dict[str, Any] = {
        "changefeed_id": msg.changefeed_id,
        "capture_id": msg.capture_id,
        "epoch": msg.epoch,
        "seq": msg.seq,
    }
    if isinstance(msg, HeartbeatResponse | DispatchTableResponse):
        head["ack"] = msg.ack
    if isinstance(msg, HeartbeatRequest):
        return {"type": "heartbeat-request", **head, "checkpoint_ts": msg.checkpoint_ts}
    if isinstance(msg, HeartbeatResponse):
        spans = [_status_dict(s) for s in msg.spans]
        body = {"type": "heartbeat-response", **head, "spans": spans, "liveness": msg.liveness.value}
        if msg.snapshot:
            body["snapshot"] = [_report_dict(r) for r in msg.snapshot]
        return body
    if isinstance(msg, DispatchTableResponse):
        return {"type": "dispatch-table-response", **head, "status": _status_dict(msg.status)}
    task = msg.task
    if isinstance(task, AddSpan):
        body = {
            "add": {
                "span": _span_dict(task.span),
                "checkpoint_ts": task.checkpoint_ts,
                "is_secondary": task.is_secondary,
            }
        }
    else:
        body = {"remove": {"span": _span_dict(task.span)}}
    return {"type": "dispatch-table-request", **head, **body}


def decode_message(d: dict[str, Any]) -> SchedulerMessage | AgentMessage:
    """The message encoded by :func:`encode_message`.

    Raises ``ValueError`` (or ``KeyError``) for a dict that is not one.
    """
    head = (str(d["changefeed_id"]), str(d["capture_id"]), int(d["epoch"]))
    kind = d.get("type")
    if kind == "heartbeat-request":
        return HeartbeatRequest(*head, checkpoint_ts=int(d.get("checkpoint_ts", 0)))
    if kind == "heartbeat-response":
        spans = tuple(_status(s) for s in d["spans"])
        snapshot = tuple(_report(r) for r in d.get("snapshot") or ())
        return HeartbeatResponse(*head, spans, CaptureLiveness(d.get("liveness", "alive")), snapshot=snapshot)
    if kind == "dispatch-table-response":
        return DispatchTableResponse(*head, _status(d["status"]))
    if kind == "dispatch-table-request":
        if "add" in d:
            a = d["add"]
            return DispatchTableRequest(
                *head, AddSpan(_span(a["span"]), int(a["checkpoint_ts"]), bool(a["is_secondary"]))
            )
        return DispatchTableRequest(*head, RemoveSpan(_span(d["remove"]["span"])))
    raise ValueError(f"not a scheduling message: type={kind!r}")
