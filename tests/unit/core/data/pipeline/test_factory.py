"""The factory the control plane gets as the ``spark`` executor (``cdcflow_register_executors``)."""

import asyncio
import json

import pytest

from cdcflow.core.config.loader import validate_text
from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.data.pipeline.spark_executor import (
    OWNER_FILE,
    PipelineSpanExecutor,
    changefeed_dir,
    claim_changefeed_dir,
)
from cdcflow.core.data.span_executor import ExecutorContext, SpanExecutor
from cdcflow.core.errors import CdcflowError
from cdcflow.core.plugin.manager import PluginManager

YAML = """
connectors:
  - name: shop-files
    source: {type: tikv, pd: ["127.0.0.1:2379"]}
    sinks: [{uri: "file:///tmp/cdcflow-factory-test?protocol=json"}]
    memory-quota: 32MiB
    filter:
      rules: ["shop.*"]
      column-selectors: [{matcher: ["shop.orders"], columns: ["id"]}]
"""


def test_factory_builds_a_pipeline_executor_from_the_connector(tmp_path):
    plugins = PluginManager.default(autoload=False)
    deployment, issues = validate_text(YAML, "connectors.yaml", plugins)
    assert not issues
    info = ChangeFeedInfo("shop-files", source={}, sinks=[], start_ts=42)
    context = ExecutorContext(info, deployment.connectors[0], "c1", plugins, str(tmp_path), start_ts=42)
    executor = plugins.executors.factory("spark")(context)
    assert isinstance(executor, SpanExecutor) and isinstance(executor, PipelineSpanExecutor)
    # The tikv source's feeds take a quarter of the quota (pending prewrites), the event store the rest.
    assert executor.store.memory_quota == 24 * 1024**2
    assert executor.source.memory_budget == 8 * 1024**2
    assert executor.store.checkpoint_ts == 42
    assert executor.directory == changefeed_dir(tmp_path, "shop-files")
    assert executor.table_filter.matches("shop", "orders") and not executor.table_filter.matches("x", "y")
    assert bool(executor.column_selection)
    assert executor.spans() == []
    asyncio.run(executor.close())  # nothing started: closes without Spark


def _executor(plugins, deployment, tmp_path, *, start_ts: int, created_at: float) -> PipelineSpanExecutor:
    info = ChangeFeedInfo("shop-files", source={}, sinks=[], start_ts=start_ts, created_at=created_at)
    context = ExecutorContext(info, deployment.connectors[0], "c1", plugins, str(tmp_path), start_ts=start_ts)
    executor = plugins.executors.factory("spark")(context)
    assert isinstance(executor, PipelineSpanExecutor)
    return executor


def test_a_changefeed_created_again_under_the_same_id_does_not_resume_the_previous_ones_files(tmp_path):
    plugins = PluginManager.default(autoload=False)
    deployment, _ = validate_text(YAML, "connectors.yaml", plugins)
    first = _executor(plugins, deployment, tmp_path, start_ts=400, created_at=1000.0)
    first.store.checkpoint(900, 0)  # the first changefeed got as far as ts 900
    query_state = first.directory / "spark-checkpoint" / "offsets" / "7"
    query_state.parent.mkdir(parents=True)
    query_state.write_text("{}")
    asyncio.run(first.close())

    # A restart of the same changefeed resumes its files.
    again = _executor(plugins, deployment, tmp_path, start_ts=400, created_at=1000.0)
    assert again.store.checkpoint_ts == 900 and query_state.exists()
    asyncio.run(again.close())

    # Removed and created again from ts 42: it starts from 42, with a Spark checkpoint of its own.
    second = _executor(plugins, deployment, tmp_path, start_ts=42, created_at=2000.0)
    assert second.store.checkpoint_ts == 42
    assert not query_state.exists()
    assert json.loads((second.directory / OWNER_FILE).read_text())["created_at"] == 2000.0
    asyncio.run(second.close())


def test_files_of_a_version_that_did_not_record_their_changefeed_are_kept(tmp_path):
    plugins = PluginManager.default(autoload=False)
    deployment, _ = validate_text(YAML, "connectors.yaml", plugins)
    first = _executor(plugins, deployment, tmp_path, start_ts=400, created_at=1000.0)
    first.store.checkpoint(900, 0)
    asyncio.run(first.close())
    (first.directory / OWNER_FILE).unlink()
    upgraded = _executor(plugins, deployment, tmp_path, start_ts=400, created_at=1000.0)
    assert upgraded.store.checkpoint_ts == 900
    asyncio.run(upgraded.close())


def test_an_unreadable_owner_record_stops_with_what_to_do(tmp_path):
    directory = tmp_path / "cf"
    directory.mkdir()
    (directory / OWNER_FILE).write_text("{not json")
    with pytest.raises(CdcflowError, match=r"cannot read .*changefeed\.json.*Remove the directory"):
        claim_changefeed_dir(directory, "cf", 1.0)
