"""The controller: the coordinator's state machine (seed 000 "controller").

It interprets events — maintainer heartbeats, bootstrap responses, capture
changes, lifecycle requests, the passage of time — and answers with
:class:`Decisions`: changefeed records to persist, checkpoints to persist,
and commands for maintainer managers. It never persists or sends anything
itself ("the controller decides, the coordinator carries out"), so that every
rule can be tested with plain calls.

Rules worth knowing:

* Every maintainer incarnation has an epoch. Starting, restarting, moving or
  resuming a changefeed bumps the epoch in the persisted record first; a
  heartbeat of another epoch never changes progress or state, and a stale
  maintainer that still reports is told to go away.
* A checkpoint only moves forward.
* A retryable error makes the changefeed Warning; its maintainer is restarted
  with a new epoch after an exponential backoff (tenacity's). A fatal error,
  or a Warning older than the error-stuck duration, makes it Failed.
* A maintainer that stops heartbeating (capture alive) is a 4002 heartbeat
  timeout: Warning, and restarted elsewhere. A capture that leaves has its
  maintainers moved at once with a new epoch (no Warning: nothing failed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tenacity import RetryCallState, wait_exponential

from cdcflow.core.control.changefeed import ChangeFeedInfo, ChangefeedState, ChangeFeedStatus, check_transition
from cdcflow.core.control.messaging.messages import BlockStatusRequest, MaintainerStatus
from cdcflow.core.errors import CheckpointStaleError, HeartbeatTimeoutError, Retryable, Severity

__all__ = [
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "AddMaintainer",
    "ChangefeedRuntime",
    "Controller",
    "Decisions",
    "RemoveMaintainer",
]

S = ChangefeedState

#: Seconds without a maintainer heartbeat before its changefeed is moved to another capture.
DEFAULT_HEARTBEAT_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class AddMaintainer:
    capture: str
    changefeed_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class RemoveMaintainer:
    capture: str
    changefeed_id: str
    epoch: int


Command = AddMaintainer | RemoveMaintainer


@dataclass
class Decisions:
    """What the coordinator must carry out, in this order: persist ``infos``
    (each with its version bumped by one), delete ``removed``, then send
    ``commands``. ``checkpoints`` go to the batched checkpoint queue."""

    infos: list[ChangeFeedInfo] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    checkpoints: dict[str, ChangeFeedStatus] = field(default_factory=dict)
    state_changes: list[tuple[str, S, S, dict[str, Any] | None]] = field(default_factory=list)
    #: The snapshot records the changefeeds' maintainers report (stored when they changed;
    #: a complete one is acknowledged to its maintainer once stored).
    snapshot_records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def extend(self, other: Decisions) -> None:
        self.infos.extend(other.infos)
        self.removed.extend(other.removed)
        self.commands.extend(other.commands)
        self.checkpoints.update(other.checkpoints)
        self.state_changes.extend(other.state_changes)
        self.snapshot_records.update(other.snapshot_records)


@dataclass
class ChangefeedRuntime:
    """The controller's view of one changefeed."""

    info: ChangeFeedInfo
    status: ChangeFeedStatus
    capture: str | None = None
    last_heartbeat: float = 0.0
    retry_at: float | None = None
    retries: int = 0
    warning_checkpoint: int = 0
    #: What the maintainer last said blocks it (BlockStatus), None when nothing does.
    block_reason: str | None = None
    #: The initial snapshot's progress its maintainer last reported (None: none known).
    snapshot: dict[str, Any] | None = None
    #: The snapshot record as stored in the metastore (None: none).
    snapshot_record: dict[str, Any] | None = None


