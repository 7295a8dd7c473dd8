"""Quotas too small for the pipeline to move: the changefeed says so (2002) instead of
stalling silently, and the 'pausing feeds' warning is not repeated many times a second."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.errors import BackPressureError
from cdcflow.core.testing import ListSink, ListSource, insert, until

pytestmark = pytest.mark.integration

SPARK_WAIT = 120.0  # seconds a step may take with local Spark on a loaded machine (a hang guard)


@pytest.fixture(scope="module")
def spark():
    from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session

    session = spark_session(SparkSettings(master="local[2]"))
    yield session
    stop_spark_session()


def test_a_16kib_memory_quota_with_a_1kib_disk_quota_is_reported_as_back_pressure(tmp_path, spark, caplog):
    rows = [insert("shop", "orders", {"id": i, "pad": "x" * 200}, commit_ts=100 + i) for i in range(400)]
    source = ListSource.of([*rows, ListSource.resolved(10_000)], chunk=50)
    sink = ListSink()
    caplog.set_level(logging.WARNING, logger="cdcflow.core.data.logservice.buffers")

    async def run():
        context = PipelineContext(
            "tiny", source, [sink], data_dir=tmp_path, start_ts=50, spark=spark,
            memory_quota=16 * 1024, disk_quota=1024,
        )  # fmt: skip
        executor = PipelineSpanExecutor(context)
        executor.stall_timeout = 2.0
        [span] = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        await executor.add_span(span, 50, prepare=False)
        await until(lambda: executor.paused, timeout=SPARK_WAIT)
        paused_at = time.monotonic()
        await until(lambda: executor.error() is not None, timeout=60, observe=executor.store.stats)
        error = executor.error()
        assert isinstance(error, BackPressureError) and error.code == 2002, error
        assert "memory-quota" in str(error) and "spill-disk-quota" in str(error)
        assert error.detail["memory_quota"] <= 16 * 1024 and error.detail["spill_disk_quota"] == 1024
        assert executor.status(span).checkpoint_ts < 10_000  # it really is stuck
        stalled_for = time.monotonic() - paused_at
        await executor.close()
        return stalled_for

    stalled_for = asyncio.run(run())
    warnings = [r for r in caplog.records if "pausing feeds" in r.getMessage()]
    assert stalled_for >= 1.5  # long enough for a warning a poll to show
    assert 1 <= len(warnings) <= 2, f"{len(warnings)} warnings in {stalled_for:.1f}s"
