"""The ``tikv`` source: TiKV's EventFeed through PD, TiDB row decoding."""

from cdcflow.plugins.sources.tikv.config import TiKVSourceConfig
from cdcflow.plugins.sources.tikv.plugin import TiKVSource, cdcflow_register_sources

__all__ = ["TiKVSource", "TiKVSourceConfig", "cdcflow_register_sources"]