class Controller:
    """See the module docstring. All methods take ``now`` (seconds) so time is explicit."""

    def __init__(self, *, heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, backoff_max: float = 60.0) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self._backoff = wait_exponential(multiplier=1.0, min=1.0, max=backoff_max)
        self.changefeeds: dict[str, ChangefeedRuntime] = {}
        self.captures: list[str] = []

    # -- loading and bootstrap -----------------------------------------------------------

    def load(
        self,
        records: Iterable[tuple[ChangeFeedInfo, ChangeFeedStatus]],
        snapshot_records: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        for info, status in records:
            if info.state is not S.REMOVED:
                record = (snapshot_records or {}).get(info.id)
                self.changefeeds[info.id] = ChangefeedRuntime(info, status, snapshot_record=record)

    def bootstrap(
        self, reports: dict[str, Sequence[MaintainerStatus]], captures: Sequence[str], now: float
    ) -> Decisions:
        """Adopt the maintainers the managers already run (same epoch), remove the
        others, and place every changefeed that should run but runs nowhere."""
        self.captures = sorted(captures)
        out = Decisions()
        for capture, statuses in sorted(reports.items()):
            for st in statuses:
                rt = self.changefeeds.get(st.changefeed_id)
                ours = rt is not None and rt.info.state.runs and st.epoch == rt.info.epoch and rt.capture is None
                if ours and rt is not None and st.state == "working":
                    rt.capture = capture
                    rt.last_heartbeat = now
                elif st.state == "working":
                    out.commands.append(RemoveMaintainer(capture, st.changefeed_id, st.epoch))
        for rt in self.changefeeds.values():
            if rt.info.state.runs and rt.capture is None and rt.retry_at is None:
                out.extend(self._start(rt, now))
        return out

    # -- captures -------------------------------------------------------------------------

    def on_captures(self, captures: Sequence[str], now: float) -> Decisions:
        """The live captures changed: move maintainers off the ones that left."""
        self.captures = sorted(captures)
        out = Decisions()
        for rt in self.changefeeds.values():
            if rt.capture is not None and rt.capture not in self.captures:
                rt.capture = None
                if rt.info.state.runs and rt.retry_at is None:
                    out.extend(self._start(rt, now))
            elif rt.info.state.runs and rt.capture is None and rt.retry_at is None:
                out.extend(self._start(rt, now))
        return out

    def _pick_capture(self, avoid: str | None = None) -> str | None:
        if not self.captures:
            return None
        load = {c: 0 for c in self.captures}
        for rt in self.changefeeds.values():
            if rt.capture in load:
                load[rt.capture] += 1
        choices = [c for c in self.captures if c != avoid] or list(self.captures)
        return min(choices, key=lambda c: (load[c], c))

    def _start(self, rt: ChangefeedRuntime, now: float, avoid: str | None = None) -> Decisions:
        """Run the changefeed's maintainer with a new epoch on the least-loaded capture."""
        out = Decisions()
        target = self._pick_capture(avoid)
        if rt.capture is not None:
            out.commands.append(RemoveMaintainer(rt.capture, rt.info.id, rt.info.epoch))
            rt.capture = None
        if target is None:
            return out  # no capture yet: placed by on_captures
        rt.info = rt.info.with_changes(epoch=rt.info.epoch + 1, version=rt.info.version + 1)
        out.infos.append(rt.info)
        rt.capture = target
        rt.last_heartbeat = now
        rt.retry_at = None
        out.commands.append(AddMaintainer(target, rt.info.id, rt.info.epoch))
        return out

    def _stop(self, rt: ChangefeedRuntime) -> Decisions:
        out = Decisions()
        if rt.capture is not None:
            out.commands.append(RemoveMaintainer(rt.capture, rt.info.id, rt.info.epoch))
            rt.capture = None
        rt.retry_at = None
        rt.snapshot = None
        return out

    def _transition(
        self, rt: ChangefeedRuntime, new: S, now: float, error: dict[str, Any] | None = None, reason: str = ""
    ) -> Decisions:
        old = rt.info.state
        check_transition(rt.info.id, old, new, reason)
        changes: dict[str, Any] = {"state": new, "version": rt.info.version + 1, "state_changed_at": now}
        if new is S.WARNING:
            changes["error"] = error
            changes["warning_since"] = rt.info.warning_since if old is S.WARNING else now
        elif new is S.FAILED:
            changes["error"] = error or rt.info.error
        else:
            changes["error"] = None
            changes["warning_since"] = None
        rt.info = rt.info.with_changes(**changes)
        out = Decisions(infos=[rt.info], state_changes=[(rt.info.id, old, new, error)])
        if not new.runs:
            out.extend(self._stop(rt))
        return out

    # -- heartbeats ----------------------------------------------------------------------

    def on_heartbeat(self, capture: str, statuses: Sequence[MaintainerStatus], now: float) -> Decisions:
        out = Decisions()
        for st in statuses:
            rt = self.changefeeds.get(st.changefeed_id)
            if rt is not None and st.state == "stopped" and st.epoch == rt.info.epoch and not rt.info.state.runs:
                out.extend(self._progress(rt, st))  # the CloseAck of a pause carries the final checkpoint
                continue
            if rt is None or st.epoch != rt.info.epoch or rt.capture != capture or not rt.info.state.runs:
                if st.state == "working" and (rt is None or st.epoch < rt.info.epoch or not rt.info.state.runs):
                    out.commands.append(RemoveMaintainer(capture, st.changefeed_id, st.epoch))
                continue
            rt.last_heartbeat = now
            rt.snapshot = st.snapshot
            if st.snapshot_record is not None:
                out.snapshot_records[rt.info.id] = st.snapshot_record
            out.extend(self._progress(rt, st))
            if st.error is not None or st.state == "failed":
                out.extend(self._on_error(rt, st.error or {}, now))
            elif rt.info.state is S.WARNING and rt.status.checkpoint_ts > rt.warning_checkpoint:
                rt.retries = 0
                out.extend(self._transition(rt, S.NORMAL, now, reason="the maintainer made progress again"))
            elif st.state == "stopped":
                rt.capture = None  # closed by itself: start again
                out.extend(self._start(rt, now))
            if rt.info.target_ts and rt.status.checkpoint_ts >= rt.info.target_ts and rt.info.state.runs:
                out.extend(self._transition(rt, S.FINISHED, now, reason="target ts reached"))
        return out

    def on_block_status(self, capture: str, block: BlockStatusRequest, now: float) -> Decisions:
        """A maintainer says what blocks it; an error in it is handled like a heartbeat's."""
        rt = self.changefeeds.get(block.changefeed_id)
        if rt is None or block.epoch != rt.info.epoch or rt.capture != capture or not rt.info.state.runs:
            return Decisions()
        rt.block_reason = block.reason or None
        if block.error is not None:
            return self._on_error(rt, block.error, now)
        return Decisions()

    def _progress(self, rt: ChangefeedRuntime, st: MaintainerStatus) -> Decisions:
        out = Decisions()
        checkpoint = max(rt.status.checkpoint_ts, st.checkpoint_ts)
        resolved = max(rt.status.resolved_ts, st.resolved_ts, checkpoint)
        if rt.info.target_ts:
            checkpoint = min(checkpoint, max(rt.info.target_ts, rt.status.checkpoint_ts))
        if (checkpoint, resolved) != (rt.status.checkpoint_ts, rt.status.resolved_ts):
            rt.status = ChangeFeedStatus(checkpoint, resolved, rt.status.version)
            out.checkpoints[rt.info.id] = rt.status
        return out

    def _on_error(self, rt: ChangefeedRuntime, error: dict[str, Any], now: float) -> Decisions:
        fatal = error.get("retryable") == Retryable.NONE.value or error.get("severity") == Severity.FATAL.value
        if fatal:
            if rt.info.state is S.WARNING or rt.info.state is S.NORMAL:
                return self._transition(rt, S.FAILED, now, error, reason="fatal error")
            return Decisions()
        return self._warn(rt, error, now)

    def _warn(self, rt: ChangefeedRuntime, error: dict[str, Any], now: float) -> Decisions:
        out = Decisions()
        if rt.info.state is not S.WARNING:
            out.extend(self._transition(rt, S.WARNING, now, error))
        elif error != rt.info.error:
            rt.info = rt.info.with_changes(error=error, version=rt.info.version + 1)
            out.infos.append(rt.info)
        rt.warning_checkpoint = rt.status.checkpoint_ts
        rt.retries += 1
        out.extend(self._stop(rt))
        rt.retry_at = now + self.backoff(rt.retries)
        return out

    def backoff(self, attempt: int) -> float:
        """Seconds before restart ``attempt`` (tenacity's exponential wait)."""
        state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number = attempt
        return float(self._backoff(state))

    # -- time -----------------------------------------------------------------------------------

    def tick(self, now: float) -> Decisions:
        out = Decisions()
        for rt in list(self.changefeeds.values()):
            info = rt.info
            stuck = info.warning_since is not None and now - info.warning_since >= info.error_stuck_duration
            if info.state is S.WARNING and stuck:
                out.extend(self._transition(rt, S.FAILED, now, info.error, reason="retries did not succeed in time"))
                continue
            if rt.retry_at is not None and now >= rt.retry_at and info.state.runs:
                out.extend(self._start(rt, now))
            elif rt.capture is not None and info.state.runs and now - rt.last_heartbeat > self.heartbeat_timeout:
                lost = rt.capture
                error = HeartbeatTimeoutError(
                    f"changefeed {info.id}: no heartbeat from its maintainer on capture {lost} "
                    f"for {now - rt.last_heartbeat:.1f}s",
                    detail={"changefeed_id": info.id, "capture": lost},
                ).to_dict()
                out.extend(self._warn(rt, error, now))
                rt.retry_at = now  # move it at once, to another capture
                out.extend(self._start(rt, now, avoid=lost))
        return out

    # -- lifecycle requests ------------------------------------------------------------------

    def create(self, info: ChangeFeedInfo, status: ChangeFeedStatus, now: float) -> Decisions:
        """A changefeed that the coordinator has just stored (state Normal)."""
        rt = ChangefeedRuntime(info, status)
        self.changefeeds[info.id] = rt
        return self._start(rt, now)

    def pause(self, changefeed_id: str, now: float) -> Decisions:
        rt = self.changefeeds[changefeed_id]
        if rt.info.state is S.PAUSED:
            return Decisions()  # pausing a paused changefeed is a no-op success
        return self._transition(rt, S.PAUSED, now, reason="pause requested")

    def resume(self, changefeed_id: str, now: float, overwrite_checkpoint_ts: int | None = None) -> Decisions:
        rt = self.changefeeds[changefeed_id]
        if rt.info.state is S.NORMAL:
            return Decisions()
        out = self._transition(rt, S.NORMAL, now, reason="resume requested")
        if overwrite_checkpoint_ts is not None:
            rt.status = ChangeFeedStatus(overwrite_checkpoint_ts, overwrite_checkpoint_ts, rt.status.version)
        rt.retries = 0
        out.extend(self._start(rt, now))
        return out

    def remove(self, changefeed_id: str, now: float) -> Decisions:
        rt = self.changefeeds.pop(changefeed_id)
        check_transition(changefeed_id, rt.info.state, S.REMOVED)
        out = self._stop(rt)
        out.removed.append(changefeed_id)
        out.state_changes.append((changefeed_id, rt.info.state, S.REMOVED, None))
        return out

    def update(self, info: ChangeFeedInfo) -> Decisions:
        """Replace a paused (or failed/finished) changefeed's declaration."""
        rt = self.changefeeds[info.id]
        if rt.info.state.runs:
            from cdcflow.core.control.changefeed import InvalidTransitionError

            raise InvalidTransitionError(
                f"changefeed {info.id} is {rt.info.state.value}: pause it before updating it",
                detail={"changefeed_id": info.id, "state": rt.info.state.value},
            )
        rt.info = info.with_changes(
            state=rt.info.state, epoch=rt.info.epoch, version=rt.info.version + 1, error=rt.info.error
        )
        return Decisions(infos=[rt.info])

    def fail_stale(self, changefeed_id: str, error: CheckpointStaleError, now: float) -> Decisions:
        """The checkpoint fell behind the upstream GC safepoint (5001): Failed."""
        rt = self.changefeeds.get(changefeed_id)
        if rt is None or rt.info.state not in (S.NORMAL, S.WARNING):
            return Decisions()
        return self._transition(rt, S.FAILED, now, error.to_dict(), reason="checkpoint is stale")

    def reload(self, info: ChangeFeedInfo, status: ChangeFeedStatus) -> None:
        """Take a record re-read after a metastore conflict."""
        rt = self.changefeeds.get(info.id)
        if rt is None:
            self.changefeeds[info.id] = ChangefeedRuntime(info, status)
        else:
            rt.info = info
            rt.status = ChangeFeedStatus(
                max(status.checkpoint_ts, rt.status.checkpoint_ts), max(status.resolved_ts, rt.status.resolved_ts)
            )
