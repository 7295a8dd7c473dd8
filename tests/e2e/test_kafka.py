"""Playground workload → ``cdcflow run`` (tikv source, Spark pipeline, Kafka sink) → Kafka.

The playground and the Kafka mock cluster live in the test process; the capture is a
separate ``cdcflow run`` process reaching both over the network. An independent Open
Protocol consumer rebuilds every shop table from the topic (buffer per partition, apply
at resolved ts, drop replays at or below the partition's resolved ts) and the tables
must equal the playground's snapshot at the consumer's final resolved ts, row by row.

Each shop table is one span of the changefeed. The last test runs the connectors
file's executor in the test process and adds the tables one by one to the running
pipeline (each after the checkpoint advanced), playing the maintainer's part itself:
a pipeline that loses the rows of spans added after the first, or a sink that sends
resolved events past rows still to come, fails it on two tables of three.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest

from cdcflow.core.config import load_deployment
from cdcflow.core.data.events import Span
from cdcflow.core.data.pipeline.session import stop_spark_session
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.plugin.manager import get_plugin_manager
from cdcflow.core.testing import until
from cdcflow.plugins.sinks.kafka.mock import mock_cluster
from cdcflow.plugins.sources.playground import Playground
from tests.e2e.e2e_kafka import (
    TABLES,
    CaptureProcess,
    assert_equals_snapshot,
    record_key,
    region_of,
    replicate,
)

pytestmark = pytest.mark.integration

RATE = 30.0  # workload transactions per second: every table busy, within the mock cluster's retention


def kafka_topic(partitions: int = 3) -> tuple[str, str]:
    cluster = mock_cluster(3)
    topic = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, partitions, 3)
    return cluster.bootstrap_servers, topic


def playground() -> Playground:
    # No automatic splits and no DDL: the faults below are placed by the tests.
    return Playground(stores=3, seed=17, ddl_every=0, split_keys=0, split_bytes=0)


def finish(pg: Playground, capture: CaptureProcess) -> int:
    """Stop the workload, wait until the capture has checkpointed past every commit, stop it."""
    pg.stop_workload()
    final_ts = pg.now()
    capture.wait_checkpoint(final_ts)
    capture.stop()
    return final_ts


def test_workload_through_the_capture_equals_the_snapshot(tmp_path):
    bootstrap, topic = kafka_topic()
    with playground() as pg:
        start_ts = pg.now()
        capture = CaptureProcess(tmp_path, pg, bootstrap, topic, start_ts)
        capture.start()
        try:
            pg.start_workload(RATE)
            capture.wait_checkpoint(pg.now())  # the pipeline is up and keeps up with live commits
            time.sleep(5)
            final_ts = finish(pg, capture)
        finally:
            capture.kill()
        replica = replicate(bootstrap, topic)
        assert replica.resolved_ts >= final_ts
        counts = assert_equals_snapshot(pg, replica)
    assert all(counts[t] > 0 for t in TABLES), counts  # every table (every span) carried rows
    assert replica.rows_applied >= sum(counts.values())


@pytest.mark.timeout(600)  # two capture start-ups (JVM, Spark) on a shared 2-core machine
def test_sigkill_mid_run_and_restart_from_the_checkpoint(tmp_path):
    bootstrap, topic = kafka_topic()
    with playground() as pg:
        start_ts = pg.now()
        # All spans at once: this test is about the restart (late joins: the last test).
        capture = CaptureProcess(tmp_path, pg, bootstrap, topic, start_ts, adds_per_tick=0)
        capture.start()
        try:
            pg.start_workload(RATE)
            capture.wait_checkpoint(pg.now())
            time.sleep(2)
            capture.kill()  # mid-run: the workload keeps committing while the capture is down
            _, killed_at = capture.checkpoint()
            assert killed_at > start_ts
            time.sleep(3)
            down_until = pg.now()
            capture.start()
            capture.wait_checkpoint(down_until)
            time.sleep(2)
            final_ts = finish(pg, capture)
        finally:
            capture.kill()
        assert killed_at < down_until < final_ts  # rows committed while down came after the restart
        replica = replicate(bootstrap, topic)
        assert replica.resolved_ts >= final_ts
        counts = assert_equals_snapshot(pg, replica)
    assert all(counts[t] > 0 for t in TABLES), counts


def test_region_split_and_leader_transfer_during_the_run(tmp_path):
    bootstrap, topic = kafka_topic()
    with playground() as pg:
        start_ts = pg.now()
        capture = CaptureProcess(tmp_path, pg, bootstrap, topic, start_ts)
        capture.start()
        try:
            pg.start_workload(RATE)
            capture.wait_checkpoint(pg.now())
            regions_before = {r.id for r in pg.regions()}
            # Split inside the orders table's rows, then move a leader of a live region.
            left, right = pg.split_region(record_key(pg, "orders", 50))
            assert {left.id, right.id} - regions_before, "the split made no new region"
            moved = region_of(pg, record_key(pg, "customers", 1))
            leader_before = pg.cluster.regions.by_id(moved).leader_store
            after = pg.transfer_leader(moved)
            assert after.leader_store != leader_before
            time.sleep(3)
            right_leader = pg.transfer_leader(right.id)
            assert right_leader.id == right.id
            time.sleep(3)
            final_ts = finish(pg, capture)
        finally:
            capture.kill()
        replica = replicate(bootstrap, topic)
        assert replica.resolved_ts >= final_ts
        counts = assert_equals_snapshot(pg, replica)
    assert all(counts[t] > 0 for t in TABLES), counts


class MaintainerRole:
    """The maintainer's part for the sinks, played by the test: with every heartbeat it
    hands the executor the changefeed checkpoint, the minimum over ALL the changefeed's
    spans, a span not added yet counted at the start ts it will be added with (as the
    maintainer withholds progress while a span is absent)."""

    def __init__(self, executor: PipelineSpanExecutor, spans: list[Span], start_ts: int) -> None:
        self.executor, self.spans, self.start_ts = executor, spans, start_ts
        self.added: set[Span] = set()

    def checkpoint(self) -> int:
        return min(
            self.executor.status(span).checkpoint_ts if span in self.added else self.start_ts for span in self.spans
        )

    async def heartbeats(self, interval: float = 0.1) -> None:
        while True:
            await self.executor.set_changefeed_checkpoint(self.checkpoint())
            await asyncio.sleep(interval)


async def replicate_with_tables_joining_one_by_one(capture: CaptureProcess, pg: Playground, start_ts: int) -> int:
    """The connectors file's executor in this process; the shop tables join the running
    pipeline one at a time, each after a checkpoint advance; returns the final ts."""
    plugins = get_plugin_manager()
    deployment = load_deployment(capture.file, plugins)
    connector = deployment.connectors[0]
    source = connector.source.instantiate()
    await source.open()
    try:
        spans = [span for table in await source.list_tables() if table.schema == "shop"
                 for span in await source.spans_for(table)]  # fmt: skip
    finally:
        await source.close()
    assert len(spans) == len(TABLES)
    executor = PipelineSpanExecutor(
        PipelineContext.for_connector(connector, deployment.server, start_ts=start_ts, plugins=plugins)
    )
    maintainer = MaintainerRole(executor, spans, start_ts)
    heartbeats = asyncio.create_task(maintainer.heartbeats())
    try:
        for span in spans:
            await executor.add_span(span, start_ts, prepare=False)
            maintainer.added.add(span)
            # batches ran before the next joins
            await until_checkpoint(executor, lambda: executor.checkpoint_ts, pg.now())
        pg.stop_workload()
        final_ts = pg.now()
        await until_checkpoint(executor, maintainer.checkpoint, final_ts)
        await executor.set_changefeed_checkpoint(maintainer.checkpoint())
    finally:
        heartbeats.cancel()
        await asyncio.gather(heartbeats, return_exceptions=True)
        await executor.close()  # writes the last changefeed checkpoint handed to it
    assert executor.changefeed_checkpoint >= final_ts
    return final_ts


async def until_checkpoint(executor, checkpoint: Callable[[], int], ts: int, timeout: float = 240.0) -> None:
    """Wait until ``checkpoint()`` reaches ``ts``; fail at once if the executor fails."""

    def reached() -> bool:
        assert executor.error() is None, executor.error()
        return checkpoint() >= ts

    await until(reached, timeout=timeout, interval=0.2, message=f"the checkpoint to reach {ts}", observe=checkpoint)


def test_tables_joining_a_running_pipeline_lose_no_rows(tmp_path):
    bootstrap, topic = kafka_topic()
    with playground() as pg:
        start_ts = pg.now()
        pg.start_workload(RATE)
        capture = CaptureProcess(tmp_path, pg, bootstrap, topic, start_ts)  # only its connectors file is used
        try:
            final_ts = asyncio.run(replicate_with_tables_joining_one_by_one(capture, pg, start_ts))
        finally:
            pg.stop_workload()
            stop_spark_session()  # the executor started this process's session: end its JVM
        replica = replicate(bootstrap, topic)
        assert replica.resolved_ts >= final_ts
        counts = assert_equals_snapshot(pg, replica)
    assert all(counts[t] > 0 for t in TABLES), counts
