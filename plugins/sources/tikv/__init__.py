"""The ``tikv`` source: TiKV's EventFeed through PD, TiDB row decoding."""

from cdcflow.plugins.sources.tikv.config import TiKVSourceConfig
from cdcflow.plugins.sources.tikv.hookspec import EmbeddedUpstream
from cdcflow.plugins.sources.tikv.plugin import TiKVSource, cdcflow_add_hookspecs, cdcflow_register_sources

__all__ = ["EmbeddedUpstream", "TiKVSource", "TiKVSourceConfig", "cdcflow_add_hookspecs", "cdcflow_register_sources"]
