"""The ``mysql`` sink (also ``tidb``): row changes and DDL applied to a MySQL-compatible server."""

from cdcflow.plugins.sinks.mysql.config import MySQLSinkConfig
from cdcflow.plugins.sinks.mysql.errors import ConstraintViolationError, DownstreamRejectedError
from cdcflow.plugins.sinks.mysql.sink import MySQLSink, cdcflow_register_sinks

__all__ = [
    "ConstraintViolationError",
    "DownstreamRejectedError",
    "MySQLSink",
    "MySQLSinkConfig",
    "cdcflow_register_sinks",
]
