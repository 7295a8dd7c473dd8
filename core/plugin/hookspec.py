"""The hook specifications: the whole contract between cdcflow and its plugins.

A plugin is a module (or object) with functions named like the hooks below and
marked with :data:`hookimpl`. Every hook is documented in
``docs/reference/hooks.md``; a test fails when one is missing there.

Hooks orchestrate; classes carry data. Per-row work never goes through hook
fan-out: a registration hook adds *classes*, and the runtime calls methods on
instances of those classes.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from cdcflow.core.control.scheduling import Scheduler
    from cdcflow.core.data.codec import Codec
    from cdcflow.core.data.sink import Sink
    from cdcflow.core.data.source import Source
    from cdcflow.core.data.span_executor import ExecutorRegistrar
    from cdcflow.core.data.transform import Transform
    from cdcflow.core.plugin.manager import PluginManager
    from cdcflow.core.plugin.registry import Registrar

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME = "cdcflow"

#: Marks a hook specification: the hooks below, and those a plugin adds for
#: other plugins through :func:`cdcflow_add_hookspecs`.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Marks a hook implementation in a plugin: ``@hookimpl def cdcflow_register_sinks(registry): ...``
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# -- registration -------------------------------------------------------------
# Historic: the plugin manager calls each once, before loading any plugin, and
# pluggy replays the call for every plugin registered afterwards — built-ins,
# entry points, or a plugin registered at runtime — so a plugin that comes
# later still registers, and CDCFLOW_TRACE_PLUGINS=1 traces each call. Each
# receives a registrar that records the calling plugin as the entry's origin;
# ``registry.add(cls)`` registers a class under its ``type_name``. Two classes
# claiming one name is an error naming both origins. Not firstresult: every
# plugin registers its own. Return values are ignored.


@hookspec(historic=True)
def cdcflow_add_hookspecs(pluginmanager: PluginManager) -> None:
    """Add hook specifications for other plugins to implement (pytest's ``pytest_addhooks``).

    Call ``pluginmanager.add_hookspecs(module_or_class)`` with functions marked
    ``@hookspec`` (``cdcflow.core.plugin.hookspec.hookspec``), named with the
    ``cdcflow_`` prefix and the plugin's name (``cdcflow_tikv_…``). Historic:
    called once per plugin, when it is registered. An implementation of a hook
    nobody specifies is rejected once every plugin is loaded.
    """


@hookspec(historic=True)
def cdcflow_register_sources(registry: Registrar[Source[Any]]) -> None:
    """Register source plugin classes (subclasses of ``cdcflow.core.data.source.Source``).

    Historic: called once per plugin, when it is registered. Return value ignored.
    """


@hookspec(historic=True)
def cdcflow_register_sinks(registry: Registrar[Sink[Any]]) -> None:
    """Register sink plugin classes (subclasses of ``cdcflow.core.data.sink.Sink``).

    Historic: called once per plugin, when it is registered. Return value ignored.
    """


@hookspec(historic=True)
def cdcflow_register_schedulers(registry: Registrar[Scheduler[Any]]) -> None:
    """Register scheduler plugin classes (subclasses of ``cdcflow.core.control.scheduling.Scheduler``).

    Historic: called once per plugin, when it is registered. Return value ignored.
    """


@hookspec(historic=True)
def cdcflow_register_codecs(registry: Registrar[Codec[Any]]) -> None:
    """Register codec (message format) classes (subclasses of ``cdcflow.core.data.codec.Codec``).

    Historic: called once per plugin, when it is registered. Return value ignored.
    """


@hookspec(historic=True)
def cdcflow_register_transforms(registry: Registrar[Transform[Any]]) -> None:
    """Register transform classes (subclasses of ``cdcflow.core.data.transform.Transform``).

    A connector's ``transforms:`` list picks them by ``type``; their instances
    are pickled into the Spark tasks that mount a batch's rows. Historic:
    called once per plugin, when it is registered. Return value ignored.
    """


@hookspec(historic=True)
def cdcflow_register_executors(registry: ExecutorRegistrar) -> None:
    """Register span executor factories by name: ``registry.add("spark", factory, summary=...)``.

    A factory takes a ``cdcflow.core.data.span_executor.ExecutorContext`` and
    returns a ``SpanExecutor``: what runs a changefeed's spans on a capture.
    ``cdcflow run`` and ``cdcflow server`` pick one with ``--executor NAME``
    (default ``spark``, the data pipeline; ``in-process`` is the test kit's).
    Names are lower-case words joined by dashes; two factories under one name
    is an error naming both origins. Historic: called once per plugin, when it
    is registered. Return value ignored.
    """


# -- command line -------------------------------------------------------------


@hookspec
def cdcflow_add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add sub-commands to the ``cdcflow`` command.

    Called once each time the command-line parser is built, after every
    plugin is loaded. Add a command with ``subparsers.add_parser(name,
    help=..., description=...)`` and ``parser.set_defaults(func=run)``, where
    ``run(args) -> int`` returns the exit code; ``args.plugins`` is the plugin
    manager the command runs with. Every command and option needs help text,
    and a ``## cdcflow NAME`` section in docs/reference/cli.md. The built-in
    commands are added first (``tryfirst``), then plugins' in reverse
    registration order. Return value ignored.
    """


# -- runtime configuration ----------------------------------------------------


@hookspec
def cdcflow_spark_conf(master: str) -> dict[str, str] | None:
    """Extra Spark configuration for the capture's SparkSession.

    Called once per capture, before the session is built, with the configured
    ``spark.master``. Return a mapping of Spark properties (or None). Results
    of all plugins are merged in registration order; the ``server.spark.conf``
    section of connectors.yaml is applied last and wins.
    """


# -- lifecycle ----------------------------------------------------------------
# Notifications from the runtime. Implementations must return quickly and must
# not raise: an exception is logged and otherwise ignored, so a faulty
# observer never stalls replication. Not called on abrupt shutdown (SIGKILL).


@hookspec
def cdcflow_changefeed_state_changed(
    changefeed_id: str, old_state: str, new_state: str, error: dict[str, Any] | None
) -> None:
    """A changefeed moved from ``old_state`` to ``new_state``.

    Called on the owner capture after the new state is persisted. States are
    ``normal``, ``paused``, ``warning``, ``failed``, ``finished``, ``removed``;
    ``error`` is the error's dict form (code, message, detail, severity,
    retryable) when the transition was caused by one.
    """


@hookspec
def cdcflow_snapshot_progress(
    changefeed_id: str,
    ts: int,
    unit: str,
    parts_done: int,
    parts_total: int,
    rows_done: int,
    rows_estimate: int,
    phase: str,
) -> None:
    """Where a changefeed's initial snapshot (``initial-snapshot: true``) is on this capture.

    Called about once a second while its parts are read, once after the read
    and once when the snapshot is delivered. ``unit`` names a part
    (``region``, ``range``); ``rows_estimate`` extrapolates the rows of the
    whole snapshot from the parts read; ``phase`` is ``read``, ``deliver``
    (every part read, going to the sinks) or ``done``.
    """


@hookspec
def cdcflow_batch_flushed(changefeed_id: str, batch_id: int, checkpoint_ts: int, row_count: int) -> None:
    """Every sink of a changefeed flushed micro-batch ``batch_id``.

    Called on the capture that runs the changefeed's pipeline, after the sinks
    returned and before the checkpoint is reported to the coordinator.
    ``checkpoint_ts`` is the batch's end ts, the changefeed's next checkpoint.
    """
