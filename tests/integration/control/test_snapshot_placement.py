"""The maintainer of a changefeed with ``initial-snapshot`` on a cluster, against the playground.

With two live captures the maintainer plans the snapshot (one range per region of the
bulk-loaded table) and gives the scheduler those ranges instead of the tables' spans; the
tables' spans follow once every range is reported delivered (resolved ts T + 1) and the
coordinator acknowledged the snapshot's record complete, or at once when a capture reports a
table's span running (an earlier maintainer placed them). A maintainer started with the
stored record of an earlier one places only the ranges not delivered, or the tables when the
record is complete. With one live capture and no record it places the tables' spans as before
(each capture copies its own). The agents' side is played by heartbeat responses sent to the
maintainer as a capture's agent sends them, the coordinator's by calling the maintainer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.control.maintainer.maintainer import Maintainer
from cdcflow.core.control.maintainer.placement import encode
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import SchedulingMessage
from cdcflow.core.control.scheduling import HeartbeatResponse
from cdcflow.core.data.events import Span
from cdcflow.core.data.snapshot_ranges import SnapshotRecord, is_snapshot_range, merged, range_done_ts, range_keys
from cdcflow.core.data.span_executor import SnapshotReport, SpanState, SpanStatus
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until
from cdcflow.plugins.sources.playground import Playground

pytestmark = pytest.mark.integration

EPOCH = 2


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=2, split_keys=300, ddl_every=0, seed=3) as playground:
        playground.bulk_load("customers", 1000)
        yield playground


def changefeed(pg: Playground, tmp: Path, start_ts: int) -> ChangeFeedInfo:
    source = {"type": "tikv", "playground": False, "pd": [pg.pd_address], "tidb-status": pg.status_address}
    sink = {"type": "file", "path": str(tmp / "out"), "protocol": "json"}
    return ChangeFeedInfo(
        "cf", source, [sink], filter_rules=["shop.customers"], start_ts=start_ts, initial_snapshot=True, epoch=EPOCH
    )


def heartbeat(
    capture: str, seq: int, *statuses: SpanStatus, reports: tuple[SnapshotReport, ...] = ()
) -> SchedulingMessage:
    response = HeartbeatResponse("cf", capture, EPOCH, tuple(statuses), seq=seq, snapshot=reports)
    return SchedulingMessage(capture, "cf", EPOCH, encode(response))


def report(span: Span, parts_done: int, parts_total: int, rows: int, phase: str = "read") -> SnapshotReport:
    """What a capture reading ``span`` reports (rows_estimate: the rows of its parts read, extrapolated)."""
    estimate = rows * parts_total // parts_done if parts_done else 0
    return SnapshotReport(span, "range", phase, parts_done, parts_total, rows, estimate, 1.0)


async def started(
    pg: Playground, tmp: Path, captures: list[str], record: SnapshotRecord | None = None
) -> tuple[Maintainer, MessageCenter, int]:
    center = MessageCenter(captures[0])
    start_ts = record.ts if record is not None else pg.now()
    info = changefeed(pg, tmp, start_ts)
    maintainer = Maintainer(
        captures[0], center, info, start_ts, PluginManager.default(), lambda: captures, snapshot_record=record
    )
    maintainer.start()
    await until(lambda: maintainer.placement is not None or maintainer.error, timeout=30, interval=0.05)
    assert maintainer.error is None, maintainer.error
    return maintainer, center, start_ts


def recorded(maintainer: Maintainer, *, complete: bool = False, parts: int | None = None) -> SnapshotRecord | None:
    """The snapshot record in the maintainer's status, once it is complete / has ``parts`` done."""
    data = maintainer.status().snapshot_record
    record = SnapshotRecord.from_json(data) if data is not None else None
    if record is None or (complete and not record.complete) or (parts is not None and record.parts_done != parts):
        return None
    return record


def table_spans(maintainer: Maintainer) -> list[Span]:
    assert maintainer.tables is not None
    return maintainer.tables.spans()


def test_ranges_first_then_the_tables_once_every_range_is_delivered(pg: Playground, tmp_path: Path) -> None:
    async def main() -> None:
        maintainer, center, ts = await started(pg, tmp_path, ["c1", "c2"])
        try:
            ranges = maintainer.snapshot_ranges
            assert ranges is not None and len(ranges) >= 3, "one range per region of the table"
            assert all(is_snapshot_range(r) for r in ranges)
            assert maintainer.placement is not None and set(maintainer.placement.spans) == ranges
            await until(lambda: "initial snapshot" in maintainer.block_reason, timeout=10, interval=0.05)
            reading = [SpanStatus(r, SpanState.REPLICATING, ts, ts) for r in sorted(ranges)]
            done = [SpanStatus(r, SpanState.REPLICATING, ts, range_done_ts(ts)) for r in sorted(ranges)]
            half = len(done) // 2
            # Both captures report their ranges; some still being read: the ranges stay.
            maintainer.on_scheduling(heartbeat("c1", 1, *done[:half]))
            maintainer.on_scheduling(heartbeat("c2", 1, *reading[half:]))
            await asyncio.sleep(0.5)
            assert maintainer.snapshot_ranges == ranges
            assert set(maintainer.placement.spans) == ranges
            # Every range delivered: the record says so; once the coordinator stored it, the
            # tables' spans are placed, from T.
            maintainer.on_scheduling(heartbeat("c2", 2, *done[half:]))
            complete = await until(lambda: recorded(maintainer, complete=True), timeout=10, interval=0.05)
            assert complete.done == tuple(merged(range_keys(r) for r in ranges))
            assert complete.parts_done == complete.parts_total == len(ranges)
            await until(lambda: "waiting for the coordinator" in maintainer.block_reason, timeout=10, interval=0.05)
            assert maintainer.snapshot_ranges == ranges
            maintainer.on_snapshot_kept()
            await until(lambda: maintainer.snapshot_ranges is None, timeout=10, interval=0.05)
            assert maintainer.placement.spans == table_spans(maintainer)
            assert maintainer.checkpoint_ts == ts
        finally:
            await maintainer.close()
            await center.close()

    asyncio.run(main())


