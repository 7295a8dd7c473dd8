"""The messages between coordinator, maintainer managers, maintainers and span agents.

Names follow seed 000; span scheduling (seed 002) travels inside
:class:`SchedulingMessage`. Every command from the coordinator carries the
coordinator's id and version (its owner term) and the changefeed's id and
epoch, so that a manager can drop commands of a deposed coordinator and
repeated or reordered commands do nothing.

Messages are frozen dataclasses; :func:`encode` / :func:`decode` turn them into
JSON bytes for the gRPC transport (the in-process transport passes objects).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AddMaintainerRequest",
    "BlockStatusRequest",
    "CheckpointTsMessage",
    "CoordinatorBootstrapRequest",
    "CoordinatorBootstrapResponse",
    "MaintainerHeartbeat",
    "MaintainerStatus",
    "Message",
    "RemoveMaintainerRequest",
    "SchedulingMessage",
    "Topic",
    "decode",
    "encode",
]


class Topic(enum.Enum):
    """Where a message is delivered on its target capture (seed 000)."""

    COORDINATOR = "CoordinatorTopic"
    MAINTAINER_MANAGER = "MaintainerManagerTopic"
    MAINTAINER = "MaintainerTopic"


@dataclass(frozen=True, slots=True)
class Message:
    """Base of every message: which capture sent it."""

    sender: str


@dataclass(frozen=True, slots=True)
class MaintainerStatus:
    """One maintainer's state as its manager reports it.

    ``state``: ``working``, ``stopped`` (closed, CloseAck) or ``failed``.
    ``error`` is a :meth:`CdcflowError.to_dict` when the maintainer hit one.
    ``snapshot``: the changefeed's initial snapshot progress
    (:meth:`~cdcflow.core.control.maintainer.maintainer.Maintainer.snapshot_progress`),
    None when none is known. ``snapshot_record``: what the coordinator keeps in the
    metastore of a snapshot shared by the cluster, while one runs
    (:class:`~cdcflow.core.data.snapshot_ranges.SnapshotRecord` as JSON), else None.
    """

    changefeed_id: str
    epoch: int
    state: str
    checkpoint_ts: int
    resolved_ts: int
    error: dict[str, Any] | None = None
    spans_total: int = 0
    spans_replicating: int = 0
    snapshot: dict[str, Any] | None = None
    snapshot_record: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class CoordinatorBootstrapRequest(Message):
    coordinator_id: str
    coordinator_version: int


@dataclass(frozen=True, slots=True)
class CoordinatorBootstrapResponse(Message):
    coordinator_version: int
    statuses: tuple[MaintainerStatus, ...] = ()


@dataclass(frozen=True, slots=True)
class AddMaintainerRequest(Message):
    """Start the changefeed's maintainer on the target capture (EventInit + Start).

    ``snapshot_record``: the changefeed's initial-snapshot record as stored (the ranges
    a cluster delivered so far), None when there is none."""

    coordinator_id: str
    coordinator_version: int
    changefeed_id: str
    epoch: int
    info: dict[str, Any]
    checkpoint_ts: int
    snapshot_record: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class RemoveMaintainerRequest(Message):
    """Stop and remove the maintainer of ``epoch`` or older (Stop + Remove → CloseAck)."""

    coordinator_id: str
    coordinator_version: int
    changefeed_id: str
    epoch: int
    cascade: bool = True


@dataclass(frozen=True, slots=True)
class MaintainerHeartbeat(Message):
    """The manager's report of its maintainers: every changed status, and all of
    them at least once a second."""

    coordinator_version: int
    statuses: tuple[MaintainerStatus, ...] = ()


@dataclass(frozen=True, slots=True)
class BlockStatusRequest(Message):
    """A maintainer says what blocks it (DDL barrier, back pressure, network)."""

    changefeed_id: str
    epoch: int
    reason: str
    blocked_ts: int = 0
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class CheckpointTsMessage(Message):
    """The coordinator's persisted checkpoint of a changefeed, for its maintainer.

    ``snapshot_complete``: the stored snapshot record says the initial snapshot is
    complete (the maintainer waits for it before it places the tables)."""

    coordinator_version: int
    changefeed_id: str
    epoch: int
    checkpoint_ts: int
    snapshot_complete: bool = False


@dataclass(frozen=True, slots=True)
class SchedulingMessage(Message):
    """A scheduling-protocol message between a maintainer and a capture's agent
    (:mod:`cdcflow.core.control.scheduling.protocol`, as JSON in ``payload``).

    Requests go to the agent's capture on MaintainerManagerTopic and carry the
    changefeed's ``info``, from which the capture builds the changefeed's span
    executor; responses go to the maintainer's capture on MaintainerTopic. An
    agent whose executor failed sends ``error`` instead of a payload.

    ``barrier_ts`` (requests only): the changefeed's barrier — the executor
    publishes nothing above it (the maintainer follows the table-set DDL, see
    :mod:`cdcflow.core.control.maintainer.tables`); None when there is none. Within
    one epoch it never goes backwards. A request without ``payload`` only
    carries a new barrier.
    """

    changefeed_id: str
    epoch: int
    payload: dict[str, Any] | None = None
    info: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    barrier_ts: int | None = None


_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        CoordinatorBootstrapRequest,
        CoordinatorBootstrapResponse,
        AddMaintainerRequest,
        RemoveMaintainerRequest,
        MaintainerHeartbeat,
        BlockStatusRequest,
        CheckpointTsMessage,
        SchedulingMessage,
    )
}
_NESTED: dict[str, type[Any]] = {"statuses": MaintainerStatus}


def encode(message: Message) -> bytes:
    """JSON bytes of ``message`` with its type name."""
    return json.dumps({"type": type(message).__name__, "body": dataclasses.asdict(message)}).encode()


def decode(data: bytes) -> Message:
    """The message encoded by :func:`encode`; ValueError for unknown types."""
    doc = json.loads(data)
    cls = _TYPES.get(doc.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown message type {doc.get('type')!r}")
    body: dict[str, Any] = doc["body"]
    for name, nested in _NESTED.items():
        if name in body:
            body[name] = tuple(nested(**item) for item in body[name])
    message: Message = cls(**body)
    return message
