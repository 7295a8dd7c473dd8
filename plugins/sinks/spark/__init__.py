"""The ``spark`` sink: per-table change logs and current-state snapshots in Parquet."""

from cdcflow.plugins.sinks.spark.config import SparkSinkConfig
from cdcflow.plugins.sinks.spark.sink import SparkSink, cdcflow_register_sinks
from cdcflow.plugins.sinks.spark.snapshot import read_snapshot
from cdcflow.plugins.sinks.spark.storage import Storage

__all__ = ["SparkSink", "SparkSinkConfig", "Storage", "cdcflow_register_sinks", "read_snapshot"]