def test_a_new_maintainer_finding_a_table_span_running_places_the_tables(pg: Playground, tmp_path: Path) -> None:
    async def main() -> None:
        maintainer, center, ts = await started(pg, tmp_path, ["c1", "c2"])
        try:
            ranges = maintainer.snapshot_ranges
            assert ranges
            running = next(s for s in table_spans(maintainer) if s.table_id > 0)
            # Ranges alone reported: nothing learnt.
            maintainer.on_scheduling(heartbeat("c1", 1, SpanStatus(min(ranges), SpanState.REPLICATING, ts, ts)))
            assert maintainer.snapshot_ranges == ranges
            maintainer.on_scheduling(heartbeat("c2", 1, SpanStatus(running, SpanState.REPLICATING, ts, ts)))
            assert maintainer.snapshot_ranges is None
            assert maintainer.placement is not None and maintainer.placement.spans == table_spans(maintainer)
        finally:
            await maintainer.close()
            await center.close()

    asyncio.run(main())


def test_one_capture_places_the_tables_and_copies_them_itself(pg: Playground, tmp_path: Path) -> None:
    async def main() -> None:
        maintainer, center, _ = await started(pg, tmp_path, ["c1"])
        try:
            assert maintainer.snapshot_ranges is None
            assert maintainer.placement is not None and maintainer.placement.spans == table_spans(maintainer)
        finally:
            await maintainer.close()
            await center.close()

    asyncio.run(main())


