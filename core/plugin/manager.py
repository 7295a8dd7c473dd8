"""The plugin manager: loads built-in and third-party plugins through pluggy
and offers a typed facade over the hook caller (STYLE §3–4).

Built-in plugins are loaded through the very same path as third-party ones:
each is an entry point of the group ``cdcflow`` (the built-ins' are listed in
:data:`BUILTIN_PLUGINS` rather than installed metadata), loaded with
``EntryPoint.load()`` and registered with pluggy. ``CDCFLOW_DISABLE_PLUGIN_AUTOLOAD=1``
turns discovery of installed entry points off; ``CDCFLOW_TRACE_PLUGINS=1``
traces every hook call on standard error, registration included.

Registration hooks are historic (see ``cdcflow.core.plugin.hookspec``): the
manager calls them once, before any plugin is registered, and pluggy replays
the call for each plugin as it is registered. Once the built-ins and entry
points are loaded, :meth:`PluginManager.check_pending` rejects an
implementation of a hook that no specification declares — a misspelled hook
would otherwise never be called.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from cdcflow.core.control.scheduling import Scheduler

# cdcflow.core.plugin loads this module lazily, so the plugin kinds (which
# import cdcflow.core.plugin.base) can be imported here at module level.
from cdcflow.core.data.codec import Codec
from cdcflow.core.data.sink import Sink
from cdcflow.core.data.source import Source
from cdcflow.core.data.span_executor import ExecutorRegistrar, ExecutorRegistry
from cdcflow.core.data.transform import Transform
from cdcflow.core.errors import ConfigInvalidError, PluginValidationError
from cdcflow.core.plugin import hookspec
from cdcflow.core.plugin.hookspec import PROJECT_NAME
from cdcflow.core.plugin.registry import PluginOrigin, PluginRegistry, Registrar

__all__ = [
    "AUTOLOAD_ENV",
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "TRACE_ENV",
    "PluginManager",
    "get_plugin_manager",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "cdcflow"
AUTOLOAD_ENV = "CDCFLOW_DISABLE_PLUGIN_AUTOLOAD"
TRACE_ENV = "CDCFLOW_TRACE_PLUGINS"

#: Modules of the built-in plugins, loaded in this order before entry points.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "cdcflow.core.cli.commands",
    "cdcflow.core.data.pipeline",
    "cdcflow.core.testing.inprocess",
    "cdcflow.plugins.sources.tikv",
    "cdcflow.plugins.sources.cockroachdb",
    "cdcflow.plugins.sources.playground.plugin",
    "cdcflow.plugins.codecs.json",
    "cdcflow.plugins.codecs.open_protocol",
    "cdcflow.plugins.codecs.canal_json",
    "cdcflow.plugins.codecs.avro",
    "cdcflow.plugins.sinks.file",
    "cdcflow.plugins.sinks.kafka",
    "cdcflow.plugins.sinks.mysql",
    "cdcflow.plugins.sinks.spark",
    "cdcflow.plugins.schedulers.round_robin",
    "cdcflow.plugins.schedulers.two_phase",
    "cdcflow.plugins.transforms.filter",
    "cdcflow.plugins.transforms.project",
    "cdcflow.plugins.transforms.mask",
    "cdcflow.plugins.transforms.route",
    "cdcflow.plugins.transforms.python",
)

#: Where the hooks are documented, for error messages.
_HOOK_DOCS = "docs/reference/hooks.md"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


class PluginManager:
    """Loads plugins and keeps one registry per plugin kind.

    Typical use::

        pm = PluginManager.default()
        sink_cls = pm.sinks["kafka"]

    ``load_builtins`` / ``load_entry_points`` / ``register`` may be called in
    any order; each plugin's registration hooks run as it is registered.
    """

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspec)
        self._origins: dict[int, PluginOrigin] = {}
        #: The plugins being registered, innermost last (a plugin may register another).
        self._registering: list[PluginOrigin] = []
        self.sources: PluginRegistry[Source[Any]] = PluginRegistry("sources", Source)
        self.sinks: PluginRegistry[Sink[Any]] = PluginRegistry("sinks", Sink)
        self.schedulers: PluginRegistry[Scheduler[Any]] = PluginRegistry("schedulers", Scheduler)
        self.codecs: PluginRegistry[Codec[Any]] = PluginRegistry("codecs", Codec)
        self.transforms: PluginRegistry[Transform[Any]] = PluginRegistry("transforms", Transform)
        self.executors = ExecutorRegistry()
        if _truthy(os.environ.get(TRACE_ENV)):
            self._pm.trace.root.setwriter(sys.stderr.write)
            self._pm.enable_tracing()
        self._call_registration_hooks()

    @classmethod
    def default(cls, *, autoload: bool | None = None) -> PluginManager:
        """A manager with the built-ins and (unless disabled) entry-point plugins,
        checked for misspelled hooks (:meth:`check_pending`)."""
        pm = cls()
        pm.load_builtins()
        if autoload is None:
            autoload = not _truthy(os.environ.get(AUTOLOAD_ENV))
        if autoload:
            pm.load_entry_points()
        pm.check_pending()
        return pm

    # -- loading ----------------------------------------------------------------

    def _call_registration_hooks(self) -> None:
        """Call every registration hook once; pluggy replays the calls for each
        plugin registered later (historic hooks), while :meth:`_register` says
        which plugin that is."""
        hook = self._pm.hook
        hook.cdcflow_add_hookspecs.call_historic(kwargs={"pluginmanager": self})
        registries: list[tuple[str, PluginRegistry[Any]]] = [
            ("cdcflow_register_sources", self.sources),
            ("cdcflow_register_sinks", self.sinks),
            ("cdcflow_register_schedulers", self.schedulers),
            ("cdcflow_register_codecs", self.codecs),
            ("cdcflow_register_transforms", self.transforms),
        ]
        for name, registry in registries:
            registrar: Registrar[Any] = Registrar(registry, self._registering_origin)
            getattr(hook, name).call_historic(kwargs={"registry": registrar})
        executors = ExecutorRegistrar(self.executors, self._registering_origin)
        hook.cdcflow_register_executors.call_historic(kwargs={"registry": executors})

    def _registering_origin(self) -> PluginOrigin:
        if self._registering:
            return self._registering[-1]
        # Only reachable by calling a registration hook outside of registration.
        return PluginOrigin("runtime", "unknown plugin", "?")

    def load_builtins(self, modules: Iterable[str] = BUILTIN_PLUGINS) -> None:
        """Register the built-in plugin modules."""
        for name in modules:
            self._load(metadata.EntryPoint(name=name, value=name, group=ENTRY_POINT_GROUP), builtin=True)

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Register every plugin declared under the entry-point ``group``.

        A plugin that fails to import is reported with its distribution and
        the error, as a ConfigInvalidError, rather than ignored.
        """
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            self._load(ep, builtin=False)

    def _load(self, ep: metadata.EntryPoint, *, builtin: bool) -> None:
        dist = ep.dist
        dist_name = f"{dist.name} {dist.version}" if dist is not None else None
        try:
            plugin = ep.load()
        except Exception as exc:
            where = "built-in plugin" if builtin else "plugin entry point"
            raise ConfigInvalidError(
                f"{where} '{ep.name}' ({ep.value}) from "
                f"{'cdcflow' if builtin else dist_name or 'an unknown distribution'} failed to load: {exc!r}",
                detail={"entry_point": ep.name, "value": ep.value},
            ) from exc
        if builtin:
            origin = PluginOrigin("builtin", ep.name, ep.value)
        else:
            module = getattr(plugin, "__name__", ep.value)
            origin = PluginOrigin("entry-point", ep.name, module, dist_name)
        self._register(plugin, origin)

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register a plugin object (module or instance with hook functions) at runtime.

        Its registration hooks run now (they are historic). It is not checked
        for misspelled hooks until :meth:`check_pending` runs again.
        """
        module = getattr(plugin, "__module__", None) or getattr(plugin, "__name__", "?")
        label = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        self._register(plugin, PluginOrigin("runtime", label, str(module)))

    def _register(self, plugin: object, origin: PluginOrigin) -> None:
        if self._pm.is_registered(plugin):
            return
        self._origins[id(plugin)] = origin
        self._registering.append(origin)
        try:
            self._pm.register(plugin, name=f"{origin.kind}:{origin.name}")
        except pluggy.PluginValidationError as exc:
            self._forget(plugin)
            reason = " ".join(str(exc).split())  # pluggy's message spans lines
            raise PluginValidationError(
                f"plugin {origin}: {reason}; see {_HOOK_DOCS} for each hook's arguments",
                detail={"plugin": origin.name, "module": origin.module},
            ) from exc
        except BaseException:
            self._forget(plugin)  # a registration hook raised: the plugin is not half-loaded
            raise
        finally:
            self._registering.pop()

    def _forget(self, plugin: object) -> None:
        self._origins.pop(id(plugin), None)
        if self._pm.is_registered(plugin):
            self._pm.unregister(plugin)

    def add_hookspecs(self, module_or_class: ModuleType | type) -> None:
        """Add hook specifications (from a ``cdcflow_add_hookspecs`` implementation)."""
        self._pm.add_hookspecs(module_or_class)

    def check_pending(self) -> None:
        """Reject a plugin that implements a hook nobody specifies (pluggy's
        ``check_pending``): a misspelled hook name, or a hook of a plugin that
        is not installed. Raises :class:`PluginValidationError` naming the
        plugin, the hook and the closest hook that exists."""
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise self._unknown_hook_error(exc.plugin) from exc

    def _unknown_hook_error(self, plugin: object) -> PluginValidationError:
        known = [name for name, caller in vars(self._pm.hook).items() if caller.has_spec()]
        unknown = sorted(
            name
            for name, caller in vars(self._pm.hook).items()
            if not caller.has_spec() and any(impl.plugin is plugin for impl in caller.get_hookimpls())
        )
        origin = self._origins.get(id(plugin)) or PluginOrigin("runtime", repr(plugin), "?")
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1)
            hints.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        return PluginValidationError(
            f"plugin {origin} implements {', '.join(hints)}, which no hook specification declares, "
            f"so it would never be called; rename it to a hook listed in {_HOOK_DOCS}, or mark it "
            "@hookimpl(optionalhook=True) if it implements a hook of a plugin that may not be installed",
            detail={"plugin": origin.name, "module": origin.module, "hooks": unknown},
        )

    # -- facade over the hooks ----------------------------------------------------

    def add_commands(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Let every plugin add its ``cdcflow`` sub-commands (see the hook's docs)."""
        self._pm.hook.cdcflow_add_commands(subparsers=subparsers)

    def spark_conf(self, master: str) -> dict[str, str]:
        """Merged Spark properties contributed by plugins (see the hook's docs)."""
        merged: dict[str, str] = {}
        for result in reversed(self._pm.hook.cdcflow_spark_conf(master=master)):
            if result:
                merged.update({str(k): str(v) for k, v in result.items()})
        return merged

    def changefeed_state_changed(
        self, changefeed_id: str, old_state: str, new_state: str, error: dict[str, Any] | None = None
    ) -> None:
        """Notify observers of a persisted state change; never raises."""
        self._notify(
            self._pm.hook.cdcflow_changefeed_state_changed,
            changefeed_id=changefeed_id,
            old_state=old_state,
            new_state=new_state,
            error=error,
        )

    def batch_flushed(self, changefeed_id: str, batch_id: int, checkpoint_ts: int, row_count: int) -> None:
        """Notify observers that every sink flushed a micro-batch; never raises."""
        self._notify(
            self._pm.hook.cdcflow_batch_flushed,
            changefeed_id=changefeed_id,
            batch_id=batch_id,
            checkpoint_ts=checkpoint_ts,
            row_count=row_count,
        )

    def snapshot_progress(self, progress: Any) -> None:
        """Notify observers of an initial snapshot's progress (a
        :class:`~cdcflow.core.data.pipeline.snapshot.SnapshotProgress`); never raises."""
        self._notify(
            self._pm.hook.cdcflow_snapshot_progress,
            changefeed_id=progress.changefeed_id,
            ts=progress.ts,
            unit=progress.unit,
            parts_done=progress.parts_done,
            parts_total=progress.parts_total,
            rows_done=progress.rows_done,
            rows_estimate=progress.rows_estimate,
            phase=progress.phase,
        )

    @staticmethod
    def _notify(caller: Callable[..., Any], **kwargs: Any) -> None:
        try:
            caller(**kwargs)
        except Exception:
            log.exception("a plugin's %s hook failed; ignored", getattr(caller, "name", "lifecycle"))

    # -- introspection ------------------------------------------------------------

    def origin_of(self, plugin: object) -> PluginOrigin | None:
        return self._origins.get(id(plugin))

    def registries(self) -> dict[str, PluginRegistry[Any]]:
        """Every registry of plugin classes by kind, in display order (executors,
        which are factories, are in :attr:`executors`)."""
        return {
            "sources": self.sources,
            "sinks": self.sinks,
            "schedulers": self.schedulers,
            "codecs": self.codecs,
            "transforms": self.transforms,
        }

    @property
    def hook(self) -> Any:
        """The raw pluggy hook relay (for tests and advanced use)."""
        return self._pm.hook


_DEFAULT: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide default plugin manager, loaded on first use."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = PluginManager.default()
    return _DEFAULT
