"""The boundary between the control plane and the data plane on one capture.

A maintainer places a changefeed's spans on captures (through its scheduler
plugin). On each capture, the changefeed's :class:`SpanExecutor` carries out
those decisions: it loads a span from a checkpoint (feeds it from the source
into the event store), starts replicating it to the sinks, stops it, and
reports each span's progress. This is seed 002's ``TableExecutor`` for spans.

Two-phase scheduling (seed 002) uses ``prepare``: a prepared span catches up
from its checkpoint — its feed runs and events are buffered — but nothing is
written downstream until the span is added again with ``prepare=False``.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass

from cdcflow.core.data.events import Span

__all__ = ["SpanExecutor", "SpanState", "SpanStatus"]


class SpanState(enum.Enum):
    """The state of one span on one capture (seed 002's table state)."""

    ABSENT = "absent"
    PREPARING = "preparing"
    PREPARED = "prepared"
    REPLICATING = "replicating"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class SpanStatus:
    """Progress of one span on one capture.

    ``checkpoint_ts``: every change of the span at or below it is flushed by
    every sink. ``resolved_ts``: every change at or below it has been received
    from the upstream. Neither goes backwards while the span stays loaded.
    """

    span: Span
    state: SpanState
    checkpoint_ts: int
    resolved_ts: int


class SpanExecutor(abc.ABC):
    """Runs a changefeed's spans that are placed on this capture."""

    @abc.abstractmethod
    async def add_span(self, span: Span, checkpoint_ts: int, *, prepare: bool) -> bool:
        """Load ``span`` from ``checkpoint_ts`` (``prepare=True``: catch up
        without writing downstream) or start replicating it (``prepare=False``).

        Idempotent; returns whether the requested state has been reached.
        """

    @abc.abstractmethod
    async def remove_span(self, span: Span) -> int | None:
        """Stop ``span`` and release it. Idempotent; returns the span's final
        checkpoint once it is fully stopped, None while it is still stopping."""

    @abc.abstractmethod
    def status(self, span: Span) -> SpanStatus:
        """The span's state and progress (``ABSENT`` when not loaded here)."""

    @abc.abstractmethod
    def spans(self) -> list[Span]:
        """Every span loaded here: being added, replicating or being removed.

        Two calls with no add/remove in between return the same spans.
        """

    async def set_barrier(self, ts: int) -> None:  # noqa: B027 - optional hook
        """Do not write changes with commit ts above ``ts`` downstream until the
        barrier moves (the DDL barrier, set by the maintainer)."""

    async def set_changefeed_checkpoint(self, ts: int) -> None:  # noqa: B027 - optional hook
        """The changefeed's checkpoint, computed by its maintainer: the minimum
        checkpoint over *all* the changefeed's spans (on every capture), withheld
        while a span runs nowhere. Every change at or below ``ts`` has been
        flushed by every sink of every capture.

        Executors hand it to their sinks (``Sink.write_checkpoint``), which may
        promise it to consumers (Kafka resolved events); a span's own
        checkpoint or this capture's frontier may not be promised, since spans
        elsewhere or joining later can still deliver rows below them. Called
        with every heartbeat of the maintainer (a repeat or a lower value after
        a maintainer moved is ignored: it only moves forward). Must not block:
        writing happens in the background."""

    def error(self) -> BaseException | None:
        """The error that stopped this executor's spans, if any (a
        :class:`~cdcflow.core.errors.CdcflowError` for known failures). The span
        agent reports it to the maintainer, which reports it to the coordinator."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop every span and release resources."""
