"""Spans that join a running pipeline behind its published ts (a table moved from
another capture, or added late by the two-phase scheduler), written to a real MariaDB:
their rows, older than batches the sink already flushed, still reach the tables."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor, changefeed_dir
from cdcflow.core.data.pipeline.writer import writer_identity
from cdcflow.core.testing import ListSource, insert, until
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from tests.fixtures.mariadb import MariaDB
from tests.integration.plugins.sinks.test_mysql_sink import fetch

pytestmark = pytest.mark.integration

TABLES = ("customers", "products", "orders")
SPARK_WAIT = 120.0


def test_rows_of_a_span_joining_behind_the_flushed_ts_are_written(
    mariadb: MariaDB, mysql_database: str, spark: Any, tmp_path: Any
) -> None:
    db = mysql_database
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:
            for table in TABLES:
                cur.execute(f"CREATE TABLE `{db}`.`{table}` (id INT PRIMARY KEY)")
        conn.commit()
    finally:
        conn.close()
    rows = [insert(db, t, {"id": i}, commit_ts=100 + i * 10) for i in range(20) for t in TABLES]
    source = ListSource.of([*sorted(rows, key=lambda r: r.commit_ts), ListSource.resolved(900)])
    sink = MySQLSink(MySQLSinkConfig(uri=mariadb.uri))

    async def run() -> None:
        executor = PipelineSpanExecutor(
            PipelineContext(db, source, [sink], data_dir=tmp_path, start_ts=50, spark=spark, trigger_interval=0.2)
        )
        spans = {t.table: (await source.spans_for(t))[0] for t in await source.list_tables()}
        for table in TABLES:
            # The spans before this one are flushed to 900: this one joins behind them.
            assert await executor.add_span(spans[table], 50, prepare=False)
            await until(lambda table=table: executor.status(spans[table]).checkpoint_ts == 900, timeout=SPARK_WAIT)
        assert executor.error() is None
        await executor.close()

    asyncio.run(run())
    for table in TABLES:
        assert fetch(mariadb, f"SELECT id FROM `{db}`.`{table}`") == [(i,) for i in range(20)], table
    # The sink wrote as the pipeline's writer, whose identity its checkpoint directory keeps.
    writer = writer_identity(changefeed_dir(tmp_path, db) / "spark-checkpoint")
    assert not writer.inherits
    checkpoint = f"SELECT writer_id, flushed_ts FROM cdcflow.checkpoint WHERE changefeed_id = '{db}'"
    assert fetch(mariadb, checkpoint) == [(writer.id, 900)]
