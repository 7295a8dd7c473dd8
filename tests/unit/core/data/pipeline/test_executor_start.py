"""Spans join while the changefeed's Spark pipeline is still starting (no Spark
needed: the start is held by a session that waits, like a slow Spark startup)."""

import asyncio
import threading

from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.span_executor import SpanState
from cdcflow.core.errors import DownstreamUnavailableError
from cdcflow.core.testing import ListSink, ListSource, insert, until


class _SlowSession:
    """Blocks ``readStream`` until released, then fails: the query never runs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    @property
    def readStream(self):
        self.entered.set()
        self.release.wait(60)
        raise RuntimeError("the session went away")


def _source():
    rows = [insert("shop", f"t{t}", {"id": 1}, commit_ts=100 + t) for t in range(2)]
    return ListSource.of([*rows, ListSource.resolved(300)])


def test_spans_join_and_report_progress_while_the_pipeline_starts(tmp_path):
    source = _source()
    session = _SlowSession()

    async def run():
        executor = PipelineSpanExecutor(
            PipelineContext("slow", source, [ListSink()], data_dir=tmp_path, start_ts=50, spark=session)
        )
        spans = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        assert len(spans) == 2
        try:
            for span in spans:
                # Returns at once: the agent keeps answering while Spark starts.
                assert await asyncio.wait_for(executor.add_span(span, 50, prepare=False), 10)
            assert await asyncio.to_thread(session.entered.wait, 10)
            await until(lambda: executor.store.published_ts >= 300, timeout=10, message="the store to publish 300")
            for span in spans:
                status = executor.status(span)
                assert status.state is SpanState.REPLICATING
                # Resolved moves; the checkpoint waits for a flushed batch.
                assert (status.checkpoint_ts, status.resolved_ts) == (50, 300)
            assert executor.error() is None
        finally:
            session.release.set()
        await until(lambda: executor.error() is not None)
        assert "the session went away" in str(executor.error())  # a failed start is the executor's error
        await executor.close()

    asyncio.run(run())


def test_a_restarted_executor_reports_the_checkpoint_its_store_recorded(tmp_path):
    """The previous run flushed up to 250 (recorded by the store) but stopped before the
    changefeed's checkpoint passed 50: after a restart the spans report 250 at once."""
    source = _source()

    async def first_run():
        session = _SlowSession()
        executor = PipelineSpanExecutor(
            PipelineContext("again", source, [ListSink()], data_dir=tmp_path, start_ts=50, spark=session)
        )
        spans = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        for span in spans:
            await executor.add_span(span, 50, prepare=False)
        await until(lambda: executor.store.published_ts >= 300)
        executor.store.checkpoint(250, executor.store.next_chunk)  # as the pipeline does after a flush
        session.release.set()
        await executor.close()
        return spans

    async def second_run(spans):
        session = _SlowSession()
        executor = PipelineSpanExecutor(
            PipelineContext("again", source, [ListSink()], data_dir=tmp_path, start_ts=50, spark=session)
        )
        try:
            for span in spans:
                await executor.add_span(span, 50, prepare=False)
            assert [executor.status(s).checkpoint_ts for s in spans] == [250, 250]
        finally:
            session.release.set()
            await executor.close()

    spans = asyncio.run(first_run())
    asyncio.run(second_run(spans))


def test_a_span_new_after_a_restart_waits_for_a_batch_that_covers_it(tmp_path):
    source = _source()
    first, second = asyncio.run(_spans(source))

    async def run(spans, checkpoint=None):
        session = _SlowSession()
        executor = PipelineSpanExecutor(
            PipelineContext("new", source, [ListSink()], data_dir=tmp_path, start_ts=50, spark=session)
        )
        try:
            for span in spans:
                await executor.add_span(span, 50, prepare=False)
            await until(lambda: executor.store.published_ts >= 300)
            if checkpoint is not None:
                executor.store.checkpoint(checkpoint, executor.store.next_chunk)
            return [executor.status(s).checkpoint_ts for s in spans]
        finally:
            session.release.set()
            await executor.close()

    assert asyncio.run(run([first], checkpoint=250)) == [250]
    # The second span's rows are published after 300: the recorded 250 does not cover it.
    assert asyncio.run(run([first, second])) == [250, 50]


async def _spans(source):
    return [s for t in await source.list_tables() for s in await source.spans_for(t)]


class _Unreachable(ListSink):
    """A sink whose downstream never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = 0

    def open(self, context):
        self.refusals += 1
        raise DownstreamUnavailableError("downstream refused the connection")


def test_a_sink_that_cannot_open_is_retried_until_the_executor_closes(tmp_path):
    source = _source()
    sink = _Unreachable()

    async def run():
        executor = PipelineSpanExecutor(
            PipelineContext("down", source, [sink], data_dir=tmp_path, start_ts=50, spark=_SlowSession())
        )
        for span in await _spans(source):
            await executor.add_span(span, 50, prepare=False)

        # retried with backoff, not given up after a refusal
        await until(lambda: sink.refusals >= 3, timeout=60, message="a third refusal")
        assert isinstance(executor.error(), DownstreamUnavailableError)  # retryable: the changefeed goes Warning
        # The next attempt is seconds away; closing ends the retries without waiting for it.
        await asyncio.wait_for(executor.close(), 60)
        refusals = sink.refusals
        # Time passes on purpose (not a wait on a condition): no retry may come after the close.
        await asyncio.sleep(0.1)
        return refusals

    assert asyncio.run(run()) == sink.refusals
    assert sink.closed
