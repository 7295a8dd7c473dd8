"""An initial snapshot's parts read by the capture itself while Spark starts (``ReadAhead``):
in plan order, into the same files and journal as the Spark read's tasks, stopped after
the part being read once Spark can run the read, or at once when the snapshot is
cancelled. No Spark: the parts are in-process tasks, and Spark's start is the
``spark_starting`` block a capture's start holds."""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.events import RawKVEvent, Span
from cdcflow.core.data.logservice.records import ARROW_SCHEMA, record_from_event, records_to_batch
from cdcflow.core.data.pipeline.session import (
    SnapshotHold,
    snapshots_held,
    spark_ready,
    spark_starting,
    wait_for_snapshots,
)
from cdcflow.core.data.pipeline.snapshot import InitialSnapshot, ReadAhead, part_file_name, read_part
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.source import SnapshotPlan, SnapshotTask
from cdcflow.core.errors import CdcflowError
from cdcflow.core.testing import ListSink, ListSource

TS = 500
SPAN = Span(7, b"t7_", b"t7`")
ROWS_PER_PAGE = 3


class _NoSchemas:
    def id_of(self, schema: object) -> int:
        return -1


def _page(part: int, page: int) -> pa.RecordBatch:
    records = [
        record_from_event(RawKVEvent(SPAN, f"t7_{part:03d}{page:03d}{i}".encode(), b"v", b"", TS, TS), 0, _NoSchemas())
        for i in range(ROWS_PER_PAGE)
    ]
    return records_to_batch(records)


@dataclass(frozen=True)
class _Part(SnapshotTask):
    """``pages`` pages of rows; waits at ``gate`` (when given) before its second page."""

    part: int
    pages: int = 1
    gate: threading.Event | None = field(default=None, compare=False)
    between: threading.Event | None = field(default=None, compare=False)
    fail: bool = False

    def read(self) -> Iterator[pa.RecordBatch]:
        if self.fail:
            raise CdcflowError(f"part {self.part} cannot be read")
        for page in range(self.pages):
            if page == 1 and self.gate is not None:
                assert self.between is not None
                self.between.set()
                assert self.gate.wait(10)
            yield _page(self.part, page)


def _snapshot(tmp_path: Path) -> InitialSnapshot:
    return InitialSnapshot(tmp_path / "cf", "cf", TS)


def _finish(ahead: ReadAhead) -> None:
    for _ in range(200):
        if ahead.finished:
            return
        threading.Event().wait(0.05)
    raise AssertionError("the read-ahead did not end")


def test_parts_are_read_in_plan_order_into_part_files_under_the_snapshots_run_id(tmp_path: Path) -> None:
    snapshot = _snapshot(tmp_path)
    plan = SnapshotPlan(TS, [_Part(0), _Part(1, pages=2), _Part(2)])
    ahead = snapshot.read_ahead(plan)
    assert ahead is not None
    _finish(ahead)
    assert snapshot.parts_done() == {0: 3, 1: 6, 2: 3}
    assert snapshot.reads() == [(snapshot.run_id, 0), (snapshot.run_id, 1), (snapshot.run_id, 2)]
    assert (ahead.parts, ahead.rows) == (3, 12)
    assert snapshot.progress is not None
    assert (snapshot.progress.parts_done, snapshot.progress.rows_done, snapshot.progress.phase) == (3, 12, "read")
    # Each file holds its part's records in the event store's schema, as a Spark task's.
    written = pq.read_table(snapshot.parts_dir / part_file_name(1, 6))
    assert written.schema == ARROW_SCHEMA
    assert written.to_batches()[0].to_pylist() == _page(1, 0).to_pylist()
    assert snapshot.read_ahead(plan) is None  # nothing left


def test_readers_take_the_parts_in_plan_order_as_many_at_once_as_asked(tmp_path: Path) -> None:
    snapshot = _snapshot(tmp_path)
    gate = threading.Event()
    between = [threading.Event() for _ in range(4)]
    plan = SnapshotPlan(TS, [_Part(i, pages=2, gate=gate, between=between[i]) for i in range(4)])
    ahead = snapshot.read_ahead(plan, readers=2)
    assert ahead is not None and ahead.readers == 2
    # Parts 0 and 1 are read at once, each held before its second page; part 2 waits for a reader.
    assert between[0].wait(10) and between[1].wait(10)
    assert not between[2].wait(0.3)
    assert sorted(part for _, part in snapshot.reads()) == [0, 1]
    gate.set()
    _finish(ahead)
    assert snapshot.parts_done() == {i: 6 for i in range(4)}
    assert sorted(part for _, part in snapshot.reads()) == [0, 1, 2, 3]
    assert (ahead.parts, ahead.rows) == (4, 24)
    assert snapshot.progress is not None and snapshot.progress.parts_done == 4


