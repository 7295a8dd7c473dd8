"""A restarted span executor mounts the rows its event store kept with the schema of
their own commit ts, though its feeds resume from the store's published ts.

The tikv source reads the playground; the first executor stores rows on both sides
of an ADD COLUMN but flushes none (no Spark here: its pipeline never starts), then
a second executor — a new source, as after a restart of the capture or of the
changefeed — resumes from the same store and mounts those rows again, as its
pipeline would from the checkpoint on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cdcflow.core.data.events import RawKVEvent, Span
from cdcflow.core.data.logservice.records import batch_to_records, event_from_record, read_record_batches
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.types import TypeCode
from cdcflow.core.testing import ListSink, until
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType

pytestmark = pytest.mark.integration

VARCHAR = FieldType(tp=int(TypeCode.VARCHAR), flen=32, charset="utf8mb4", collate="utf8mb4_bin")


class _NoSpark:
    """A session whose streaming query cannot start: the executor feeds and publishes,
    and its pipeline (which would flush and move the checkpoint) never runs."""

    @property
    def readStream(self) -> Any:
        raise RuntimeError("no Spark in this test")


def _source(pg: Playground) -> TiKVSource:
    return TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))


def _executor(pg: Playground, tmp_path: Any, start_ts: int) -> PipelineSpanExecutor:
    return PipelineSpanExecutor(
        PipelineContext("restart", _source(pg), [ListSink()], data_dir=tmp_path, start_ts=start_ts, spark=_NoSpark())
    )


async def _orders_span(pg: Playground) -> Span:
    """The span of shop.orders, listed as a maintainer does (with a source of its own)."""
    source = _source(pg)
    await source.open()
    try:
        (table,) = [t for t in await source.list_tables() if t.table == "orders"]
        (span,) = await source.spans_for(table)
        return span
    finally:
        await source.close()


def test_a_restarted_executor_mounts_stored_rows_with_the_schema_of_their_commit_ts(tmp_path: Any) -> None:
    with Playground(stores=1, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
        start = pg.now()
        pg.run_workload(30)
        pg.ddl.add_column("shop", "orders", "extra", VARCHAR, "n/a")
        pg.run_workload(30)
        last = pg.now()

        async def first_run() -> Span:
            span = await _orders_span(pg)
            executor = _executor(pg, tmp_path, start)
            try:
                await executor.add_span(span, start, prepare=False)
                await until(lambda: executor.store.published_ts >= last, timeout=60, message="the first run to publish")
                assert executor.checkpoint_ts == start  # nothing flushed: a restart mounts it all again
                return span
            finally:
                await executor.close()

        async def second_run(span: Span) -> tuple[int, list[Any]]:
            executor = _executor(pg, tmp_path, start)
            try:
                store = executor.store
                published = store.published_ts
                await executor.add_span(span, start, prepare=False)
                # The feed resumes from what the store published; once it resolves further, the
                # source has loaded its schemas.
                await until(
                    lambda: store.resolved_ts(span) > published, timeout=60, message="the resumed feed to resolve"
                )
                [ddl] = store.ddl_between(start, last)
                mounter = executor.source.mounter()
                assert mounter is not None
                rows = []
                for chunk in store.chunks_in(0, store.next_chunk):
                    for batch in read_record_batches(store.directory / chunk.file):
                        for record in batch_to_records(batch):
                            event = event_from_record(record, store.span_of, store.schemas)
                            assert isinstance(event, RawKVEvent)
                            rows.append(await mounter.mount(event))
                return ddl.commit_ts, [r for r in rows if r is not None]
            finally:
                await executor.close()

        span = asyncio.run(first_run())
        ddl_ts, rows = asyncio.run(second_run(span))
    before = [r for r in rows if r.commit_ts < ddl_ts]
    after = [r for r in rows if r.commit_ts > ddl_ts]
    assert before and after, "the workload must write orders on both sides of the ADD COLUMN"
    # Decoded with the schema valid just below the row's commit ts: no column before it existed.
    assert all("extra" not in r.image() for r in before)
    assert all("extra" in r.image() for r in after)
