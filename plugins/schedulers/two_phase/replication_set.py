"""One span's replication across captures: seed 002's ``ReplicationSet``.

The set is a state machine over :class:`ReplicationState` (Absent, Prepare,
Commit, Replicating, Removing) with a ``primary`` capture (the one writing
downstream) and a ``secondary`` (one that has the span loaded and caught up,
but writes nothing). It changes state only on what agents report (``observe``)
and on membership (``capture_lost``); the scheduler's decisions (``add``,
``move``, ``remove``) only start a transition. Every method returns the
:class:`Command` s to send.

Transitions (seed 002):

* add: Absent → Prepare (secondary loads from the checkpoint) → Commit
  (secondary prepared; it is promoted to primary and told to replicate) →
  Replicating (the primary reports replicating).
* move: Replicating → Prepare (target loads while the primary keeps
  replicating) → Commit (target prepared; the primary is told to stop) →
  on the primary's STOPPED, the target is promoted in the same step →
  Replicating. The primary role is never empty during a move unless the
  primary capture dies; two captures never replicate at once, because the
  target is told to replicate only after the source reported it stopped.
* remove: Replicating → Removing → Absent, keeping the last checkpoint.

Guarantees: at most one primary; ``checkpoint_ts`` and ``resolved_ts`` never
go backwards; a report that a span is absent from a capture is believed only
once that capture has acknowledged the latest request sent to it about the
span (``ack``), so a request still in flight is not mistaken for a loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdcflow.core.control.scheduling import AddSpan, RemoveSpan, ReplicationState, SpanReplication
from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SpanState, SpanStatus

__all__ = ["Command", "ReplicationSet"]

_GONE = {SpanState.ABSENT, SpanState.STOPPED}


@dataclass(frozen=True, slots=True)
class Command:
    """A task to send to the agent on ``capture``."""

    capture: str
    task: AddSpan | RemoveSpan


class ReplicationSet:
    """The replication state of one span."""

    __slots__ = ("_sent", "checkpoint_ts", "primary", "resolved_ts", "secondary", "span", "state")

    def __init__(self, span: Span, checkpoint_ts: int) -> None:
        self.span = span
        self.state = ReplicationState.ABSENT
        self.primary: str | None = None
        self.secondary: str | None = None
        self.checkpoint_ts = checkpoint_ts
        self.resolved_ts = checkpoint_ts
        # Per capture: seq of the newest request sent to it about this span.
        self._sent: dict[str, int] = {}

    def __repr__(self) -> str:
        return (
            f"ReplicationSet({self.span}, {self.state.value}, primary={self.primary}, "
            f"secondary={self.secondary}, checkpoint={self.checkpoint_ts})"
        )

    # -- decisions -----------------------------------------------------------------

    def add(self, capture: str) -> list[Command]:
        """Absent → Prepare on ``capture``; nothing in any other state."""
        if self.state is not ReplicationState.ABSENT:
            return []
        self.state = ReplicationState.PREPARE
        self.secondary = capture
        return [self._prepare(capture)]

    def move(self, target: str) -> list[Command]:
        """Replicating → Prepare on ``target`` while the primary keeps replicating."""
        if self.state is not ReplicationState.REPLICATING or target == self.primary:
            return []
        self.state = ReplicationState.PREPARE
        self.secondary = target
        return [self._prepare(target)]

    def remove(self) -> list[Command]:
        """Replicating → Removing; other states first finish what they do."""
        if self.state is not ReplicationState.REPLICATING or self.primary is None:
            return []
        self.state = ReplicationState.REMOVING
        return [Command(self.primary, RemoveSpan(self.span))]

    def note_sent(self, capture: str, seq: int) -> None:
        """The command for ``capture`` went out as request ``seq``."""
        self._sent[capture] = seq

    @property
    def is_moving(self) -> bool:
        """A move is under way: a primary and a secondary at once."""
        return self.primary is not None and self.secondary is not None

    def status(self) -> SpanReplication:
        return SpanReplication(
            self.span, self.state, self.primary, self.secondary, self.checkpoint_ts, self.resolved_ts
        )

    # -- what agents and membership say --------------------------------------------

    def observe(self, capture: str, status: SpanStatus, ack: int) -> list[Command]:
        """``capture`` reports ``status`` for this span, having accepted requests up to ``ack``."""
        acked = ack >= self._sent.get(capture, 0)
        if status.state in _GONE and not acked:
            return []  # our latest request to it may still be in flight
        if capture == self.primary:
            self._progress(status)
            return self._from_primary(capture, status.state, acked)
        if capture == self.secondary:
            return self._from_secondary(capture, status.state)
        return self._from_stray(capture, status)

    def capture_lost(self, capture: str) -> list[Command]:
        """``capture`` left the membership: whatever it held is gone."""
        self._sent.pop(capture, None)
        if capture == self.secondary:
            self.secondary = None
            if self.state is ReplicationState.PREPARE:
                self.state = ReplicationState.REPLICATING if self.primary else ReplicationState.ABSENT
            elif self.state is ReplicationState.COMMIT:
                # The source was told to stop; let it finish, then add the span again.
                self.state = ReplicationState.REMOVING if self.primary else ReplicationState.ABSENT
            return []
        if capture != self.primary:
            return []
        self.primary = None
        if self.state is ReplicationState.PREPARE:
            return []  # the move becomes a plain add on the secondary
        if self.state is ReplicationState.COMMIT and self.secondary is not None:
            return self._promote()
        self._absent()
        return []

    # -- transitions ---------------------------------------------------------------

    def _from_primary(self, capture: str, state: SpanState, acked: bool) -> list[Command]:
        if self.state is ReplicationState.COMMIT and self.secondary is None:
            return self._from_promoted(capture, state, acked)
        if state is SpanState.STOPPING:
            if self.state is ReplicationState.REPLICATING:
                self.state = ReplicationState.REMOVING  # it stops on its own (e.g. shutting down)
            return []
        if state in _GONE:
            self.primary = None
            if self.state is ReplicationState.COMMIT:
                return self._promote()  # the source stopped: the target takes over now
            if self.state is not ReplicationState.PREPARE:
                self._absent()
            return []  # Prepare: the move goes on as a plain add on the secondary
        told_to_stop = self.state in (ReplicationState.COMMIT, ReplicationState.REMOVING)
        if state is SpanState.REPLICATING and told_to_stop and acked:
            return [Command(capture, RemoveSpan(self.span))]  # the stop request was lost: again
        return []

    def _from_promoted(self, capture: str, state: SpanState, acked: bool) -> list[Command]:
        if state is SpanState.REPLICATING:
            self.state = ReplicationState.REPLICATING
            return []
        if state in _GONE or (state is SpanState.PREPARED and acked):
            return [self._replicate(capture)]  # lost, or not yet asked as far as we know: again
        return []

    def _from_secondary(self, capture: str, state: SpanState) -> list[Command]:
        if state in _GONE:
            if self.state is ReplicationState.PREPARE:
                return [self._prepare(capture)]  # never got (or lost) the prepare: again
            # Commit: the target lost the span while the source is stopping; add it again later.
            self.secondary = None
            self.state = ReplicationState.REMOVING
            return []
        if state is SpanState.PREPARED and self.state is ReplicationState.PREPARE:
            self.state = ReplicationState.COMMIT
            if self.primary is None:
                return self._promote()
            return [Command(self.primary, RemoveSpan(self.span))]
        if state is SpanState.REPLICATING:
            if self.primary is None:
                self.primary, self.secondary = capture, None
                self.state = ReplicationState.REPLICATING
                return []
            # Never two writers: a secondary must not replicate while there is a primary.
            self.secondary = None
            told_to_stop = self.state is ReplicationState.COMMIT
            self.state = ReplicationState.REMOVING if told_to_stop else ReplicationState.REPLICATING
            return [Command(capture, RemoveSpan(self.span))]
        return []

    def _from_stray(self, capture: str, status: SpanStatus) -> list[Command]:
        """A capture holds the span though the set does not count on it."""
        if status.state in _GONE:
            return []
        if self.state is ReplicationState.ABSENT and status.state in (SpanState.REPLICATING, SpanState.STOPPING):
            # Adopt what already runs (a new maintainer learning the cluster).
            self.checkpoint_ts = max(self.checkpoint_ts, status.checkpoint_ts)
            self.resolved_ts = max(self.resolved_ts, status.resolved_ts, self.checkpoint_ts)
            self.primary = capture
            replicating = status.state is SpanState.REPLICATING
            self.state = ReplicationState.REPLICATING if replicating else ReplicationState.REMOVING
            return []
        if status.state is SpanState.STOPPING:
            return []
        # A copy nobody asked for (an older maintainer's prepare, a second
        # writer): stop it. A prepared copy is never promoted from here, since
        # another capture may still be replicating the span unseen.
        return [Command(capture, RemoveSpan(self.span))]

    def _promote(self) -> list[Command]:
        """The secondary becomes the primary and is told to replicate (state Commit)."""
        assert self.secondary is not None
        self.primary, self.secondary = self.secondary, None
        self.state = ReplicationState.COMMIT
        return [self._replicate(self.primary)]

    def _absent(self) -> None:
        self.state = ReplicationState.ABSENT
        self.primary = self.secondary = None

    def _prepare(self, capture: str) -> Command:
        return Command(capture, AddSpan(self.span, self.checkpoint_ts, is_secondary=True))

    def _replicate(self, capture: str) -> Command:
        return Command(capture, AddSpan(self.span, self.checkpoint_ts, is_secondary=False))

    def _progress(self, status: SpanStatus) -> None:
        """Take the primary's progress; never go backwards."""
        if status.state is SpanState.REPLICATING or status.state in (SpanState.STOPPING, SpanState.STOPPED):
            self.checkpoint_ts = max(self.checkpoint_ts, status.checkpoint_ts)
            self.resolved_ts = max(self.resolved_ts, status.resolved_ts, self.checkpoint_ts)
