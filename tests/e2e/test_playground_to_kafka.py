"""The playground's shop workload, mounted as the TiKV source does, through the Kafka sink.

Committed changes are taken from the playground's MVCC store as they happen
(the EventFeed client is tested elsewhere); the schema comes from the
playground's TiDB status API over HTTP; rows are mounted by the TiDB row
decoder and written in micro-batches to the mock cluster. The independent
consumer's tables must equal the playground's snapshot at the last resolved ts.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from cdcflow.core.data.events import MicroBatch, RawKVEvent, RowChange, Span
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing.open_protocol import read_topic, rebuild
from cdcflow.plugins.sinks.kafka import KafkaSink, KafkaSinkConfig
from cdcflow.plugins.sinks.kafka.dispatch import DispatchRule
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.mvcc import ChangeKind, Op
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBMounter
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore
from cdcflow.plugins.sources.tikv.tidb.status_api import StatusAPIClient

#: The plugin manager sinks are opened with (their codecs are plugins).
PLUGINS = PluginManager.default(autoload=False)

pytestmark = pytest.mark.integration

TABLES = ("customers", "products", "orders")


async def mount_all(status_address: str, start_ts: int, events: list[RawKVEvent]) -> list[RowChange]:
    store = SchemaStore()
    async with StatusAPIClient(f"http://{status_address}") as client:
        await store.load(client, start_ts)
    mounter = TiDBMounter(store)
    rows = []
    for event in events:
        mounted = await mounter.mount_event(event)
        if isinstance(mounted, RowChange):
            rows.append(mounted)
    return rows


def batches(rows: list[RowChange], final_ts: int, size: int = 300) -> list[MicroBatch]:
    """Micro-batches of about ``size`` rows, cut between commit timestamps."""
    rows = sorted(rows, key=RowChange.sort_key)
    out: list[MicroBatch] = []
    start, chunk = 0, []
    for i, row in enumerate(rows):
        chunk.append(row)
        last = i + 1 == len(rows)
        if last or (len(chunk) >= size and rows[i + 1].commit_ts != row.commit_ts):
            end = final_ts if last else row.commit_ts
            out.append(MicroBatch("pg", len(out), start, end, tuple(chunk)))
            start, chunk = end, []
    return out


def test_playground_workload_through_kafka_equals_the_snapshot():
    with Playground(stores=1, seed=11, ddl_every=0, split_keys=0) as pg:
        start_ts = pg.now()
        committed: list[RawKVEvent] = []
        span = Span(0, b"", b"")

        def observe(changes):
            for c in changes:
                if c.kind is ChangeKind.COMMIT:
                    delete = c.op is Op.DELETE
                    value = b"" if delete else c.value
                    committed.append(RawKVEvent(span, c.key, value, c.old_value, c.start_ts, c.commit_ts, delete))

        pg.cluster.mvcc.subscribe(observe)
        stats = pg.run_workload(150)
        final_ts = pg.now()
        snapshots = {t: pg.snapshot(t, final_ts) for t in TABLES}
        rows = asyncio.run(mount_all(pg.status_address, start_ts, committed))

    assert stats.rows > 0 and len(rows) >= stats.rows // 2
    topic = f"pg-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(
        KafkaSinkConfig(
            uri=f"kafka://mock/{topic}",
            topic=topic,
            partition_num=3,
            max_batch_size=16,
            dispatchers=[
                DispatchRule(matcher=["shop.orders"], topic="{schema}_{table}_" + topic, partition="index-value")
            ],
        )
    )
    sink.open(SinkContext("pg", plugins=PLUGINS))
    for batch in batches(rows, final_ts):
        sink.write_batch(batch)
        sink.write_checkpoint(batch.end_ts)  # one span: its frontier is the changefeed checkpoint
    sink.close()

    tables = {}
    for name in (topic, f"shop_orders_{topic}"):
        replica = rebuild(read_topic(sink.bootstrap_servers, name))
        assert replica.resolved_ts == final_ts
        tables.update(replica.tables)
    for table in TABLES:
        got = {key[0]: row for key, row in tables.get(("shop", table), {}).items()}
        want = {row["id"]: row for row in snapshots[table]}
        assert got == want, table