def test_no_more_readers_than_parts(tmp_path: Path) -> None:
    ahead = _snapshot(tmp_path).read_ahead(SnapshotPlan(TS, [_Part(0), _Part(1)]), readers=8)
    assert ahead is not None and ahead.readers == 2
    _finish(ahead)


def test_after_a_part_fails_here_no_reader_takes_another(tmp_path: Path) -> None:
    snapshot = _snapshot(tmp_path)
    gate, between = threading.Event(), threading.Event()
    plan = SnapshotPlan(TS, [_Part(0, pages=2, gate=gate, between=between), _Part(1, fail=True), _Part(2), _Part(3)])
    ahead = snapshot.read_ahead(plan, readers=2)
    assert ahead is not None
    assert between.wait(10)  # part 0 held; the other reader took part 1, which failed
    for _ in range(100):
        if len(snapshot.reads()) >= 2 and sum(t.is_alive() for t in ahead._threads) == 1:
            break
        threading.Event().wait(0.05)
    gate.set()
    _finish(ahead)
    assert snapshot.parts_done() == {0: 6}  # the part under way when 1 failed is kept
    assert sorted(part for _, part in snapshot.reads()) == [0, 1]


def test_parts_read_before_are_not_read_again(tmp_path: Path) -> None:
    snapshot = _snapshot(tmp_path)
    plan = SnapshotPlan(TS, [_Part(0), _Part(1), _Part(2)])
    first = snapshot.read_ahead(SnapshotPlan(TS, [_Part(0), _Part(1, fail=True)]))
    assert first is not None
    _finish(first)
    assert snapshot.parts_done() == {0: 3}
    again = InitialSnapshot(tmp_path / "cf", "cf", TS)  # a restart
    ahead = again.read_ahead(plan)
    assert ahead is not None
    _finish(ahead)
    assert [part for run, part in again.reads() if run == again.run_id] == [1, 2]
    assert again.progress is not None and again.progress.parts_before == 1


def _held_in_first_part(tmp_path: Path) -> tuple[InitialSnapshot, ReadAhead, threading.Event]:
    """A read-ahead of two parts, held between the two pages of the first until the gate opens."""
    snapshot = _snapshot(tmp_path)
    gate, between = threading.Event(), threading.Event()
    ahead = snapshot.read_ahead(SnapshotPlan(TS, [_Part(0, pages=2, gate=gate, between=between), _Part(1)]))
    assert ahead is not None
    assert between.wait(10)
    return snapshot, ahead, gate


def test_stop_waits_for_the_part_being_read_and_reads_no_further(tmp_path: Path) -> None:
    snapshot, ahead, gate = _held_in_first_part(tmp_path)
    stopping = threading.Thread(target=ahead.stop)
    stopping.start()
    stopping.join(0.3)
    assert stopping.is_alive(), "stop() returned while the part was still being read"
    gate.set()
    stopping.join(10)
    assert ahead.finished
    assert snapshot.parts_done() == {0: 6}  # the part read whole, kept
    assert [part for _, part in snapshot.reads()] == [0]  # and no other started


def test_cancelling_the_snapshot_drops_the_part_being_read(tmp_path: Path) -> None:
    snapshot, ahead, gate = _held_in_first_part(tmp_path)
    snapshot.cancel(None)  # no Spark yet: only the read-ahead to stop
    gate.set()
    _finish(ahead)
    assert snapshot.parts_done() == {}
    assert not list(snapshot.parts_dir.glob(".part-*")), "the dropped part's hidden file was left"
    assert [part for _, part in snapshot.reads()] == [0]


def test_a_part_that_fails_here_is_left_to_the_spark_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cdcflow.core.data.pipeline.snapshot")
    snapshot = _snapshot(tmp_path)
    ahead = snapshot.read_ahead(SnapshotPlan(TS, [_Part(0), _Part(1, fail=True), _Part(2)]))
    assert ahead is not None
    _finish(ahead)
    assert snapshot.parts_done() == {0: 3}
    assert [part for _, part in snapshot.reads()] == [0, 1]
    assert "part 1 cannot be read" in caplog.text and "left to Spark's read" in caplog.text


