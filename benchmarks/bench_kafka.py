#!/usr/bin/env python3
"""Kafka sink throughput against the raw librdkafka produce rate, in one run.

    .venv/bin/python benchmarks/bench_kafka.py [--rows 100000] [--batch 10000] [--rounds 3]

Three figures on the same machine, same in-process mock cluster, same topic
layout (4 partitions, idempotent producer, acks=all):

* ``encode``: Open Protocol encoding alone (codec.encode_rows), rows/s;
* ``raw``: librdkafka producing the *pre-encoded* messages of the same rows
  (no dispatch, no encoding), rows/s — the ceiling a Python sink can reach;
* ``sink``: KafkaSink.write_batch end to end (dispatch, encode, produce,
  resolved events, flush per batch), rows/s.

The ratios ``sink/raw`` and ``sink/encode`` are what to compare between runs:
absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import dataclasses
import decimal
import json
import random
import statistics
import time
import uuid

from confluent_kafka import Producer

from cdcflow.core.data.events import ColumnInfo, MicroBatch, RowChange, TableSchema
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import insert, update
from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
from cdcflow.plugins.sinks.kafka import KafkaSink, KafkaSinkConfig
from cdcflow.plugins.sinks.kafka.dispatch import DispatchRule

#: The plugin manager sinks are opened with (their codecs are plugins).
PLUGINS = PluginManager.default(autoload=False)

PK = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY
COLUMNS = (
    ColumnInfo("id", 8, PK),
    ColumnInfo("customer", 15, ColumnInfo.NULLABLE),
    ColumnInfo("amount", 246, ColumnInfo.NULLABLE),
    ColumnInfo("qty", 3, ColumnInfo.NULLABLE),
    ColumnInfo("note", 252, ColumnInfo.NULLABLE),
)


def make_rows(count: int, seed: int = 1) -> list[RowChange]:
    rnd = random.Random(seed)
    rows = []
    for i in range(count):
        image = {
            "id": i % (count // 2 + 1),
            "customer": f"customer-{rnd.randrange(10_000)}",
            "amount": decimal.Decimal(rnd.randrange(10**7)) / 100,
            "qty": rnd.randrange(100),
            "note": "x" * rnd.randrange(40),
        }
        change = (
            insert("shop", "orders", image, commit_ts=1000 + i)
            if i % 3
            else update("shop", "orders", image, dict(image, qty=1), commit_ts=1000 + i)
        )
        rows.append(dataclasses.replace(change, schema=TableSchema(change.table, COLUMNS)))
    return rows


def bench_encode(rows: list[RowChange], batch: int) -> tuple[float, list]:
    codec = OpenProtocolCodec(OpenProtocolConfig())
    start = time.perf_counter()
    messages = [m for i in range(0, len(rows), batch) for m in codec.encode_rows(rows[i : i + batch])]
    return len(rows) / (time.perf_counter() - start), messages


def bench_raw(bootstrap: str, topic: str, messages: list, partitions: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    rows = sum(m.row_count for m in messages)
    start = time.perf_counter()
    for n, message in enumerate(messages):
        while True:
            try:
                producer.produce(topic, message.value, message.key, n % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    return rows / (time.perf_counter() - start)


def bench_sink(sink: KafkaSink, rows: list[RowChange], batch: int) -> float:
    start = time.perf_counter()
    for n, i in enumerate(range(0, len(rows), batch)):
        chunk = tuple(rows[i : i + batch])
        sink.write_batch(MicroBatch("bench", n, chunk[0].commit_ts - 1, chunk[-1].commit_ts, chunk))
    return len(rows) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows per round")
    parser.add_argument("--batch", type=int, default=10_000, help="rows per micro-batch")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    args = parser.parse_args()
    rows = make_rows(args.rows)
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(
        KafkaSinkConfig(
            uri=f"kafka://mock/{topic}",
            topic=topic,
            partition_num=4,
            dispatchers=[DispatchRule(matcher=["*.*"], partition="index-value")],
        )
    )
    sink.open(SinkContext("bench", plugins=PLUGINS))
    cluster = sink.mock_cluster
    assert cluster is not None
    raw_topic = f"{topic}-raw"
    cluster.create_topic(raw_topic, 4, 3)

    # The three figures are measured back to back in each round, so that a
    # change in machine load hits all of them; ratios are taken per round.
    rounds = []
    for _ in range(args.rounds):
        encode_rate, messages = bench_encode(rows, args.batch)
        raw_rate = bench_raw(cluster.bootstrap_servers, raw_topic, messages, 4)
        sink_rate = bench_sink(sink, rows, args.batch)
        rounds.append((encode_rate, raw_rate, sink_rate, len(messages)))
    sink.close()
    encode_rate, raw_rate, sink_rate = (statistics.median(r[i] for r in rounds) for i in range(3))
    report = {
        "rows_per_round": args.rows,
        "batch": args.batch,
        "rounds": args.rounds,
        "messages_per_round": rounds[0][3],
        "encode_rows_per_s": round(encode_rate),
        "raw_produce_rows_per_s": round(raw_rate),
        "sink_rows_per_s": round(sink_rate),
        "sink_over_raw": round(statistics.median(r[2] / r[1] for r in rounds), 3),
        "sink_over_encode": round(statistics.median(r[2] / r[0] for r in rounds), 3),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
