"""The ``cockroachdb`` source: CockroachDB rangefeeds through sinkless changefeeds over pgwire."""

from cdcflow.plugins.sources.cockroachdb.config import CockroachDBSourceConfig
from cdcflow.plugins.sources.cockroachdb.plugin import CockroachDBSource, cdcflow_register_sources

__all__ = ["CockroachDBSource", "CockroachDBSourceConfig", "cdcflow_register_sources"]