def test_spark_is_not_ready_while_the_capture_starts_it() -> None:
    session = object()
    assert spark_ready(session)
    with spark_starting():
        assert not spark_ready(session)
    assert spark_ready(session)


def test_a_snapshot_hold_counts_once_until_released() -> None:
    before = snapshots_held()
    first, second = SnapshotHold(), SnapshotHold()
    assert snapshots_held() == before + 2
    first.release()
    first.release()  # released once
    assert snapshots_held() == before + 1
    with second:
        pass
    assert snapshots_held() == before


def test_waiting_for_snapshots_ends_when_the_last_is_released_or_when_told() -> None:
    hold = SnapshotHold()
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(wait_for_snapshots(poll=0.05)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # held: still waiting
    hold.release()
    waiter.join(10)
    assert waited == [True]
    with SnapshotHold():
        assert wait_for_snapshots(until=lambda: True, poll=0.05) is False  # told to stop waiting


class _StartingSession:
    """A session that is up at once (the capture's start still warms its workers)."""


def _executor(tmp_path: Path, settings: SparkSettings) -> PipelineSpanExecutor:
    context = PipelineContext(
        "cf",
        ListSource.of([]),
        [ListSink()],
        data_dir=tmp_path,
        start_ts=TS,
        spark=_StartingSession(),
        spark_settings=settings,
    )
    return PipelineSpanExecutor(context)


def test_the_executor_reads_ahead_until_spark_is_ready_then_stops_after_the_part(tmp_path: Path) -> None:
    gate, between = threading.Event(), threading.Event()
    plan = SnapshotPlan(TS, [_Part(0), _Part(1, pages=2, gate=gate, between=between), _Part(2)])

    async def run() -> None:
        executor = _executor(tmp_path, SparkSettings(master="local[1]"))  # one part at a time: one task slot
        snapshot = InitialSnapshot(tmp_path / "cf", "cf", TS)
        loop = asyncio.get_running_loop()
        starting = spark_starting()
        starting.__enter__()
        try:
            with snapshot.exclusive():
                build = asyncio.ensure_future(asyncio.to_thread(executor._build_reading_ahead, loop, snapshot, plan))
                assert await asyncio.to_thread(between.wait, 10)  # part 1 under way: Spark still starting
                assert snapshot._ahead is not None and snapshot._ahead.readers == 1
                starting.__exit__(None, None, None)
                starting = None
                await asyncio.sleep(0.3)
                assert not build.done(), "the build returned before the part being read was"
                gate.set()
                pipeline = await asyncio.wait_for(build, 10)
            assert pipeline is not None
            assert snapshot.parts_done() == {0: 3, 1: 6}  # part 2 is the Spark read's
        finally:
            gate.set()
            if starting is not None:
                starting.__exit__(None, None, None)
            await executor.close()

    asyncio.run(run())


def test_the_executor_leaves_every_part_to_spark_when_read_ahead_is_off(tmp_path: Path) -> None:
    plan = SnapshotPlan(TS, [_Part(0), _Part(1)])

    async def run() -> None:
        executor = _executor(tmp_path, SparkSettings(snapshot_read_ahead=False))
        snapshot = InitialSnapshot(tmp_path / "cf", "cf", TS)
        try:
            with spark_starting(), snapshot.exclusive():
                loop = asyncio.get_running_loop()
                await asyncio.to_thread(executor._build_reading_ahead, loop, snapshot, plan)
            assert snapshot.reads() == [] and snapshot.parts_done() == {}
        finally:
            await executor.close()

    asyncio.run(run())


@dataclass(frozen=True)
class _Refused(SnapshotTask):
    """A part whose ``read`` raises before it returns any page (not a generator)."""

    def read(self) -> Iterator[pa.RecordBatch]:
        raise CdcflowError("the store refused the scan")


def test_a_part_whose_read_raises_at_once_is_summarised_with_its_error(tmp_path: Path) -> None:
    snapshot = _snapshot(tmp_path)
    snapshot.parts_dir.mkdir(parents=True)
    summary = read_part(snapshot.parts_dir, snapshot.journal, "run", 3, _Refused())
    assert summary is not None and summary["rows"] == 0
    assert "the store refused the scan" in str(pickle.loads(summary["error"]))
    assert snapshot.parts_done() == {} and not list(snapshot.parts_dir.glob(".part-*"))
    assert snapshot.reads() == [("run", 3)]
