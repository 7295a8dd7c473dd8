"""Spans added to a running pipeline one after another, removed and re-added: every
table's rows reach the sinks (ListSource → event store → Spark local[2] → sinks)."""

import asyncio
import time

import pytest

from cdcflow.core.config.model import SparkSettings
from cdcflow.core.pipeline.executor import PipelineSpanExecutor
from cdcflow.core.testing import ListSink, ListSource, insert

pytestmark = pytest.mark.integration

TABLES = ("customers", "products", "orders")


@pytest.fixture(scope="module")
def spark():
    from cdcflow.core.pipeline.session import spark_session, stop_spark_session

    session = spark_session(SparkSettings(master="local[2]"))
    yield session
    stop_spark_session()


async def wait_until(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.2)


def shop_events(resolved=900):
    out = [insert("shop", t, {"id": i}, commit_ts=100 + i * 10) for i in range(20) for t in TABLES]
    return [*sorted(out, key=lambda r: r.commit_ts), ListSource.resolved(resolved)]


def rows_by_table(sink):
    out = {}
    for row in sink.rows:
        out.setdefault(row.table.table, []).append(row.after["id"])
    return out


async def spans_of(source):
    return {t.table: (await source.spans_for(t))[0] for t in await source.list_tables()}


@pytest.mark.parametrize("order", [TABLES, tuple(reversed(TABLES))])
def test_spans_added_while_the_first_is_replicating_deliver_every_table(tmp_path, spark, order):
    source = ListSource.of(shop_events())
    sink = ListSink()

    async def run():
        executor = PipelineSpanExecutor(
            "cf", source, [sink], data_dir=tmp_path, start_ts=50, spark=spark, trigger_interval=0.2
        )
        spans = await spans_of(source)
        for n, table in enumerate(order):
            assert await executor.add_span(spans[table], 50, prepare=False)
            # The spans before this one are already published and flushed to 900.
            await wait_until(lambda: executor.checkpoint_ts == 900)
            added = order[: n + 1]
            await wait_until(lambda added=added: all(executor.status(spans[t]).checkpoint_ts == 900 for t in added))
        assert executor.error() is None
        await executor.close()

    asyncio.run(run())
    assert rows_by_table(sink) == {t: list(range(20)) for t in TABLES}
    assert [b.end_ts for b in sink.batches.values()] == sorted(b.end_ts for b in sink.batches.values())


def test_a_span_removed_and_re_added_delivers_what_followed_its_checkpoint(tmp_path, spark):
    source = ListSource.of(shop_events())
    sink = ListSink()

    async def run():
        executor = PipelineSpanExecutor(
            "cf", source, [sink], data_dir=tmp_path, start_ts=50, spark=spark, trigger_interval=0.2
        )
        spans = await spans_of(source)
        customers, orders = spans["customers"], spans["orders"]
        assert await executor.add_span(customers, 50, prepare=False)
        await wait_until(lambda: executor.checkpoint_ts == 900)
        assert await executor.add_span(orders, 50, prepare=False)
        await wait_until(lambda: executor.status(orders).checkpoint_ts == 900)
        assert await executor.remove_span(orders) == 900
        # Moved elsewhere and back: the other capture flushed orders up to ts 200.
        assert await executor.add_span(orders, 200, prepare=False)
        await wait_until(lambda: executor.status(orders).checkpoint_ts == 900)
        assert executor.error() is None
        await executor.close()

    asyncio.run(run())
    by_table = rows_by_table(sink)
    assert by_table["customers"] == list(range(20))
    # Every order once, then (at least once) again every order committed after ts 200.
    assert by_table["orders"] == list(range(20)) + list(range(11, 20))
