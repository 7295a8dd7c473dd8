"""The Spark pipeline (foreachBatch in the capture's session) into the MySQL and Spark sinks.

One table (one span) only: with two spans added one after the other, the
pipeline as merged here delivered only the first span's rows (reported to its
authors); orders is the table with keys, key moves and an ALTER.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.testing import ListSource, until
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from cdcflow.plugins.sinks.spark import SparkSink, SparkSinkConfig
from tests.fixtures.mariadb import MariaDB
from tests.fixtures.workload import make_workload
from tests.integration.plugins.sinks.test_mysql_sink import fetch
from tests.integration.plugins.sinks.test_spark_sink import changelog, snapshot_rows

pytestmark = pytest.mark.integration


def test_pipeline_into_mysql_and_spark_sinks(spark: Any, mariadb: MariaDB, mysql_database: str, tmp_path: Path) -> None:
    w = make_workload(mysql_database, txns=80, resolve_every=20)
    mysql = MySQLSink(MySQLSinkConfig(uri=mariadb.uri, worker_count=4))
    lake = tmp_path / "lake"
    tables = SparkSink(SparkSinkConfig(uri=f"spark://{lake}", key_columns={f"{mysql_database}.orders": ["id"]}))
    source = ListSource.of(w.events, chunk=20)

    async def run() -> None:
        executor = PipelineSpanExecutor(PipelineContext(
            mysql_database, source, [mysql, tables], data_dir=tmp_path / "data", start_ts=0, spark=spark,
            trigger_interval=0.2,
        ))  # fmt: skip
        orders = w.table("orders")
        assert await executor.add_span((await source.spans_for(orders))[0], 0, prepare=False)
        await until(lambda: executor.checkpoint_ts >= w.last_ts or executor.error() is not None, timeout=240)
        assert executor.error() is None
        await executor.close()

    asyncio.run(run())
    db = mysql_database
    assert fetch(mariadb, f"SELECT id, name, qty, note FROM `{db}`.orders") == w.expected_orders()
    assert snapshot_rows(spark, lake, w.table("orders"), ["id", "name", "qty", "note"]) == w.expected_orders()
    expected = sorted((r.op.value, r.commit_ts) for r in w.row_changes() if r.table == w.table("orders"))
    assert sorted((r["op"], r["commit_ts"]) for r in changelog(spark, lake, w.table("orders"))) == expected
