"""The built-in plugins: every module the manager loads registers plugins, each of the
kind whose subpackage it lives in (sources from ``sources/``, sinks from ``sinks/``, …)."""

from cdcflow.core.plugin.manager import BUILTIN_PLUGINS, PluginManager

KINDS = ("sources", "sinks", "schedulers", "codecs", "transforms")


def test_every_built_in_plugin_comes_from_the_subpackage_of_its_kind():
    registries = PluginManager.default(autoload=False).registries()
    assert sorted(registries) == sorted(KINDS)
    for kind, registry in registries.items():
        modules = {entry.origin.module for entry in registry}
        assert modules, kind
        assert all(m.startswith(f"cdcflow.plugins.{kind}.") for m in modules), (kind, modules)


def test_every_built_in_module_implements_a_hook():
    """Each module the manager loads contributes something: a registered plugin of one of
    the four kinds, or another hook (executors, commands, the playground's upstream)."""
    import importlib
    import inspect

    registries = PluginManager.default(autoload=False).registries().values()
    registering = {entry.origin.module for registry in registries for entry in registry}
    for name in BUILTIN_PLUGINS:
        module = importlib.import_module(name)
        hooks = [n for n, fn in inspect.getmembers(module) if n.startswith("cdcflow_") and hasattr(fn, "cdcflow_impl")]
        assert hooks or name in registering, f"{name} implements no cdcflow hook"
    assert registering <= set(BUILTIN_PLUGINS)
