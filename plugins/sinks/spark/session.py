"""The Spark session the sink writes with when the runtime gives it none.

On the Spark pipeline the sink writes with the capture's session, which the
runtime hands it in ``SinkContext.spark``. Outside Spark (the in-process
executor, the test kit, benchmarks) it starts one from its own settings:
``master``, ``warehouse-dir`` and ``spark-conf``, with Python workers on this
interpreter (``PYSPARK_PYTHON``) and UTC as session time zone. Spark keeps
one session per process, so a session started earlier is reused, with the
sink's runtime settings applied to it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["spark_session"]


def spark_session(master: str, warehouse_dir: str, conf: Mapping[str, str] | None = None) -> Any:
    """A session built from these settings (see the module docs)."""
    # Workers must run this interpreter (the virtualenv), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from cdcflow.core.data.pipeline.session import spawn_jvm_without_fork

    spawn_jvm_without_fork()  # this process may run gRPC threads (the playground, a source)

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
