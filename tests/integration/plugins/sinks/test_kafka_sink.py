"""Kafka sink end to end on librdkafka's mock cluster, read back by an independent consumer."""

from __future__ import annotations

import asyncio
import dataclasses
import decimal
import random
import re
import time
import uuid

import pytest
from confluent_kafka import Producer

from cdcflow.core.data.events import ColumnInfo, DDLEvent, MicroBatch, OpType, RowChange, TableSchema
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.errors import DownstreamUnavailableError
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import ListSource, delete, drive, insert, update
from cdcflow.core.testing.open_protocol import decode, read_topic, rebuild
from cdcflow.plugins.codecs.open_protocol import MessageTooLargeError
from cdcflow.plugins.sinks.kafka import KafkaSink, KafkaSinkConfig
from cdcflow.plugins.sinks.kafka.dispatch import DispatchRule
from cdcflow.plugins.sinks.kafka.mock import mock_cluster

#: The plugin manager sinks are opened with (their codecs are plugins).
PLUGINS = PluginManager.default(autoload=False)

pytestmark = pytest.mark.integration

PK = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY
SCHEMAS = {
    ("shop", "orders"): (
        ColumnInfo("id", 8, PK),
        ColumnInfo("note", 15, ColumnInfo.NULLABLE),
        ColumnInfo("price", 246, ColumnInfo.NULLABLE),
        ColumnInfo("raw", 253, ColumnInfo.NULLABLE | ColumnInfo.BINARY),
    ),
    ("shop", "users"): (ColumnInfo("id", 8, PK), ColumnInfo("name", 15, ColumnInfo.NULLABLE)),
    ("crm", "events"): (
        ColumnInfo("id", 8, PK),
        ColumnInfo("payload", 252, ColumnInfo.NULLABLE | ColumnInfo.BINARY),
        ColumnInfo("amount", 5, ColumnInfo.NULLABLE),
    ),
}


def with_schema(change: RowChange) -> RowChange:
    columns = SCHEMAS[(change.table.schema, change.table.table)]
    return dataclasses.replace(change, schema=TableSchema(change.table, columns))


def random_image(rnd: random.Random, table: tuple[str, str], key: int) -> dict[str, object]:
    if table == ("shop", "orders"):
        return {
            "id": key,
            "note": rnd.choice(["", "gift <wrap> & bow", "é", None, "x" * rnd.randint(0, 40)]),
            "price": decimal.Decimal(rnd.randint(0, 10**6)) / 100,
            "raw": bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 12))),
        }
    if table == ("shop", "users"):
        return {"id": key, "name": rnd.choice(["ann", "bob", "\u2028odd", None])}
    return {"id": key, "payload": rnd.randbytes(rnd.randint(0, 30)), "amount": rnd.uniform(-1e6, 1e6)}


def workload(seed: int, count: int) -> tuple[list[object], dict[tuple[str, str], dict[int, dict[str, object]]]]:
    """Events (rows with schemas, a DDL, resolved markers) and the tables' final state."""
    rnd = random.Random(seed)
    state: dict[tuple[str, str], dict[int, dict[str, object]]] = {t: {} for t in SCHEMAS}
    events: list[object] = []
    ts = 1000
    for n in range(count):
        ts += rnd.randint(1, 3)
        table = rnd.choice(list(SCHEMAS))
        rows = state[table]
        choice = rnd.random()
        if not rows or choice < 0.45:
            key = rnd.randint(1, 10_000)
            while key in rows:
                key += 1
            image = random_image(rnd, table, key)
            events.append(with_schema(insert(*table, image, commit_ts=ts)))
            rows[key] = image
        elif choice < 0.8:
            key = rnd.choice(sorted(rows))
            new_key = key
            if table == ("shop", "orders") and rnd.random() < 0.3:
                new_key = max(rows) + 1  # the primary key changes: the row moves partition
            image = random_image(rnd, table, new_key)
            events.append(with_schema(update(*table, rows.pop(key), image, commit_ts=ts)))
            rows[new_key] = image
        else:
            key = rnd.choice(sorted(rows))
            events.append(with_schema(delete(*table, rows.pop(key), commit_ts=ts)))
        if n == count // 2:
            ts += 1
            orders = next(e.table for e in events if isinstance(e, RowChange) and e.table.table == "orders")
            events.append(DDLEvent(ts, "ALTER TABLE orders ADD COLUMN extra INT", orders, action_type=5))
        if n % 97 == 0:
            events.append(ListSource.resolved(ts))
    events.append(ListSource.resolved(ts + 1))
    return events, state


