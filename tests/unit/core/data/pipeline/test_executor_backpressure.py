"""The executor's feeds pause when the event store is full (no Spark needed: prepared
spans buffer without publishing)."""

import asyncio

from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.span_executor import SpanState
from cdcflow.core.testing import ListSink, ListSource, insert, until


def test_a_full_store_pauses_the_feed_instead_of_growing(tmp_path):
    rows = [insert("shop", "orders", {"id": i, "pad": "x" * 200}, commit_ts=100 + i) for i in range(3000)]
    source = ListSource.of([*rows, ListSource.resolved(10_000)], chunk=50)

    async def run():
        executor = PipelineSpanExecutor(
            PipelineContext(
                "bp", source, [ListSink()], data_dir=tmp_path, start_ts=50, memory_quota=40_000, disk_quota=150_000
            )
        )
        executor.stall_timeout = 0.1  # a prepared span waits for its switch: a pause, not a stall
        [span] = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        assert not await executor.add_span(span, 50, prepare=True)
        assert executor.status(span).state is SpanState.PREPARING
        await until(lambda: executor.paused)
        stats = executor.store.stats()
        assert stats.spilled_runs > 0  # it spilled as long as the disk quota allowed
        assert stats.memory_bytes < 40_000 + 2_000
        assert stats.disk_bytes <= 150_000
        # Time passes on purpose (not a wait on a condition): a paused feed must stay
        # paused and its store must not grow while nothing is read from it.
        await asyncio.sleep(0.3)
        assert executor.paused and executor.store.stats().memory_bytes == stats.memory_bytes
        assert executor.error() is None
        assert await executor.remove_span(span) == 50
        assert executor.store.stats().memory_bytes == 0
        await executor.close()

    asyncio.run(run())


def test_a_prepared_span_catches_up(tmp_path):
    source = ListSource.of([insert("shop", "orders", {"id": 1}, commit_ts=100), ListSource.resolved(200)])

    async def run():
        executor = PipelineSpanExecutor(PipelineContext("prep", source, [ListSink()], data_dir=tmp_path, start_ts=50))
        [span] = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        await executor.add_span(span, 50, prepare=True)
        await until(lambda: executor.status(span).state is SpanState.PREPARED)
        assert await executor.add_span(span, 50, prepare=True)
        status = executor.status(span)
        assert (status.checkpoint_ts, status.resolved_ts) == (50, 200)
        assert executor.store.published_ts == 50  # nothing published while prepared
        await executor.close()

    asyncio.run(run())
