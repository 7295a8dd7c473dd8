"""The data pipeline on Spark: the ``cdcflow`` data source, one streaming query per
changefeed, and the data plane's span executor (ARCHITECTURE.md, "Data pipeline on Spark").

The control plane obtains executors through :func:`executor_factory`
(``cdcflow.core.data.pipeline:executor_factory``) or, with explicit settings,
:func:`cdcflow.core.data.pipeline.spark_executor.create_span_executor`. PySpark is
imported only when an executor is created.
"""

from __future__ import annotations

from typing import Any

from cdcflow.core.data.span_executor import SpanExecutor

__all__ = ["executor_factory"]


def executor_factory(context: Any) -> SpanExecutor:
    """The Spark pipeline's executor for one changefeed incarnation on this capture.

    ``context`` is the control plane's executor context: ``connector`` (a
    validated :class:`~cdcflow.core.config.loader.Connector`), ``plugins``,
    ``data_dir``, ``info.start_ts``, and optionally ``server``
    (:class:`~cdcflow.core.config.settings.ServerSettings`, for the Spark
    settings; defaults otherwise). The event store and the Spark checkpoint are
    kept per changefeed id, not per epoch, so a restarted incarnation resumes
    from them.
    """
    from cdcflow.core.config.settings import ServerSettings
    from cdcflow.core.data.pipeline.spark_executor import create_span_executor

    server = getattr(context, "server", None)
    if not isinstance(server, ServerSettings):
        server = ServerSettings(data_dir=str(context.data_dir))
    return create_span_executor(
        context.connector,
        server.model_copy(update={"data_dir": str(context.data_dir)}),
        start_ts=int(context.info.start_ts),
        plugins=context.plugins,
    )