def sink_for(topic: str, **options: object) -> KafkaSink:
    base: dict[str, object] = {
        "uri": f"kafka://mock/{topic}?brokers=3",
        "topic": topic,
        "partition-num": 4,
        "max-batch-size": 8,
        "dispatchers": [
            DispatchRule(matcher=["shop.orders"], topic="{schema}_{table}_" + topic, partition="index-value"),
            DispatchRule(matcher=["shop.users"], partition="ts"),
            DispatchRule(matcher=["crm.*"], partition="columns", columns=["ID"]),
        ],
    }
    base.update(options)
    return KafkaSink(KafkaSinkConfig(**base))


def replicas(bootstrap: str, topics: list[str]):
    out = {}
    for topic in topics:
        out[topic] = rebuild(read_topic(bootstrap, topic))
    return out


def merged_tables(reps) -> dict[tuple[str, str], dict[int, dict[str, object]]]:
    tables: dict[tuple[str, str], dict[int, dict[str, object]]] = {t: {} for t in SCHEMAS}
    for replica in reps.values():
        for table, rows in replica.tables.items():
            tables[table].update({key[0]: row for key, row in rows.items()})
    return tables


def test_consumer_rebuilds_source_state_with_a_restart_replaying_batches():
    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    events, final_state = workload(seed=7, count=1500)
    resolved_marks = [e.ts for e in events if not isinstance(e, RowChange | DDLEvent)]
    early, middle = resolved_marks[len(resolved_marks) // 3], resolved_marks[2 * len(resolved_marks) // 3]

    first = sink_for(topic)
    result = asyncio.run(drive(ListSource.of(events), [first], until_ts=middle))
    assert result.checkpoint_ts >= middle
    bootstrap = first.bootstrap_servers
    # A restart from an older checkpoint: batches after `early` are produced a second time.
    second = sink_for(topic)
    asyncio.run(drive(ListSource.of(events), [second], start_ts=early, first_batch_id=1000))

    orders_topic = f"shop_orders_{topic}"
    reps = replicas(bootstrap, [topic, orders_topic])
    assert merged_tables(reps) == final_state
    assert sum(r.duplicates_dropped for r in reps.values()) > 0
    assert reps[orders_topic].ddl == [
        (next(e.commit_ts for e in events if isinstance(e, DDLEvent)), "ALTER TABLE orders ADD COLUMN extra INT")
    ]
    assert reps[topic].ddl == []
    # every partition of the orders topic got the DDL and the final resolved ts
    for partition, messages in read_topic(bootstrap, orders_topic).items():
        assert any(b'"t":2}' in key for key, _ in messages), f"partition {partition} misses the DDL"
        assert messages[-1][0].endswith(b'"t":3}'), f"partition {partition} does not end with a resolved event"


def test_topics_get_partition_num_partitions_on_the_mock_cluster():
    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    sink = sink_for(topic, **{"partition-num": 5, "dispatchers": []})
    sink.open(SinkContext("cf", plugins=PLUGINS))
    cluster = sink.mock_cluster
    assert cluster is not None
    probe = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    assert len(probe.list_topics(topic, timeout=10).topics[topic].partitions) == 5
    # what the mock does on its own: auto-creation with 4 partitions, whatever partition-num says
    auto = f"auto-{topic}"
    assert len(probe.list_topics(auto, timeout=10).topics[auto].partitions) == 4
    sink.close()


def test_oversize_row_is_an_error_naming_table_and_key():
    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    sink = sink_for(topic, **{"max-message-bytes": 2048, "dispatchers": []})
    sink.open(SinkContext("cf", plugins=PLUGINS))
    small = with_schema(insert("shop", "orders", {"id": 1, "note": "n"}, commit_ts=9))
    big = with_schema(insert("shop", "orders", {"id": 4242, "note": "n" * 5000}, commit_ts=10))
    with pytest.raises(MessageTooLargeError, match=r"shop\.orders \(id=4242\)"):
        sink.write_batch(MicroBatch("cf", 0, 0, 10, (small, big)))
    sink.close()
    # the batch failed before any of its messages was produced
    assert sum(len(m) for m in read_topic(sink.bootstrap_servers, topic).values()) == 0


def test_handle_key_only_sends_the_key_of_an_oversize_row():
    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    sink = sink_for(
        topic, **{"max-message-bytes": 2048, "dispatchers": [], "large-message-handle-option": "handle-key-only"}
    )
    sink.open(SinkContext("cf", plugins=PLUGINS))
    big = with_schema(insert("shop", "orders", {"id": 4242, "note": "n" * 5000}, commit_ts=10))
    sink.write_batch(MicroBatch("cf", 0, 0, 10, (big,)))
    keys = [k for msgs in read_topic(sink.bootstrap_servers, topic).values() for k, _ in msgs]
    assert sum(b'"ohk":true' in k for k in keys) == 1
    sink.close()


def test_brokers_down_is_downstream_unavailable_then_recovers():
    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    # a cluster of its own (2 brokers) so that taking it down disturbs no other test
    sink = sink_for(
        topic, **{"uri": f"kafka://mock/{topic}?brokers=2", "brokers": 2, "write-timeout": 1.5, "dispatchers": []}
    )
    sink.open(SinkContext("cf", plugins=PLUGINS))
    cluster = mock_cluster(2)
    row = with_schema(insert("shop", "users", {"id": 1, "name": "a"}, commit_ts=10))
    for broker in (1, 2):
        cluster.set_broker_down(broker)
    try:
        with pytest.raises(DownstreamUnavailableError) as info:
            sink.write_batch(MicroBatch("cf", 0, 0, 10, (row,)))
        assert info.value.code == 2001
        # The failed message's delivery report (the producer asks for failures' reports only).
        assert re.search(rf"{topic}\[\d+\]: Local: Message timed out", str(info.value)), info.value
    finally:
        for broker in (1, 2):
            cluster.set_broker_down(broker, down=False)
    # the runtime retries a 2001 with backoff; the replay succeeds once the producer has reconnected
    for attempt in range(20):
        try:
            sink.write_batch(MicroBatch("cf", 0, 0, 10, (row,)))
            break
        except DownstreamUnavailableError:
            time.sleep(0.5 * attempt)
    else:
        pytest.fail("the sink never recovered after the brokers came back")
    sink.write_checkpoint(10)
    sink.close()
    ops = rebuild(read_topic(sink.bootstrap_servers, topic))
    assert [row for rows in ops.tables.values() for row in rows.values()] == [{"id": 1, "name": "a"}]


def test_updates_that_move_the_key_are_split(tmp_path):
    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    sink = sink_for(topic, **{"dispatchers": [DispatchRule(matcher=["*.*"], partition="index-value")]})
    sink.open(SinkContext("cf", plugins=PLUGINS))
    moved = with_schema(update("shop", "users", {"id": 1, "name": "a"}, {"id": 2, "name": "a"}, commit_ts=10))
    sink.write_batch(MicroBatch("cf", 0, 0, 10, (moved,)))
    values = [v for msgs in read_topic(sink.bootstrap_servers, topic).values() for k, v in msgs if b'"t":1}' in k]
    assert sorted(v[8:10] for v in values) == [b'{"', b'{"']
    assert sorted(v[10:13] for v in values) == [b'd":', b'u":']
    sink.close()
    assert moved.op is OpType.UPDATE


def test_canal_json_over_kafka_with_watermarks():
    import json

    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    sink = sink_for(topic, **{"protocol": "canal-json", "enable-tidb-extension": True, "dispatchers": []})
    sink.open(SinkContext("cf", plugins=PLUGINS))
    rows = tuple(with_schema(insert("shop", "users", {"id": i, "name": f"n{i}"}, commit_ts=10 + i)) for i in range(10))
    sink.write_batch(MicroBatch("cf", 0, 0, 30, rows))
    watermarks = [v for ms in read_topic(sink.bootstrap_servers, topic).values() for _, v in ms if b"WATERMARK" in v]
    assert watermarks == []  # a batch's end is no watermark: only the changefeed checkpoint is
    sink.write_checkpoint(30)
    partitions = read_topic(sink.bootstrap_servers, topic)
    assert len(partitions) == 4
    docs = [json.loads(value) for messages in partitions.values() for _, value in messages]
    assert sorted(int(d["data"][0]["id"]) for d in docs if d["type"] == "INSERT") == list(range(10))
    for messages in partitions.values():
        last = json.loads(messages[-1][1])
        assert (last["type"], last["_tidb"]) == ("TIDB_WATERMARK", {"watermarkTs": 30})
    sink.close()


def test_parts_of_a_batch_get_no_resolved_event_the_checkpoint_past_them_does():
    from types import SimpleNamespace

    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    sink = sink_for(topic, **{"partition-num": 2, "dispatchers": []})
    sink.open(SinkContext("cf", plugins=PLUGINS))
    assert KafkaSink.accepts_partial_batches
    rows = [with_schema(insert("shop", "users", {"id": i, "name": "n"}, commit_ts=10 + i)) for i in range(4)]

    def part(n, last, chunk):
        return SimpleNamespace(
            changefeed_id="cf", batch_id=0, start_ts=0, end_ts=20, rows=chunk, ddl=(), part=n, last_part=last
        )

    def resolved_count():
        return sum(k.endswith(b'"t":3}') for ms in read_topic(sink.bootstrap_servers, topic).values() for k, _ in ms)

    sink.write_batch(part(0, False, rows[:2]))
    assert resolved_count() == 0
    sink.write_batch(part(1, True, rows[2:]))
    assert resolved_count() == 0
    sink.write_checkpoint(20)
    assert resolved_count() == 2  # one per partition
    replica = rebuild(read_topic(sink.bootstrap_servers, topic))
    assert sorted(k[0] for rows_ in replica.tables.values() for k in rows_) == [0, 1, 2, 3]
    sink.close()


def resolved_and_rows(messages: list[tuple[bytes, bytes]]) -> list[tuple[str, int]]:
    """("resolved" | "row", ts) of every event of a partition, in offset order."""
    out = []
    for key, value in messages:
        for k, _ in decode(key, value):
            if k["t"] in (1, 3):
                out.append(("resolved" if k["t"] == 3 else "row", k["ts"]))
    return out


def test_resolved_events_come_only_from_changefeed_checkpoints_after_the_rows():
    """A batch's end ts is one capture's frontier: a span joining behind it delivers rows
    below it later. Only the changefeed checkpoint becomes a resolved event, on every
    partition of every known topic, after the rows it covers."""
    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    orders_topic = f"shop_orders_{topic}"
    sink = sink_for(topic)
    sink.open(SinkContext("cf", plugins=PLUGINS))
    bootstrap = sink.bootstrap_servers

    def orders(ids, ts):
        image = {"note": "n", "price": None, "raw": None}
        return [with_schema(insert("shop", "orders", {"id": i, **image}, commit_ts=ts + i)) for i in ids]

    def users(ids, ts):
        return [with_schema(insert("shop", "users", {"id": i, "name": "u"}, commit_ts=ts + i)) for i in ids]

    sink.write_batch(MicroBatch("cf", 0, 0, 40, (*orders(range(4), 10), *users(range(4), 10))))
    reps = replicas(bootstrap, [topic, orders_topic])
    assert all(r.resolved_ts == 0 and r.rows_applied == 0 for r in reps.values())  # nothing promised yet
    sink.write_checkpoint(25)  # the changefeed is complete up to 25 only: another span is behind
    # The span that was behind joins: its rows (ts 30..33) are below the first batch's end.
    late = sorted((*orders(range(10, 14), 20), *users(range(10, 14), 20)), key=lambda r: r.commit_ts)
    sink.write_batch(MicroBatch("cf", 1, 40, 60, (*late, *orders([20], 35))))
    sink.write_checkpoint(60)
    sink.close()

    for name in (topic, orders_topic):
        partitions = read_topic(bootstrap, name)
        assert len(partitions) == 4
        for partition, messages in partitions.items():
            events = resolved_and_rows(messages)
            assert [ts for kind, ts in events if kind == "resolved"] == [25, 60], (name, partition, events)
            for n, (kind, ts) in enumerate(events):
                if kind == "resolved":  # every row at or below it came before it
                    assert not [e for e in events[n + 1 :] if e[0] == "row" and e[1] <= ts], (name, partition)
    reps = replicas(bootstrap, [topic, orders_topic])
    assert all(r.resolved_ts == 60 and r.duplicates_dropped == 0 for r in reps.values())
    tables = merged_tables(reps)
    assert sorted(tables[("shop", "orders")]) == [0, 1, 2, 3, 10, 11, 12, 13, 20]
    assert sorted(tables[("shop", "users")]) == [0, 1, 2, 3, 10, 11, 12, 13]
