"""The factory the control plane loads as ``cdcflow.core.data.pipeline:executor_factory``."""

import asyncio
from dataclasses import dataclass, field

from cdcflow.core.config.loader import validate_text
from cdcflow.core.data.pipeline import executor_factory
from cdcflow.core.data.pipeline.spark_executor import PipelineSpanExecutor, changefeed_dir
from cdcflow.core.data.span_executor import SpanExecutor
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


@dataclass
class Info:
    id: str = "shop-files"
    start_ts: int = 42


@dataclass
class Context:
    connector: object
    plugins: PluginManager
    data_dir: str
    info: Info = field(default_factory=Info)


def test_factory_builds_a_pipeline_executor_from_the_connector(tmp_path):
    plugins = PluginManager.default(autoload=False)
    deployment, issues = validate_text(YAML, "connectors.yaml", plugins)
    assert not issues
    context = Context(deployment.connectors[0], plugins, str(tmp_path))
    executor = executor_factory(context)
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