def test_the_changefeeds_progress_counts_the_ranges_of_every_capture(pg: Playground, tmp_path: Path) -> None:
    async def main() -> None:
        maintainer, center, ts = await started(pg, tmp_path, ["c1", "c2"])
        try:
            ranges = sorted(maintainer.snapshot_ranges or ())
            total = len(ranges)
            assert total >= 4
            await until(lambda: maintainer.status().snapshot is not None, timeout=10, interval=0.05)
            first = maintainer.status().snapshot
            assert first is not None
            assert (first["parts_done"], first["parts_total"], first["rows_done"], first["phase"]) == (
                0,
                total,
                0,
                "read",
            )
            mine, theirs = ranges[: total // 2], ranges[total // 2 :]
            reading = {r: SpanStatus(r, SpanState.REPLICATING, ts, ts) for r in ranges}
            done = {r: SpanStatus(r, SpanState.REPLICATING, ts, range_done_ts(ts)) for r in ranges}
            # c1 delivered its first range and reads the others; c2 read half of one range.
            maintainer.on_scheduling(
                heartbeat("c1", 1, done[mine[0]], *(reading[r] for r in mine[1:]),
                          reports=(report(mine[0], 1, 1, 100, "done"), report(mine[1], 0, 1, 0)))
            )  # fmt: skip
            maintainer.on_scheduling(
                heartbeat("c2", 1, *(reading[r] for r in theirs), reports=(report(theirs[0], 1, 2, 40),))
            )
            # An older heartbeat of c2, arriving late, is not taken.
            maintainer.on_scheduling(heartbeat("c2", 0, reports=(report(theirs[0], 0, 2, 0),)))

            def at(parts: int, rows: int) -> dict[str, Any] | None:
                now = maintainer.status().snapshot
                return now if now is not None and (now["parts_done"], now["rows_done"]) == (parts, rows) else None

            middle = await until(lambda: at(1, 140), timeout=10, interval=0.05)
            assert middle["parts_total"] == total and middle["captures"] == 2 and middle["phase"] == "read"
            assert middle["rows_estimate"] == (100 + 80) // 2 * total  # ranges read so far, per range, times all
            assert middle["fraction"] == round(1.5 / total, 4) and middle["finished_at"] is None
            # Every range delivered by the two captures: the progress reaches the total and stays done.
            maintainer.on_scheduling(
                heartbeat("c1", 2, *(done[r] for r in mine), reports=tuple(report(r, 1, 1, 100, "done") for r in mine))
            )
            maintainer.on_scheduling(
                heartbeat(
                    "c2", 2, *(done[r] for r in theirs), reports=tuple(report(r, 2, 2, 80, "done") for r in theirs)
                )
            )
            last = await until(lambda: at(total, 100 * len(mine) + 80 * len(theirs)), timeout=10, interval=0.05)
            assert last["phase"] == "done" and last["parts_total"] == total and last["fraction"] == 1.0
            assert last["rows_estimate"] == last["rows_done"] and last["finished_at"] is not None
            maintainer.on_snapshot_kept()
            await until(lambda: maintainer.snapshot_ranges is None, timeout=10, interval=0.05)
            assert maintainer.status().snapshot == last
        finally:
            await maintainer.close()
            await center.close()

    asyncio.run(main())


def test_a_maintainer_started_with_the_record_places_only_the_ranges_not_delivered(
    pg: Playground, tmp_path: Path
) -> None:
    async def main() -> None:
        first, center, ts = await started(pg, tmp_path, ["c1", "c2"])
        try:
            ranges = sorted(first.snapshot_ranges or ())
            total, half = len(ranges), len(ranges) // 2
            assert half >= 1
            done = [SpanStatus(r, SpanState.REPLICATING, ts, range_done_ts(ts)) for r in ranges[:half]]
            delivered = tuple(report(r, 1, 1, 100, "done") for r in ranges[:half])
            first.on_scheduling(heartbeat("c2", 1, *done, reports=delivered))
            stored = await until(lambda: recorded(first, parts=half), timeout=10, interval=0.05)
            assert not stored.complete and stored.rows_done == 100 * half and stored.parts_total == total
        finally:
            await first.close()
            await center.close()
        # The changefeed's next maintainer (its capture died: one capture left) gets the record.
        second, center, _ = await started(pg, tmp_path, ["c1"], SnapshotRecord.from_json(stored.to_json()))
        try:
            assert second.snapshot_ranges == frozenset(ranges[half:])
            assert second.placement is not None and set(second.placement.spans) == set(ranges[half:])
            progress = await until(lambda: second.status().snapshot, timeout=10, interval=0.05)
            assert (progress["parts_done"], progress["parts_total"], progress["rows_done"]) == (half, total, 100 * half)
            rest = [SpanStatus(r, SpanState.REPLICATING, ts, range_done_ts(ts)) for r in ranges[half:]]
            second.on_scheduling(
                heartbeat("c1", 1, *rest, reports=tuple(report(r, 1, 1, 50, "done") for r in ranges[half:]))
            )
            complete = await until(lambda: recorded(second, complete=True), timeout=10, interval=0.05)
            assert complete.parts_done == total and complete.rows_done == 100 * half + 50 * (total - half)
            assert complete.done == tuple(merged(range_keys(r) for r in ranges))
            await asyncio.sleep(0.3)
            assert second.snapshot_ranges is not None, "the tables wait for the record to be stored"
            second.on_snapshot_kept()
            await until(lambda: second.snapshot_ranges is None, timeout=10, interval=0.05)
            assert second.placement.spans == table_spans(second)
        finally:
            await second.close()
            await center.close()

    asyncio.run(main())


def test_a_maintainer_started_with_a_complete_record_places_the_tables(pg: Playground, tmp_path: Path) -> None:
    async def main() -> None:
        ts = pg.now()
        table = pg.table_id("customers")
        record = SnapshotRecord(ts, (Span(table, b"", b""),), 6, 6, 1000, True, 1.0, 2.0)
        maintainer, center, _ = await started(pg, tmp_path, ["c1", "c2"], record)
        try:
            assert maintainer.snapshot_ranges is None
            assert maintainer.placement is not None and maintainer.placement.spans == table_spans(maintainer)
            assert maintainer.status().snapshot_record is None
            progress = await until(lambda: maintainer.status().snapshot, timeout=10, interval=0.05)
            assert progress["phase"] == "done" and progress["parts_done"] == progress["parts_total"] == 6
            assert progress["rows_done"] == 1000 and progress["finished_at"] == 2.0
        finally:
            await maintainer.close()
            await center.close()

    asyncio.run(main())


def test_a_record_covering_every_range_but_not_complete_completes_before_the_tables(
    pg: Playground, tmp_path: Path
) -> None:
    """Every range delivered, the maintainer gone before the coordinator stored "complete":
    the next one places no range, reports the record complete and places the tables once
    it is stored."""

    async def main() -> None:
        ts = pg.now()
        table = pg.table_id("customers")
        record = SnapshotRecord(ts, (Span(table, b"", b""),), 6, 6, 1000, False, 1.0)
        maintainer, center, _ = await started(pg, tmp_path, ["c1", "c2"], record)
        try:
            assert maintainer.snapshot_ranges == frozenset()
            complete = await until(lambda: recorded(maintainer, complete=True), timeout=10, interval=0.05)
            assert complete.parts_done == complete.parts_total == 6 and complete.done == record.done
            assert maintainer.placement is not None and maintainer.placement.spans == []
            maintainer.on_snapshot_kept()
            await until(lambda: maintainer.snapshot_ranges is None, timeout=10, interval=0.05)
            assert maintainer.placement.spans == table_spans(maintainer)
        finally:
            await maintainer.close()
            await center.close()

    asyncio.run(main())
