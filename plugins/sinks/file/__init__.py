"""The ``file`` sink: per table, per batch files written atomically."""

from cdcflow.plugins.sinks.file.sink import FileSink, FileSinkConfig, cdcflow_register_sinks

__all__ = ["FileSink", "FileSinkConfig", "cdcflow_register_sinks"]
