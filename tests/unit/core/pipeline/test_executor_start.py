"""Spans join while the changefeed's Spark pipeline is still starting (no Spark
needed: the start is held by a session that waits, like a slow Spark startup)."""

import asyncio
import threading

from cdcflow.core.executor import SpanState
from cdcflow.core.pipeline.executor import PipelineSpanExecutor
from cdcflow.core.testing import ListSink, ListSource, insert


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
        executor = PipelineSpanExecutor("slow", source, [ListSink()], data_dir=tmp_path, start_ts=50, spark=session)
        spans = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        assert len(spans) == 2
        try:
            for span in spans:
                # Returns at once: the agent keeps answering while Spark starts.
                assert await asyncio.wait_for(executor.add_span(span, 50, prepare=False), 10)
            assert await asyncio.to_thread(session.entered.wait, 10)
            deadline = asyncio.get_running_loop().time() + 10
            while executor.store.published_ts < 300:
                assert asyncio.get_running_loop().time() < deadline, "the store did not publish"
                await asyncio.sleep(0.01)
            for span in spans:
                status = executor.status(span)
                assert status.state is SpanState.REPLICATING
                # Resolved moves; the checkpoint waits for a flushed batch.
                assert (status.checkpoint_ts, status.resolved_ts) == (50, 300)
            assert executor.error() is None
        finally:
            session.release.set()
        while executor.error() is None:
            await asyncio.sleep(0.01)
        assert "the session went away" in str(executor.error())  # a failed start is the executor's error
        await executor.close()

    asyncio.run(run())
