"""The data pipeline on Spark: the ``cdcflow`` data source, one streaming query per
changefeed, and the data plane's span executor (ARCHITECTURE.md, "Data pipeline on Spark").

This package is a built-in plugin: it registers the ``spark`` executor, the
default of ``cdcflow run`` and ``cdcflow server``, whose factory is
:func:`cdcflow.core.data.pipeline.spark_executor.create_span_executor`. PySpark
is imported only when an executor is created.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from cdcflow.core.data.span_executor import DEFAULT_EXECUTOR, ExecutorContext, ExecutorRegistrar, SpanExecutor
from cdcflow.core.plugin.hookspec import hookimpl

if TYPE_CHECKING:
    from cdcflow.core.config.settings import ServerSettings
    from cdcflow.core.data.pipeline.session import WorkerKeeper
    from cdcflow.core.plugin.manager import PluginManager

__all__ = ["cdcflow_register_executors", "executor_factory", "start_spark", "stop_spark"]

log = logging.getLogger(__name__)

#: The capture's keeper of Spark's Python workers, while its Spark runs (under _keeper_lock).
_keeper: WorkerKeeper | None = None
_keeper_lock = threading.Lock()


def start_spark(server: ServerSettings, plugins: PluginManager) -> None:
    """Start the capture's SparkSession (its JVM and Python workers take seconds) when the
    capture starts, and warm its Python workers (started, the task modules imported),
    so the first micro-batch or initial snapshot read need not wait for either; then
    keep them (``server.spark.keep-workers``, :class:`~cdcflow.core.data.pipeline.session.WorkerKeeper`).
    The ``cdcflow`` data source is registered with the session as it starts (unless a
    snapshot is held then: after it). Last, start the process Spark plans the streams' reads in
    (:func:`~cdcflow.core.data.pipeline.session.warm_planner`) — once no initial
    snapshot is being read or delivered here (:class:`~cdcflow.core.data.pipeline.session.SnapshotHold`):
    a snapshot's tasks have the cores to themselves, and the streams start after it."""
    from cdcflow.core.data.pipeline.session import (
        WorkerKeeper,
        register_source,
        snapshots_held,
        spark_session,
        spark_starting,
        wait_for_snapshots,
        warm_planner,
        warm_python_workers,
        worker_modules,
    )

    global _keeper
    with spark_starting():  # an initial snapshot reads parts on the capture meanwhile
        session = spark_session(server.spark, plugins)
        # The streams' data source, whose first registration runs a Python process of
        # Spark's: now, unless an initial snapshot is to be read first (after it, then).
        registered = not snapshots_held()
        if registered:
            register_source(session)
        modules = worker_modules(plugins)
        try:
            warm_python_workers(session, modules, planner=False)
        except Exception as exc:  # noqa: BLE001 - the session is up; the first tasks start workers instead
            log.warning("Spark's Python workers were not started ahead of the first tasks (%s)", exc)
    with _keeper_lock:
        stale = _keeper if _keeper is not None and _keeper.session is not session else None
        if _keeper is None or stale is not None:  # none yet, or one left from a Spark stopped since
            _keeper = WorkerKeeper(session, modules, server.spark.keep_workers)
            _keeper.start()
    if stale is not None:
        stale.stop()
    if not wait_for_snapshots(until=lambda: not _session_running(session)):
        return  # Spark stopped meanwhile
    try:
        if not registered:
            register_source(session)
        warm_planner(session)
    except Exception as exc:  # noqa: BLE001 - the first micro-batch starts the planner instead
        if _session_running(session):
            log.warning("Spark's read planner was not started ahead of the first micro-batch (%s)", exc)


def _session_running(session: object) -> bool:
    """Whether ``session`` is still the process's SparkSession (not stopped since)."""
    from pyspark.sql import SparkSession

    return SparkSession._instantiatedSession is session


def stop_spark() -> None:
    """Stop the capture's SparkSession once the capture stopped: its JVM and Python workers
    end before the process, with the sink clients the workers keep (Kafka producers),
    instead of outliving the capture's in-process servers (``kafka://mock``)."""
    from cdcflow.core.data.pipeline.session import stop_spark_session

    global _keeper
    with _keeper_lock:
        keeper, _keeper = _keeper, None
    if keeper is not None:
        keeper.stop()

    stop_spark_session()


def executor_factory(context: ExecutorContext) -> SpanExecutor:
    """The Spark pipeline's executor for one changefeed incarnation on this capture
    (see :func:`~cdcflow.core.data.pipeline.spark_executor.create_span_executor`)."""
    from cdcflow.core.data.pipeline.spark_executor import create_span_executor

    return create_span_executor(context)


@hookimpl
def cdcflow_register_executors(registry: ExecutorRegistrar) -> None:
    registry.add(
        DEFAULT_EXECUTOR,
        executor_factory,
        summary="The data pipeline: feeds into the event store, the event store into a Spark query per changefeed.",
        start=start_spark,
        stop=stop_spark,
    )
