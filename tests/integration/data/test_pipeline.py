"""ListSource → event store → Spark streaming query (local[2]) → sinks, in this process."""

import asyncio

import pytest

from cdcflow.core.config.settings import ColumnSelectorSettings, SparkSettings
from cdcflow.core.data.events import DDLEvent, MicroBatch
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.data.span_executor import SpanState
from cdcflow.core.errors import DownstreamUnavailableError
from cdcflow.core.plugin.hookspec import hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import ListSink, ListSource, drive, insert, until, update

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark():
    from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session

    session = spark_session(SparkSettings(master="local[2]"))
    yield session
    stop_spark_session()


def test_the_jvm_runs_in_a_process_group_of_its_own(spark):
    """Launched without a fork running Python (a capture has gRPC threads), in its own group."""
    import os

    from pyspark import SparkContext

    jvm = SparkContext._gateway.proc  # PySpark keeps the gateway's Popen here
    assert os.getpgid(jvm.pid) == jvm.pid != os.getpgid(0)


class PartSink(ListSink):
    """A list sink that takes partial batches and keeps every part."""

    accepts_partial_batches = True

    def __init__(self):
        super().__init__()
        self.parts: list[MicroBatch] = []

    def write_batch(self, batch):
        self.parts.append(batch)


class FlushRecorder:
    def __init__(self):
        self.calls = []

    @hookimpl
    def cdcflow_batch_flushed(self, changefeed_id, batch_id, checkpoint_ts, row_count):
        self.calls.append((changefeed_id, batch_id, checkpoint_ts, row_count))


SPARK_WAIT = 120.0  # seconds a step may take with local Spark on a loaded machine (a hang guard)


def events():
    out = []
    for i in range(60):
        out.append(insert("shop", "orders", {"id": i, "qty": i % 7}, commit_ts=100 + i * 10, start_ts=95 + i * 10))
        out.append(insert("shop", "items", {"id": i}, commit_ts=100 + i * 10, start_ts=95 + i * 10))
        out.append(insert("audit", "log", {"id": i}, commit_ts=101 + i * 10))
        if i == 30:
            out.append(DDLEvent(400, "ALTER TABLE shop.orders ADD COLUMN note TEXT", out[0].table))
        if i % 10 == 9:
            out.append(ListSource.resolved(100 + i * 10 + 5))
    out.append(update("shop", "orders", {"id": 1}, {"id": 1, "qty": 99}, commit_ts=800))
    out.append(ListSource.resolved(900))
    return out


def test_pipeline_delivers_what_the_reference_driver_delivers(tmp_path, spark):
    filt = TableFilter(["shop.*"])
    selectors = [ColumnSelectorSettings(matcher=["shop.orders"], columns=["*", "!qty"])]
    reference = ListSink()
    asyncio.run(drive(ListSource.of(events()), [reference], changefeed_id="cf", start_ts=50, table_filter=filt))

    sink, part_sink = ListSink(), PartSink()
    plugins = PluginManager()
    recorder = FlushRecorder()
    plugins.register(recorder)
    checkpoints = []
    source = ListSource.of(events(), chunk=5)

    async def run():
        executor = PipelineSpanExecutor(
            PipelineContext(
                "cf",
                source,
                [sink, part_sink],
                data_dir=tmp_path,
                start_ts=50,
                spark=spark,
                plugins=plugins,
                table_filter=filt,
                column_selectors=selectors,
                trigger_interval=0.2,
                part_rows=7,
                collect_rows=10,  # batches above 10 rows go through Spark-written sorted files
                on_checkpoint=checkpoints.append,
            )
        )
        spans = {t.table: (await source.spans_for(t))[0] for t in await source.list_tables()}
        orders, items, audit = spans["orders"], spans["items"], spans["log"]
        assert await executor.add_span(orders, 50, prepare=False)
        assert await executor.add_span(audit, 50, prepare=False)
        await until(lambda: executor.checkpoint_ts == 900, timeout=SPARK_WAIT)
        # items moves here from a capture that kept replicating it: prepared first, it
        # catches up without being written ...
        await executor.add_span(items, 50, prepare=True)
        await until(lambda: executor.status(items).state is SpanState.PREPARED, timeout=SPARK_WAIT)
        assert executor.status(items).resolved_ts == 900
        assert not any(r.table.table == "items" for r in sink.rows)
        # ... then replicated from the checkpoint the (imaginary) previous owner reached.
        assert await executor.add_span(items, 300, prepare=False)
        assert executor.status(items).checkpoint_ts == 300
        # Its rows after that checkpoint follow in a batch of their own.
        await until(lambda: executor.status(items).checkpoint_ts == 900, timeout=SPARK_WAIT)
        assert set(executor.spans()) == {orders, items, audit}
        assert executor.error() is None
        await executor.close()
        return executor

    asyncio.run(run())

    assert checkpoints and checkpoints[-1] == 900 and checkpoints == sorted(checkpoints)
    assert sink.opened and sink.closed
    selection = ColumnSelection(selectors)
    expected = [selection.apply(r) for r in reference.rows if r.table.table == "orders"]
    assert all("qty" not in r.after for r in sink.rows if r.table.table == "orders")
    assert [r for r in sink.rows if r.table.table == "orders"] == expected
    late_items = [r for r in reference.rows if r.table.table == "items" and r.commit_ts > 300]
    assert [r for r in sink.rows if r.table.table == "items"] == late_items
    # The DDL ends a batch, after that batch's rows.
    [ddl_batch] = [b for b in sink.batches.values() if b.ddl]
    assert ddl_batch.end_ts == 400
    assert all(r.commit_ts <= 400 for b in sink.batches.values() if b.batch_id <= ddl_batch.batch_id for r in b.rows)
    # Partial batches: same rows, parts of at most 7 rows, DDL on the last part only.
    assert [r for p in part_sink.parts for r in p.rows] == sink.rows
    assert all(len(p.rows) <= 7 for p in part_sink.parts)
    assert all(p.last_part == bool(p.ddl) for p in part_sink.parts if p.ddl)
    assert [c[1] for c in recorder.calls] == sorted(sink.batches)
    assert recorder.calls[-1][2] == 900


