#!/usr/bin/env python3
"""Avro encoding cost against Open Protocol encoding of the same rows, in one run.

    .venv/bin/python benchmarks/bench_avro.py [--rows 20000] [--rounds 3]

Encodes ``N`` inserts of one table (bigint PK, varchar, decimal, datetime,
int) with the ``avro`` codec (schemas registered once in a schema registry
served over HTTP on 127.0.0.1, as in the tests) and with ``open-protocol``
at ``max-batch-size=1`` (one row per message, like Avro), alternating in each
round so both see the same machine load. Reports rows/s of each (best round)
and the ratio avro/open-protocol, which is what to compare between runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import decimal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdcflow.core.data.events import ColumnInfo, TableSchema
from cdcflow.core.testing import insert
from cdcflow.plugins.codecs.avro import AvroCodec, AvroConfig
from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
from tests.integration.plugins.codecs.schema_registry import SchemaRegistryServer

PK = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY
N = ColumnInfo.NULLABLE
COLUMNS = (
    ColumnInfo("id", 8, PK, "bigint"),
    ColumnInfo("name", 15, N, "varchar(64)"),
    ColumnInfo("price", 246, N, "decimal(10,2)"),
    ColumnInfo("at", 12, N, "datetime"),
    ColumnInfo("qty", 3, N, "int"),
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    first = insert("shop", "orders", {}, commit_ts=2)
    schema = TableSchema(first.table, COLUMNS)
    rows = [
        dataclasses.replace(
            insert(
                "shop",
                "orders",
                {"id": i, "name": f"n{i}", "price": decimal.Decimal("9.99"), "at": dt.datetime(2024, 1, 1), "qty": i},
                commit_ts=1000 + i,
            ),
            schema=schema,
        )
        for i in range(args.rows)
    ]
    registry = SchemaRegistryServer()
    try:
        codecs = {
            "avro": AvroCodec(AvroConfig(schema_registry=registry.url)),
            "open-protocol": OpenProtocolCodec(OpenProtocolConfig(max_batch_size=1)),
        }
        rates: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, codec in codecs.items():
                start = time.perf_counter()
                codec.encode_rows(rows)
                rates[name] = max(rates.get(name, 0.0), len(rows) / (time.perf_counter() - start))
    finally:
        registry.close()
    for name, rate in rates.items():
        print(f"{name:>14}: {rate:>10,.0f} rows/s")
    print(f"avro/open-protocol: {rates['avro'] / rates['open-protocol']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
