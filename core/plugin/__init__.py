"""The plugin system: hook specifications, registries and the plugin manager.

Public API::

    from cdcflow.core.plugin import hookimpl, PluginConfig, PluginManager

The manager is imported lazily: it imports the plugin base classes
(``cdcflow.core.data.source`` and friends), which themselves import
``cdcflow.core.plugin.base``; loading it eagerly here would make importing
``cdcflow.core.data.source`` first a circular import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdcflow.core.plugin.base import Plugin, PluginConfig
from cdcflow.core.plugin.hookspec import hookimpl
from cdcflow.core.plugin.registry import PluginEntry, PluginOrigin, PluginRegistry, Registrar

if TYPE_CHECKING:
    from cdcflow.core.plugin.manager import AUTOLOAD_ENV, ENTRY_POINT_GROUP, PluginManager, get_plugin_manager

__all__ = [
    "AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "Plugin",
    "PluginConfig",
    "PluginEntry",
    "PluginManager",
    "PluginOrigin",
    "PluginRegistry",
    "Registrar",
    "get_plugin_manager",
    "hookimpl",
]

_LAZY = {"AUTOLOAD_ENV", "ENTRY_POINT_GROUP", "PluginManager", "get_plugin_manager"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from cdcflow.core.plugin import manager

        return getattr(manager, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
