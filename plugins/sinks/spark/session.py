"""The Spark session the sink writes with.

The runtime runs sinks inside its own session (foreachBatch); the sink then
uses it as is. Standalone (tests, benchmarks) the sink starts one with
``builder.getOrCreate()``, with Python workers on this interpreter
(``PYSPARK_PYTHON``), the warehouse directory and UTC as session time zone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["spark_session"]


def spark_session(master: str, warehouse_dir: str, conf: Mapping[str, str] | None = None) -> Any:
    """The active session, or a new one built from these settings."""
    # Workers must run this interpreter (the virtualenv), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from cdcflow.core.data.pipeline.session import spawn_jvm_without_fork

    spawn_jvm_without_fork()  # this process may run gRPC threads (the playground, a source)

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if SparkContext._active_spark_context is not None:
        # The runtime's session, seen from another thread (foreachBatch): take it as it is;
        # passing settings would only make Spark warn that static ones cannot change.
        return SparkSession.builder.getOrCreate()
    builder = (
        SparkSession.builder.appName("cdcflow")
        .master(master or "local[*]")
        .config("spark.sql.warehouse.dir", str(Path(warehouse_dir).resolve()))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
