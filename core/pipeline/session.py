"""The capture's SparkSession: one per process, shared by its changefeeds' queries.

Configuration, in increasing precedence: cdcflow's defaults for local mode,
the ``cdcflow_spark_conf`` hook of every plugin, then ``server.spark.conf``.
The Python workers run the driver's interpreter (``PYSPARK_PYTHON`` and
``PYSPARK_DRIVER_PYTHON`` are set to ``sys.executable``) so that they import
the same cdcflow and plugins; on a cluster, every node needs the same Python
environment at the same path (or set ``spark.pyspark.python`` in
``server.spark.conf``).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from cdcflow.core.config.model import SparkSettings

if TYPE_CHECKING:
    from cdcflow.core.plugin.manager import PluginManager

__all__ = ["LOCAL_DEFAULTS", "spark_conf", "spark_session", "stop_spark_session"]

#: Defaults for local mode: small shuffles, no UI, no event log.
LOCAL_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.python.worker.reuse": "true",
    "spark.driver.extraJavaOptions": "-Dlog4j2.level=warn",
}

_lock = threading.Lock()


def spark_conf(settings: SparkSettings, plugins: PluginManager | None = None) -> dict[str, str]:
    """The Spark properties the capture's session is built with."""
    conf = dict(LOCAL_DEFAULTS) if settings.master.startswith("local") else {}
    conf["spark.sql.warehouse.dir"] = os.path.abspath(settings.warehouse_dir)
    if plugins is not None:
        conf.update(plugins.spark_conf(settings.master))
    conf.update(settings.conf)
    return conf


def spark_session(settings: SparkSettings, plugins: PluginManager | None = None) -> Any:
    """The process's SparkSession, built on first use (takes seconds: call off the event loop)."""
    from pyspark.sql import SparkSession

    from cdcflow.core.pipeline.datasource import CdcflowDataSource

    with _lock:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        if settings.master.startswith("local"):
            # Everything is on this machine: keep Spark on loopback.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
        for key, value in spark_conf(settings, plugins).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("WARN")
        session.dataSource.register(CdcflowDataSource)
        return session


def stop_spark_session() -> None:
    """Stop the process's SparkSession, if any (its JVM and workers end)."""
    from pyspark.sql import SparkSession

    with _lock:
        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()
