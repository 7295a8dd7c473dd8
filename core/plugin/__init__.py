"""The plugin system: hook specifications, registries and the plugin manager.

Public API::

    from cdcflow.core.plugin import hookimpl, PluginConfig, PluginManager
"""

from cdcflow.core.plugin.base import Plugin, PluginConfig
from cdcflow.core.plugin.hookspec import hookimpl
from cdcflow.core.plugin.manager import (
    AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
    PluginManager,
    get_plugin_manager,
)
from cdcflow.core.plugin.registry import PluginEntry, PluginOrigin, PluginRegistry, Registrar

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
