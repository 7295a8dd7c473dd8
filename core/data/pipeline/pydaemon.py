"""Spark's Python daemon for a local-mode capture (``spark.python.daemon.module``).

Spark starts its Python workers through a daemon, ``python -m pyspark.daemon``,
whose ``sys.path`` starts with Spark's own ``pyspark.zip`` and py4j zip. Python
keeps no compiled bytecode for modules imported from a zip: the daemon and every
worker it forks compiled PySpark's modules from source again (about 0.7 s of CPU
per process, on the cores the first batch waits for).

When those zips are the ones inside the installed ``pyspark`` package (a pip
install, as in local mode), they hold the same sources as the package: this
daemon moves them behind the installed package on ``sys.path``, so the daemon
and its workers import PySpark from the package and its compiled bytecode, then
runs PySpark's daemon unchanged. Zips of another Spark home are left first.

Nothing else is imported before the daemon forks its workers: as PySpark's own
daemon, it leaves the worker module (and pyarrow, pandas, cdcflow, which start
threads) to each forked worker.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

__all__ = ["installed_pyspark_first"]


def installed_pyspark_first(path: list[str]) -> list[str]:
    """``path`` with the zips that lie inside the installed ``pyspark`` package (found
    on the entries that are not zips) moved to its end."""
    plain = [entry for entry in path if not entry.endswith(".zip")]
    spec = PathFinder.find_spec("pyspark", plain)
    if spec is None or not spec.origin:
        return list(path)
    package = os.path.realpath(os.path.dirname(spec.origin)) + os.sep
    inside = [entry for entry in path if entry.endswith(".zip") and os.path.realpath(entry).startswith(package)]
    return [entry for entry in path if entry not in inside] + inside


if __name__ == "__main__":
    sys.path[:] = installed_pyspark_first(sys.path)
    from pyspark.daemon import manager

    manager()
