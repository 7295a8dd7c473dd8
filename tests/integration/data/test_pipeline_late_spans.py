"""Spans added to a running pipeline one after another, removed and re-added: every
table's rows reach the sinks (ListSource → event store → Spark local[2] → sinks)."""

import asyncio
import time

import pytest

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.testing import ListSink, ListSource, insert, until

pytestmark = pytest.mark.integration

TABLES = ("customers", "products", "orders")


@pytest.fixture(scope="module")
def spark():
    from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session

    session = spark_session(SparkSettings(master="local[2]"))
    yield session
    stop_spark_session()


SPARK_WAIT = 120.0  # seconds a step may take with local Spark on a loaded machine (a hang guard)


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
            PipelineContext("cf", source, [sink], data_dir=tmp_path, start_ts=50, spark=spark, trigger_interval=0.2)
        )
        spans = await spans_of(source)
        for n, table in enumerate(order):
            assert await executor.add_span(spans[table], 50, prepare=False)
            # The spans before this one are already published and flushed to 900.
            await until(lambda: executor.checkpoint_ts == 900, timeout=SPARK_WAIT)
            added = order[: n + 1]
            await until(
                lambda added=added: all(executor.status(spans[t]).checkpoint_ts == 900 for t in added),
                timeout=SPARK_WAIT,
            )
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
            PipelineContext("cf", source, [sink], data_dir=tmp_path, start_ts=50, spark=spark, trigger_interval=0.2)
        )
        spans = await spans_of(source)
        customers, orders = spans["customers"], spans["orders"]
        assert await executor.add_span(customers, 50, prepare=False)
        await until(lambda: executor.checkpoint_ts == 900, timeout=SPARK_WAIT)
        assert await executor.add_span(orders, 50, prepare=False)
        await until(lambda: executor.status(orders).checkpoint_ts == 900, timeout=SPARK_WAIT)
        assert await executor.remove_span(orders) == 900
        # Moved elsewhere and back: the other capture flushed orders up to ts 200.
        assert await executor.add_span(orders, 200, prepare=False)
        await until(lambda: executor.status(orders).checkpoint_ts == 900, timeout=SPARK_WAIT)
        assert executor.error() is None
        await executor.close()

    asyncio.run(run())
    by_table = rows_by_table(sink)
    assert by_table["customers"] == list(range(20))
    # Every order once, then (at least once) again every order committed after ts 200.
    assert by_table["orders"] == list(range(20)) + list(range(11, 20))


def test_a_small_batch_costs_one_spark_job_and_an_empty_one_none(tmp_path, spark):
    rows = [insert("shop", "orders", {"id": i}, commit_ts=100 + i) for i in range(30)]
    # One batch of rows, then resolved ts only: empty batches (their own Spark offsets).
    source = ListSource.of([*rows, ListSource.resolved(200)])
    sink = ListSink()
    jobs = []

    async def run():
        executor = PipelineSpanExecutor(
            PipelineContext("cf", source, [sink], data_dir=tmp_path, start_ts=50, spark=spark, trigger_interval=0.2)
        )
        [span] = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        assert await executor.add_span(span, 50, prepare=False)
        await until(lambda: executor.checkpoint_ts == 200, timeout=SPARK_WAIT)
        # An empty batch: the store publishes a further resolved ts with no rows.
        await executor.set_barrier(None)
        executor.store.resolve(span, 300)
        await until(lambda: executor.checkpoint_ts == 300, timeout=SPARK_WAIT)
        # Spark runs a streaming query's jobs in a job group named by its run id.
        run_id = executor.pipeline._query.runId
        jobs.extend(spark.sparkContext.statusTracker().getJobIdsForGroup(run_id))
        await executor.close()

    asyncio.run(run())
    assert [r.after["id"] for r in sink.rows] == list(range(30))
    assert any(not b.rows for b in sink.batches.values())
    assert len(jobs) == len([b for b in sink.batches.values() if b.rows])


class LoggingSink(ListSink):
    """A list sink taking batches in parts, logging parts and checkpoints in arrival order.

    At the first part of a batch it calls ``during_batch(batch)`` and dwells a moment,
    as when the maintainer's heartbeat arrives while a batch is being written."""

    accepts_partial_batches = True

    def __init__(self, during_batch):
        super().__init__()
        self.during_batch = during_batch
        self.log: list[tuple[str, int, bool]] = []  # ("part", batch end, last) | ("checkpoint", ts, True)
        self.ids: list[int] = []

    def write_batch(self, batch):
        if batch.part == 0:
            self.during_batch(batch)
            time.sleep(0.3)  # room for a checkpoint write that ignores the batch to land now
        self.log.append(("part", batch.end_ts, batch.last_part))
        self.ids += [row.after["id"] for row in batch.rows]

    def write_checkpoint(self, ts):
        self.log.append(("checkpoint", ts, True))
        super().write_checkpoint(ts)


def test_the_changefeed_checkpoint_reaches_the_sinks_between_batches_and_at_close(tmp_path, spark):
    rows = [insert("shop", "orders", {"id": i}, commit_ts=100 + i * 10) for i in range(30)]
    source = ListSource.of([*rows, ListSource.resolved(500)])

    async def run():
        loop = asyncio.get_running_loop()
        executor = PipelineSpanExecutor(
            PipelineContext(
                "cf", source, [], data_dir=tmp_path, start_ts=50, spark=spark, trigger_interval=0.2, part_rows=4
            )
        )

        def heartbeat_during(batch):
            # One span: the changefeed checkpoint during a batch is where the batch starts.
            handed = asyncio.run_coroutine_threadsafe(executor.set_changefeed_checkpoint(batch.start_ts), loop)
            handed.result(timeout=30)

        sink = LoggingSink(heartbeat_during)
        executor.sinks.append(sink)
        [span] = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        await executor.set_changefeed_checkpoint(50)  # before the pipeline runs: written once it does
        await executor.set_barrier(300)
        assert await executor.add_span(span, 50, prepare=False)
        await until(lambda: executor.checkpoint_ts == 300, timeout=SPARK_WAIT)
        await executor.set_barrier(None)  # the next batch, (300, 500], comes in parts
        await until(lambda: executor.checkpoint_ts == 500, timeout=SPARK_WAIT)
        await executor.set_changefeed_checkpoint(executor.status(span).checkpoint_ts)
        await executor.set_changefeed_checkpoint(400)  # lower: ignored
        assert executor.error() is None
        await executor.close()  # the newest checkpoint is written, at the latest, now
        return sink

    sink = asyncio.run(run())
    assert sink.checkpoints == [50, 300, 500]
    assert sink.ids == list(range(30))
    # A checkpoint never lands between the parts of a batch: only after a last part (or before any).
    for before, (kind, _, _) in zip(sink.log, sink.log[1:], strict=False):
        if kind == "checkpoint":
            assert before[0] == "checkpoint" or before[2], sink.log
    assert ("checkpoint", 300, True) in sink.log[sink.log.index(("part", 500, True)) :]
