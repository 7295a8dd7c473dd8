"""The maintainer: one per changefeed, on one capture (seed 000, seed 002).

It lists the changefeed's spans (through the source plugin and the table
filter) and ticks the changefeed's scheduler plugin (through
:mod:`~cdcflow.core.control.maintainer.placement`), which places the spans on the
captures' agents and reports the watermark: the minimum checkpoint and
resolved ts over spans, withheld while a span runs nowhere. The maintainer's
checkpoint and resolved ts only move forward.

When the source's table set changes while the changefeed runs (tables
created, dropped, truncated, renamed), the maintainer keeps the source open,
follows its table-set changes and adds and removes spans at each change's
commit ts (:mod:`~cdcflow.core.control.maintainer.tables`): the changefeed's barrier,
sent with every request to the agents, holds the captures at the change, and
the checkpoint never passes it before the spans are in place.

Its heartbeat requests carry its checkpoint to every capture (the executors
hand it to their sinks: Kafka resolved events). That value is safe to promise
consumers: it is either the checkpoint the changefeed started from (flushed
by the previous run, or the start ts) or a watermark, the minimum of the
spans' checkpoints, each of which moves only once every sink of the capture
running the span flushed its rows. It is sent as soon as a tick computes it,
not after the coordinator persisted it (``CheckpointTsMessage``): persisting
decides where a restart resumes, not whether rows were written, and the
persisted value is never above it.

**An initial snapshot shared by a cluster.** A changefeed with
``initial-snapshot: true`` whose checkpoint is still its start ts T, started
while more than one capture is alive, has its snapshot read by all of them:
the maintainer has the source plan the snapshot (one part per region or key
range, each naming its key range: ``SnapshotTask.key_range``) and gives the
scheduler those ranges (:mod:`cdcflow.core.data.snapshot_ranges`) instead of
the tables' spans. The scheduler places them like spans (two-phase add,
balance, and a capture's unfinished ranges placed again when it dies: the new
capture reads them from scratch); each capture reads the ranges it is given
in Spark tasks and delivers each to every sink at T, then reports it done.
Only when every range is done, and the coordinator stored that (below), does
the maintainer give the scheduler the tables' spans, added from T: their
changes above T reach the sinks after every snapshot row of their table,
which is what upserting sinks need (a snapshot row delivered late would
overwrite a newer value). Meanwhile the checkpoint stays T, so the GC
safepoint protects T.

The ranges delivered are kept in the metastore: the maintainer's status
carries the snapshot's record (:class:`~cdcflow.core.data.snapshot_ranges.SnapshotRecord`:
the key ranges delivered, merged, and whether every range is), which the
coordinator stores when it changed and hands to the changefeed's next
maintainer (``AddMaintainerRequest.snapshot_record``). A maintainer started
with a record of its snapshot places only the key ranges the record does not
cover (:func:`~cdcflow.core.data.snapshot_ranges.remaining`: regions may have
split or merged since), with as few captures as one, and places the tables at
once when the record is complete. The tables are placed only after the
coordinator acknowledged the complete record (``CheckpointTsMessage.snapshot_complete``),
so no maintainer can place a range again once changes above T may have reached
a sink. (A new maintainer that finds a table's span running on a capture knows
an earlier one got that far too, and places the tables at once.) The requests carry the changefeed
with ``initial_snapshot`` off, so that no executor takes a snapshot of its own
spans on top. With one capture alive (``cdcflow run``), or a source that cannot
name its parts' key ranges, the capture running the spans copies them before
streaming them, as before (:mod:`cdcflow.core.data.pipeline.snapshot`).

**The snapshot's progress** is the whole changefeed's, on the maintainer: the
captures send theirs with every heartbeat response (``HeartbeatResponse.snapshot``:
one :class:`~cdcflow.core.data.span_executor.SnapshotReport` per snapshot range
being read there, or one for the snapshot a capture takes of its own spans). On a
cluster the parts are the ranges placed, done once delivered (the same count that
decides when the tables are placed), and the rows are those of every range's
latest report, summed; otherwise every live capture's own snapshot is summed.
:meth:`Maintainer.snapshot_progress` is what the maintainer's status carries to
the coordinator (``MaintainerStatus.snapshot``), which the REST API and the
status page show.

Errors of the source, the scheduler or an executor are kept as the
maintainer's error and reported in its status; the coordinator decides what
they mean for the changefeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.control.coordinator.spec import connector_for
from cdcflow.core.control.maintainer.placement import Placement, decode
from cdcflow.core.control.maintainer.tables import ChangefeedTables
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import MaintainerStatus, SchedulingMessage, Topic
from cdcflow.core.control.scheduling import HeartbeatResponse, ReplicationState, Scheduler, SpanReplication, Watermark
from cdcflow.core.data.events import ResolvedEvent, Span, TableSetChange
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.snapshot_ranges import (
    SnapshotRecord,
    is_snapshot_range,
    merged,
    range_done_ts,
    range_keys,
    remaining,
    snapshot_range,
)
from cdcflow.core.data.source import Source
from cdcflow.core.data.span_executor import SnapshotReport, SpanState
from cdcflow.core.errors import CdcflowError, MaintainerCrashError, NotAvailableError
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["Maintainer"]

log = logging.getLogger(__name__)
TICK = 0.1
#: Span states that do not show a span runs on a capture.
_IDLE = frozenset({SpanState.ABSENT, SpanState.STOPPING, SpanState.STOPPED})


class Maintainer:
    def __init__(
        self,
        capture_id: str,
        center: MessageCenter,
        info: ChangeFeedInfo,
        checkpoint_ts: int,
        plugins: PluginManager,
        live_captures: Callable[[], list[str]],
        *,
        snapshot_record: SnapshotRecord | None = None,
    ) -> None:
        self.capture_id = capture_id
        self.center = center
        self.info = info
        self.plugins = plugins
        self.live_captures = live_captures
        self.checkpoint_ts = checkpoint_ts
        self.resolved_ts = checkpoint_ts
        self.state = "working"
        self.error: dict[str, Any] | None = None
        self.placement: Placement | None = None
        #: The changefeed's tables and the table-set changes still to carry out.
        self.tables: ChangefeedTables | None = None
        self._task: asyncio.Task[None] | None = None
        self._source: Source[Any] | None = None
        self._follower: asyncio.Task[None] | None = None
        #: The barrier sent to the agents last (None: no barrier).
        self._sent_barrier: int | None = None
        #: What blocks progress now (BlockStatus), "" when nothing does.
        self.block_reason = ""
        #: The snapshot ranges placed instead of the tables' spans until all are done
        #: (None: no snapshot shared by the cluster, or it is done).
        self.snapshot_ranges: frozenset[Span] | None = None
        #: The changefeed as the agents are told it (initial_snapshot off while ranges are placed).
        self._agent_info = info
        #: Every range placed for the cluster's snapshot (kept once it is done), its plan's
        #: unit, the ranges delivered so far, and when it started and ended (wall clock).
        self._placed_ranges: frozenset[Span] = frozenset()
        self._snapshot_unit = "range"
        self._delivered: frozenset[Span] = frozenset()
        self._snapshot_started = 0.0
        self._snapshot_finished: float | None = None
        #: The captures' latest snapshot reports: per snapshot range, and per capture for
        #: its own spans' snapshot; the newest heartbeat seq taken from each capture.
        self._range_reports: dict[Span, SnapshotReport] = {}
        self._range_capture: dict[Span, str] = {}
        self._own_reports: dict[str, SnapshotReport] = {}
        self._report_seq: dict[str, int] = {}
        #: The changefeed's snapshot progress as of the last tick (None: no snapshot known).
        self._progress: dict[str, Any] | None = None
        #: The snapshot's record as stored when this maintainer started (the ranges an
        #: earlier one saw delivered), the record as of the last tick, and whether the
        #: coordinator acknowledged it complete (then the tables are placed).
        self._prior = (
            snapshot_record
            if snapshot_record is not None and info.initial_snapshot and snapshot_record.ts == info.start_ts
            else None
        )
        self._record: SnapshotRecord | None = None
        self._record_kept = False
        #: The record's key ranges merged, and the delivered ranges they were merged from
        #: (rebuilt only when a range is delivered, not on every tick).
        self._merged_done: tuple[Span, ...] = ()
        self._merged_of: frozenset[Span] | None = None
        #: Set when a span's checkpoint moved: the next tick runs at once, not TICK later.
        self._wake = asyncio.Event()
        #: Called after a tick that moved the checkpoint (the manager's heartbeat goes then).
        self.on_progress: Callable[[], None] | None = None

    @property
    def changefeed_id(self) -> str:
        return self.info.id

    @property
    def epoch(self) -> int:
        return self.info.epoch

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"maintainer-{self.info.id}-{self.epoch}")

    def status(self) -> MaintainerStatus:
        total = len(self.placement.spans) if self.placement else 0
        replicating = self.placement.replicating() if self.placement else 0
        return MaintainerStatus(
            self.info.id,
            self.epoch,
            self.state,
            self.checkpoint_ts,
            self.resolved_ts,
            self.error,
            total,
            replicating,
            self._progress,
            self._record.to_json() if self._record is not None else None,
        )

    async def _run(self) -> None:
        try:
            self.placement = await self._list_spans()
            while True:
                if self._follower is not None and self._follower.done():
                    self._follower.result()  # raises what stopped it
                    self._follower = None  # the source ended its changes: nothing more to follow
                self._tick()
                # Every TICK, or at once when a response moves a span's checkpoint.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TICK):
                        await self._wake.wait()
                self._wake.clear()
        except asyncio.CancelledError:
            raise
        except CdcflowError as exc:
            self._fail(exc.to_dict())
        except Exception as exc:
            log.exception("maintainer of %s crashed", self.info.id)
            self._fail(MaintainerCrashError(f"maintainer of changefeed {self.info.id} crashed: {exc!r}").to_dict())
        finally:
            await self._release_source()

    def _fail(self, error: dict[str, Any]) -> None:
        self.error = error
        self.state = "failed"

    async def _list_spans(self) -> Placement:
        """The changefeed's tables at its checkpoint, and (when the source's table set
        changes) the follower of the changes after it, on a source kept open."""
        connector = connector_for(self.info, self.plugins)
        source: Source[Any] = connector.source.instantiate()  # type: ignore[assignment]
        scheduler: Scheduler[Any] = connector.scheduler.instantiate()  # type: ignore[assignment]
        table_filter = connector.settings.filter.table_filter()
        self._source = source
        await source.open()
        trigger = source.trigger_span()
        changes = source.table_changes(self.checkpoint_ts) if trigger is not None else None
        if changes is None:
            trigger = None
            listed = await source.list_tables()
        else:
            listed = await source.tables_at(self.checkpoint_ts)
        tables = {t: await source.spans_for(t) for t in listed if table_filter.matches(t.schema, t.table)}
        self.tables = ChangefeedTables(table_filter, tables, trigger, self.checkpoint_ts)
        ranges = await self._plan_snapshot(source, trigger)
        if changes is None:
            await self._release_source()
        else:
            self._follower = asyncio.create_task(
                self._follow(source, changes, table_filter), name=f"table-changes-{self.info.id}-{self.epoch}"
            )
        return Placement(scheduler, self.info.id, self.epoch, ranges if ranges is not None else self.tables.spans())

    async def _plan_snapshot(self, source: Source[Any], trigger: Span | None) -> list[Span] | None:
        """The snapshot ranges to place on the cluster (see the module docs), or None when
        the tables are placed: no snapshot, one the stored record says is complete, or one
        the capture running each span copies itself."""
        info, prior = self.info, self._prior
        if not info.initial_snapshot or self.checkpoint_ts != info.start_ts:
            return None
        if prior is not None and prior.complete:
            log.info("changefeed %s: the initial snapshot at %d was delivered; placing the tables", info.id, prior.ts)
            self._agent_info = dataclasses.replace(info, initial_snapshot=False)
            return None
        if prior is None and len(self.live_captures()) < 2:
            return None
        assert self.tables is not None
        spans = {i: span for i, span in enumerate(self.tables.spans()) if span != trigger and span.table_id > 0}
        if not spans:
            return None
        plan = await source.snapshot_plan(spans, self.checkpoint_ts)
        keys = [task.key_range() for task in plan.tasks]
        if any(k is None or k.table_id <= 0 for k in keys):
            return None
        planned = [k for k in keys if k is not None]
        left = planned if prior is None else remaining(planned, prior.done)
        ranges = [snapshot_range(k) for k in left]
        self.snapshot_ranges = self._placed_ranges = frozenset(ranges)
        self._snapshot_unit = plan.unit
        self._snapshot_started = prior.started_at if prior is not None else time.time()
        self._agent_info = dataclasses.replace(info, initial_snapshot=False)
        if prior is None:
            log.info(
                "changefeed %s: initial snapshot at %d placed on the cluster: %d %ss of %d spans",
                *(info.id, self.checkpoint_ts, len(ranges), plan.unit, len(spans)),
            )
        else:
            log.info(
                "changefeed %s: initial snapshot at %d resumed: %d range(s) delivered before; "
                "%d key range(s) of %d planned %ss left to place",
                *(info.id, self.checkpoint_ts, prior.parts_done, len(ranges), len(planned), plan.unit),
            )
        return ranges

    def snapshot_record(self) -> SnapshotRecord | None:
        """The record of the snapshot the cluster shares, as of now (see the module docs);
        None when none is being placed here."""
        if self.snapshot_ranges is None:
            return None
        prior, delivered = self._prior, self._delivered
        before = prior.parts_done if prior is not None else 0
        reports = self._range_reports
        rows = sum(reports[span].rows_done for span in delivered if span in reports)
        if delivered != self._merged_of:
            done = [*(prior.done if prior is not None else ()), *(range_keys(s) for s in delivered)]
            self._merged_done, self._merged_of = tuple(merged(done)), delivered
        complete = delivered >= self.snapshot_ranges
        last = self._record
        finished = None if not complete else last.finished_at if last is not None and last.finished_at else time.time()
        return SnapshotRecord(
            self.info.start_ts,
            self._merged_done,
            before + len(delivered),
            before + len(self._placed_ranges),
            (prior.rows_done if prior is not None else 0) + rows,
            complete,
            self._snapshot_started,
            finished,
            self._snapshot_unit,
        )

    def on_snapshot_kept(self) -> None:
        """The coordinator stored this snapshot's record complete: the tables may be placed."""
        if self._record is not None and self._record.complete:
            self._record_kept = True

    def _snapshot_done(self) -> bool:
        """Whether every snapshot range is delivered (then the tables' spans are placed)."""
        assert self.placement is not None and self.snapshot_ranges is not None
        done_ts = range_done_ts(self.info.start_ts)
        done = {
            r.span
            for r in self.placement.scheduler.replication_status()
            if r.span in self.snapshot_ranges and r.state is ReplicationState.REPLICATING and r.resolved_ts >= done_ts
        }
        self._delivered = frozenset(done & self.snapshot_ranges)
        return done >= self.snapshot_ranges

    async def _follow(
        self,
        source: Source[Any],
        changes: AsyncIterator[TableSetChange | ResolvedEvent],
        table_filter: TableFilter,
    ) -> None:
        """Take the source's table-set changes (with the spans of created tables) as they come."""
        assert self.tables is not None
        async for event in changes:
            if isinstance(event, TableSetChange):
                created = {
                    t: await source.spans_for(t) for t in event.created if table_filter.matches(t.schema, t.table)
                }
                if self.tables.receive(event, created):
                    log.info(
                        "changefeed %s: table-set change at ts %d (%s): %s dropped, %s created",
                        *(self.info.id, event.commit_ts, event.query, len(event.dropped), len(created)),
                    )
            else:
                self.tables.resolve(event.ts)

    async def _release_source(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        source, self._source = self._source, None
        if source is not None:
            try:
                await source.close()
            except Exception:
                log.exception("closing the source of changefeed %s failed", self.info.id)

    def _tick(self, *, stopping: bool = False) -> None:
        assert self.placement is not None
        tables = self.tables
        if self.snapshot_ranges is not None and not stopping and self._snapshot_done() and self._record_kept:
            log.info("changefeed %s: every snapshot range delivered and recorded; placing the tables", self.info.id)
            self.snapshot_ranges = None
            self._delivered = self._placed_ranges
            self._snapshot_finished = self._record.finished_at if self._record is not None else None
            if tables is not None:
                self.placement.set_spans(tables.spans())
        due = tables is not None and not stopping and tables.apply_due(self.checkpoint_ts)
        if due and tables is not None and self.snapshot_ranges is None:
            self.placement.set_spans(tables.spans())
        requests, watermark = self.placement.tick(self.checkpoint_ts, self.live_captures(), stopping=stopping)
        statuses: dict[Span, SpanReplication] = {}
        if tables is not None and tables.joining:
            statuses = {r.span: r for r in self.placement.scheduler.replication_status()}
            tables.settle(statuses.values(), watermark.checkpoint_ts if watermark is not None else None)
        if watermark is not None and not stopping:
            before = self.checkpoint_ts
            self._advance(watermark, statuses)
            if self.checkpoint_ts > before and self.on_progress is not None:
                self.on_progress()
        # Heartbeats carry the changefeed checkpoint to every capture's sinks (see the
        # module docs for why it is safe to promise downstream).
        self._send(
            self.placement.outgoing(requests, self.checkpoint_ts), tables.barrier() if tables is not None else None
        )
        self._record = self.snapshot_record()
        self.block_reason = self._blocked()
        self._progress = self.snapshot_progress()

    def _send(self, requests: list[tuple[str, dict[str, Any]]], barrier: int | None) -> None:
        """The scheduler's requests, each with the barrier; a new barrier alone to the
        captures that get no request this tick."""
        info = self._agent_info.to_json()
        for capture, payload in requests:
            message = SchedulingMessage(self.capture_id, self.info.id, self.epoch, payload, info, barrier_ts=barrier)
            self.center.send(capture, Topic.MAINTAINER_MANAGER, message)
        if barrier is not None and barrier != self._sent_barrier:
            told = {capture for capture, _ in requests}
            for capture in self.live_captures():
                if capture not in told:
                    message = SchedulingMessage(self.capture_id, self.info.id, self.epoch, barrier_ts=barrier)
                    self.center.send(capture, Topic.MAINTAINER_MANAGER, message)
        self._sent_barrier = barrier

    def _blocked(self) -> str:
        assert self.placement is not None
        if self.snapshot_ranges is not None and self._record is not None and self._record.complete:
            return "initial snapshot: every range delivered; waiting for the coordinator to record it"
        if self.snapshot_ranges is not None:
            return f"initial snapshot: {len(self.snapshot_ranges)} range(s) placed on the captures, not all delivered"
        absent = self.placement.absent()
        if absent:
            return f"{absent} span(s) not replicating: waiting for a capture to run them"
        change = self.tables.next_change() if self.tables is not None else None
        if change is not None:
            return f"table-set DDL at ts {change[0]} ({change[1]}): waiting for every span to reach it"
        return ""

    def _advance(self, watermark: Watermark, statuses: dict[Span, SpanReplication] | None = None) -> None:
        """The watermark moves progress forward, never back, and never past the
        changefeed's barrier or a span that joined and has not caught up."""
        checkpoint, resolved = watermark.checkpoint_ts, watermark.resolved_ts
        if self.tables is not None:
            cap = self.tables.checkpoint_cap(statuses or {})
            barrier = self.tables.barrier()
            if cap is not None:
                checkpoint = min(checkpoint, cap)
            if barrier is not None:
                resolved = min(resolved, barrier)
        self.checkpoint_ts = max(self.checkpoint_ts, checkpoint)
        self.resolved_ts = max(self.resolved_ts, resolved, self.checkpoint_ts)

    def on_scheduling(self, message: SchedulingMessage) -> None:
        """An agent's response (or its executor's error) for this changefeed."""
        if message.epoch != self.epoch or self.placement is None:
            return
        if message.error is not None:
            self._fail(message.error)
        elif message.payload is not None:
            self._take_reports(message.payload)
            if self.snapshot_ranges is not None:
                self._streaming_seen(message.payload)
            if self.placement.receive(message.payload):
                self._wake.set()

    def _streaming_seen(self, payload: dict[str, Any]) -> None:
        """A capture reports a table's span of this changefeed loaded: an earlier maintainer
        placed the tables, which it does only once every range is delivered, so the snapshot
        is done and its ranges are not placed again (their rows would follow changes above T)."""
        assert self.placement is not None and self.tables is not None
        message = decode(payload)
        if not isinstance(message, HeartbeatResponse) or not self.placement.scheduler.accepts(message):
            return
        if any(not is_snapshot_range(s.span) and s.state not in _IDLE for s in message.spans):
            log.info(
                "changefeed %s: capture %s already runs its tables: the snapshot was delivered; placing the tables",
                *(self.info.id, message.capture_id),
            )
            self.snapshot_ranges = None
            self._placed_ranges = frozenset()  # delivered by an earlier maintainer: no progress known here
            self.placement.set_spans(self.tables.spans())

    def _take_reports(self, payload: dict[str, Any]) -> None:
        """Keep the snapshot reports of a capture's heartbeat response (the newest per capture)."""
        message = decode(payload)
        if not isinstance(message, HeartbeatResponse) or not self.info.initial_snapshot:
            return
        assert self.placement is not None
        if not self.placement.scheduler.accepts(message):
            return
        if message.seq <= self._report_seq.get(message.capture_id, -1):
            return  # an older heartbeat than one taken already
        self._report_seq[message.capture_id] = message.seq
        for report in message.snapshot:
            if report.span is None:
                self._own_reports[message.capture_id] = report
            elif report.span in self._placed_ranges:
                self._range_reports[report.span] = report
                self._range_capture[report.span] = message.capture_id

    def snapshot_progress(self) -> dict[str, Any] | None:
        """The changefeed's initial snapshot as far as the captures reported it (see the
        module docs): unit, phase (``read``, ``deliver``, ``done``), parts done and total,
        rows done and estimated, the fraction read, and when it started and finished (wall
        clock; ``finished_at`` None until done). None when no snapshot is known here."""
        if not self.info.initial_snapshot:
            return None
        if self._placed_ranges or self._prior is not None:
            return self._ranges_progress()
        live = set(self.live_captures())
        reports = [r for capture, r in sorted(self._own_reports.items()) if capture in live]
        if not reports:
            return None
        phases = {r.phase for r in reports}
        phase = "done" if phases == {"done"} else "deliver" if phases <= {"deliver", "done"} else "read"
        if phase == "done" and self._snapshot_finished is None:
            self._snapshot_finished = time.time()
        parts_done, parts_total = sum(r.parts_done for r in reports), sum(r.parts_total for r in reports)
        rows_done = sum(r.rows_done for r in reports)
        return {
            "unit": reports[0].unit,
            "phase": phase,
            "parts_done": parts_done,
            "parts_total": parts_total,
            "rows_done": rows_done,
            "rows_estimate": max(rows_done, sum(max(r.rows_done, r.rows_estimate) for r in reports)),
            "fraction": round(parts_done / parts_total, 4) if parts_total else 1.0,
            "captures": len(reports),
            "started_at": round(min(r.started_at for r in reports), 3),
            "finished_at": round(self._snapshot_finished, 3) if phase == "done" and self._snapshot_finished else None,
        }

    def _ranges_progress(self) -> dict[str, Any]:
        """The progress of the snapshot shared by the cluster: ranges delivered of all
        planned (those an earlier maintainer saw delivered, from the stored record, and
        those placed here)."""
        placed, delivered, prior = self._placed_ranges, self._delivered, self._prior
        before = prior.parts_done if prior is not None else 0
        rows_before = prior.rows_done if prior is not None else 0
        reports = {span: r for span, r in self._range_reports.items() if span in placed}
        rows_done = rows_before + sum(r.rows_done for r in reports.values())
        fraction = float(before)
        estimates = []
        for span in placed:
            report = reports.get(span)
            if span in delivered:
                fraction += 1.0
            elif report is not None and report.parts_total:
                fraction += report.parts_done / report.parts_total
            if report is not None and (report.parts_done or span in delivered):
                estimates.append(max(report.rows_done, report.rows_estimate))
        estimate = rows_before + (round(sum(estimates) / len(estimates) * len(placed)) if estimates else 0)
        record = self._record
        finished = (
            self._snapshot_finished
            or (record.finished_at if record is not None else None)
            or (prior.finished_at or prior.started_at if prior is not None and prior.complete else None)
        )
        read = all(s in delivered or (s in reports and reports[s].phase in ("deliver", "done")) for s in placed)
        phase = "done" if finished is not None else "deliver" if read else "read"
        total = before + len(placed)
        return {
            "unit": self._snapshot_unit if placed or prior is None else prior.unit,
            "phase": phase,
            "parts_done": before + len(delivered),
            "parts_total": total,
            "rows_done": rows_done,
            "rows_estimate": max(rows_done, estimate),
            "fraction": round(fraction / total, 4) if total else 1.0,
            "captures": len({self._range_capture[s] for s in reports if s in self._range_capture}),
            "started_at": round(self._snapshot_started or (prior.started_at if prior is not None else 0.0), 3),
            "finished_at": round(finished, 3) if finished is not None else None,
        }

    def move_table(self, table_id: int, target_capture: str) -> list[Span]:
        """Queue a move of the table's spans (``Scheduler.move_table``); the next ticks carry it out."""
        return self._scheduler().move_table(table_id, target_capture)

    def replication_status(self) -> list[SpanReplication]:
        """Every span's scheduling status (``Scheduler.replication_status``)."""
        return self._scheduler().replication_status()

    def _scheduler(self) -> Scheduler[Any]:
        if self.placement is None:
            raise NotAvailableError(
                f"changefeed {self.info.id} is still listing its spans; retry in a moment",
                detail={"changefeed_id": self.info.id},
            )
        return self.placement.scheduler

    def on_checkpoint(self, checkpoint_ts: int) -> None:
        """The coordinator persisted ``checkpoint_ts`` (CheckpointTsMessage): nothing at
        or below it will be asked for again. The persisted value comes from this
        maintainer's (or an earlier incarnation's) flushed checkpoints, so the
        heartbeats may carry it on to the sinks."""
        cap = self.tables.checkpoint_cap({}) if self.tables is not None else None
        ceiling = self.resolved_ts if cap is None else min(self.resolved_ts, cap)
        self.checkpoint_ts = max(self.checkpoint_ts, min(checkpoint_ts, ceiling))

    async def close(self) -> MaintainerStatus:
        """Stop the maintainer and ask the agents to remove its spans; the returned status is the CloseAck."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.placement is not None:
            with contextlib.suppress(CdcflowError):
                self._tick(stopping=True)
        self.state = "stopped"
        return self.status()
