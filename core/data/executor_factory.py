"""How a capture gets the :class:`~cdcflow.core.data.span_executor.SpanExecutor` that runs a
changefeed's spans placed on it: an :data:`ExecutorFactory`, one executor per
changefeed incarnation (epoch) per capture.

The product's data plane plugs in here. ``load_executor_factory`` returns an
explicit ``module:attribute`` when one is given (``--executor`` or
``CDCFLOW_EXECUTOR``; tests of the control plane pick the test kit's
in-process executor this way), and otherwise the Spark pipeline
(``create_span_executor`` in ``cdcflow.core.data.pipeline.spark_executor``, adapted by
:func:`spark_executor_factory`). There is no silent fallback: a capture either
runs the pipeline or the executor it was explicitly told to use.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from cdcflow.core.config.loader import Connector
from cdcflow.core.config.settings import DEFAULT_DATA_DIR, ServerSettings
from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.data.span_executor import SpanExecutor
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue
from cdcflow.core.plugin.manager import PluginManager

__all__ = [
    "EXECUTOR_ENV",
    "SPARK_EXECUTOR_FACTORY",
    "ExecutorContext",
    "ExecutorFactory",
    "load_executor_factory",
]

log = logging.getLogger(__name__)

EXECUTOR_ENV = "CDCFLOW_EXECUTOR"
#: The Spark pipeline's factory, when the build has the pipeline.
PIPELINE_MODULE = "cdcflow.core.data.pipeline.spark_executor"
SPARK_EXECUTOR_FACTORY = "cdcflow.core.data.executor_factory:spark_executor_factory"


@dataclass(frozen=True, slots=True)
class ExecutorContext:
    """What an executor needs to know about its changefeed and capture."""

    info: ChangeFeedInfo
    connector: Connector
    capture_id: str
    plugins: PluginManager
    data_dir: str = DEFAULT_DATA_DIR
    #: The checkpoint the executor's first span starts from.
    start_ts: int = 0
    #: The capture's server settings (data directory, Spark).
    server: ServerSettings | None = None

    @property
    def changefeed_id(self) -> str:
        return self.info.id

    @property
    def epoch(self) -> int:
        return self.info.epoch


ExecutorFactory = Callable[[ExecutorContext], SpanExecutor]


def spark_executor_factory(context: ExecutorContext) -> SpanExecutor:
    """The Spark pipeline's executor for ``context`` (ImportError when the build lacks it)."""
    pipeline = importlib.import_module(PIPELINE_MODULE)
    server = context.server or ServerSettings(data_dir=context.data_dir)
    created: SpanExecutor = pipeline.create_span_executor(
        context.connector, server, start_ts=context.start_ts, plugins=context.plugins
    )
    return created


def _resolve(spec: str) -> ExecutorFactory:
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    return cast(ExecutorFactory, getattr(module, attr or "executor_factory"))


def load_executor_factory(spec: str | None = None) -> ExecutorFactory:
    """The executor factory to use (see the module docstring)."""
    spec = spec or os.environ.get(EXECUTOR_ENV)
    if spec:
        try:
            return _resolve(spec)
        except (ImportError, AttributeError) as exc:
            message = f"executor factory {spec!r} cannot be loaded: {exc}"
            raise ConfigInvalidError(message, [ConfigIssue(message, path="executor")]) from exc
    return spark_executor_factory
