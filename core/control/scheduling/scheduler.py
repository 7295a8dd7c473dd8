"""The scheduler plugin's side: what a maintainer asks and what a scheduler answers."""

from __future__ import annotations

import abc
import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.control.scheduling.protocol import (
    AddSpan,
    AgentMessage,
    DispatchTableRequest,
    HeartbeatRequest,
    RemoveSpan,
    SchedulerMessage,
)
from cdcflow.core.data.events import Span
from cdcflow.core.errors import ConfigInvalidError, NotAvailableError
from cdcflow.core.plugin.base import ConfigT, Plugin

__all__ = [
    "InvalidScheduleRequestError",
    "ReplicationState",
    "Scheduler",
    "SpanReplication",
    "TickResult",
    "Watermark",
]


class ReplicationState(enum.Enum):
    """Where a span stands across captures (seed 002's ReplicationSet states)."""

    #: No capture has the span loaded.
    ABSENT = "absent"
    #: A capture is loading the span (add), or a second one is (move).
    PREPARE = "prepare"
    #: A capture has the span prepared; it is about to become (or is) the primary.
    COMMIT = "commit"
    #: Exactly one capture replicates the span downstream.
    REPLICATING = "replicating"
    #: The only capture holding the span is stopping it.
    REMOVING = "removing"


@dataclass(frozen=True, slots=True)
class Watermark:
    """A changefeed's progress: the minimum checkpoint ts and resolved ts over its spans."""

    checkpoint_ts: int
    resolved_ts: int


@dataclass(frozen=True, slots=True)
class SpanReplication:
    """One span's scheduling status, for the API and the CLI.

    ``primary`` replicates the span downstream (None when no capture does);
    ``secondary`` has it loaded without writing (during an add or a move).
    """

    span: Span
    state: ReplicationState
    primary: str | None
    secondary: str | None
    checkpoint_ts: int
    resolved_ts: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "table_id": self.span.table_id,
            "start": self.span.start.hex(),
            "end": self.span.end.hex(),
            "state": self.state.value,
            "primary": self.primary,
            "secondary": self.secondary,
            "checkpoint_ts": self.checkpoint_ts,
            "resolved_ts": self.resolved_ts,
        }


@dataclass(slots=True)
class TickResult:
    """What a scheduler answers on a tick.

    ``messages``: requests to send, each to the agent on its ``capture_id``.
    ``watermark``: the changefeed's progress, or None while it cannot advance
    (a span is absent, or a capture has not reported yet). When present it
    never goes backwards across ticks and is never below the ``checkpoint_ts``
    the maintainer passed in.
    """

    messages: list[SchedulerMessage] = field(default_factory=list)
    watermark: Watermark | None = None


class InvalidScheduleRequestError(ConfigInvalidError):
    """A manual scheduling request (move-table …) names an unknown table or capture."""


class Scheduler(Plugin[ConfigT], abc.ABC):
    """Base class of scheduler plugins: one instance per maintainer incarnation.

    The maintainer calls :meth:`bind` once, then :meth:`tick` periodically.
    Manual operations (:meth:`move_table`, :meth:`rebalance`) may be called
    between ticks; their effect shows in the messages of the following ticks.
    The scheduler never talks to captures itself and never blocks.
    """

    changefeed_id: str = ""
    epoch: int = 0
    _seq: int = 0

    def bind(self, changefeed_id: str, epoch: int) -> None:
        """Schedule ``changefeed_id`` for the maintainer incarnation ``epoch``.

        ``epoch`` must grow each time a maintainer for the changefeed starts
        (anywhere), so that agents can drop the requests of an older one.
        """
        self.changefeed_id = changefeed_id
        self.epoch = epoch

    def heartbeat_request(self, capture_id: str) -> HeartbeatRequest:
        """A heartbeat request to ``capture_id`` with this scheduler's next seq."""
        self._seq += 1
        return HeartbeatRequest(self.changefeed_id, capture_id, self.epoch, seq=self._seq)

    def dispatch_request(self, capture_id: str, task: AddSpan | RemoveSpan) -> DispatchTableRequest:
        """A dispatch request to ``capture_id`` with this scheduler's next seq."""
        self._seq += 1
        return DispatchTableRequest(self.changefeed_id, capture_id, self.epoch, task, seq=self._seq)

    def accepts(self, msg: AgentMessage) -> bool:
        """Whether ``msg`` is for this changefeed and epoch."""
        return msg.changefeed_id == self.changefeed_id and msg.epoch == self.epoch

    @abc.abstractmethod
    def tick(
        self,
        *,
        checkpoint_ts: int,
        spans: Sequence[Span],
        captures: Collection[str],
        messages: Sequence[AgentMessage],
    ) -> TickResult:
        """Advance scheduling by one step.

        ``checkpoint_ts``: the changefeed's persisted checkpoint; spans that
        are added start from it (or from their own, higher, last checkpoint).
        ``spans``: every span the changefeed must replicate now; a span no
        longer listed is removed from its capture. ``captures``: the live
        captures (membership from the metastore); a capture that disappears
        is dead and its spans are rescheduled. ``messages``: agent responses
        received since the last tick, in arrival order (duplicates, reordering
        and stale epochs are tolerated).
        """

    @abc.abstractmethod
    def replication_status(self) -> list[SpanReplication]:
        """Every span's scheduling status, ordered by span."""

    def move_table(self, table_id: int, target_capture: str) -> list[Span]:
        """Move every span of ``table_id`` to ``target_capture``.

        Returns the spans that will move (spans already there are left out).
        Raises :class:`InvalidScheduleRequestError` for an unknown table or a
        capture that is not alive. Schedulers that cannot move raise
        ``NotAvailableError``.
        """
        raise NotAvailableError(
            f"scheduler {self.type_name!r} cannot move tables; use the two-phase scheduler",
            detail={"changefeed_id": self.changefeed_id, "table_id": table_id},
        )

    def rebalance(self) -> None:
        """Spread spans evenly over the live captures on the coming ticks
        (schedulers without balancing ignore it)."""
