"""The factory the control plane gets as the ``spark`` executor (``cdcflow_register_executors``)."""

import asyncio

from cdcflow.core.config.loader import validate_text
from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.data.pipeline.spark_executor import PipelineSpanExecutor, changefeed_dir
from cdcflow.core.data.span_executor import ExecutorContext, SpanExecutor
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