class FlakySink(ListSink):
    """Cannot reach its downstream for the first two attempts."""

    def __init__(self):
        super().__init__()
        self.failures = 0

    def write_batch(self, batch):
        if self.failures < 2:
            self.failures += 1
            raise DownstreamUnavailableError("downstream refused the connection")
        super().write_batch(batch)


def test_prepared_span_rows_follow_once_replicating_and_sink_errors_are_retried(tmp_path, spark):
    source = ListSource.of(
        [insert("shop", "items", {"id": i}, commit_ts=100 + i) for i in range(20)] + [ListSource.resolved(200)]
    )
    sink = FlakySink()

    async def run():
        executor = PipelineSpanExecutor(
            PipelineContext("cf2", source, [sink], data_dir=tmp_path, start_ts=50, spark=spark)
        )
        [span] = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        await executor.add_span(span, 50, prepare=True)
        await executor.add_span(span, 110, prepare=False)
        await until(lambda: executor.error() is not None, timeout=SPARK_WAIT)
        assert isinstance(executor.error(), DownstreamUnavailableError)  # the changefeed would go Warning
        await until(lambda: executor.status(span).checkpoint_ts == 200, timeout=SPARK_WAIT)
        assert executor.error() is None
        assert await executor.remove_span(span) == 200
        assert executor.status(span).state is SpanState.STOPPED
        await executor.close()

    asyncio.run(run())
    assert [r.after["id"] for r in sink.rows] == list(range(11, 20))
    assert sink.failures == 2 and list(sink.deliveries) == [0]


class UnreachableAtOpen(ListSink):
    """Its downstream refuses the first two connections, when the sink is opened."""

    def __init__(self):
        super().__init__()
        self.refusals = 0
        self.closes = 0

    def open(self, context):
        if self.refusals < 2:
            self.refusals += 1
            raise DownstreamUnavailableError("downstream refused the connection")
        super().open(context)

    def close(self):
        self.closes += 1
        super().close()


def test_a_sink_that_cannot_open_is_retried_until_its_downstream_answers(tmp_path, spark):
    source = ListSource.of(
        [insert("shop", "items", {"id": i}, commit_ts=100 + i) for i in range(20)] + [ListSource.resolved(200)]
    )
    sink = UnreachableAtOpen()
    errors = []

    async def run():
        executor = PipelineSpanExecutor(
            PipelineContext("cf3", source, [sink], data_dir=tmp_path, start_ts=50, spark=spark)
        )
        [span] = [s for t in await source.list_tables() for s in await source.spans_for(t)]
        await executor.add_span(span, 50, prepare=False)
        await until(lambda: executor.error() is not None, timeout=SPARK_WAIT)
        errors.append(executor.error())  # the changefeed shows Warning 2001 while the open is retried
        await until(lambda: executor.checkpoint_ts == 200, timeout=SPARK_WAIT)
        assert executor.error() is None
        await executor.close()

    asyncio.run(run())
    assert isinstance(errors[0], DownstreamUnavailableError) and errors[0].code == 2001
    assert sink.refusals == 2 and sink.opened
    assert [r.after["id"] for r in sink.rows] == list(range(20))
    assert sink.closes == 3  # what each refused open held is released, and the sink at the end
