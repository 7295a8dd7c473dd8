"""The built-in plugins: every module the manager loads registers plugins, each of the
kind whose subpackage it lives in (sources from ``sources/``, sinks from ``sinks/``, …)."""

from cdcflow.core.plugin.manager import BUILTIN_PLUGINS, PluginManager

KINDS = ("sources", "sinks", "schedulers", "codecs")


def test_every_built_in_plugin_comes_from_the_subpackage_of_its_kind():
    registries = PluginManager.default(autoload=False).registries()
    assert sorted(registries) == sorted(KINDS)
    for kind, registry in registries.items():
        modules = {entry.origin.module for entry in registry}
        assert modules, kind
        assert all(m.startswith(f"cdcflow.plugins.{kind}.") for m in modules), (kind, modules)


def test_every_built_in_module_registers_a_plugin():
    registries = PluginManager.default(autoload=False).registries().values()
    registering = {entry.origin.module for registry in registries for entry in registry}
    assert registering == set(BUILTIN_PLUGINS)
