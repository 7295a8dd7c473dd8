import pytest
from pydantic import Field

from cdcflow.core.data.events import MicroBatch
from cdcflow.core.data.sink import Sink
from cdcflow.core.errors import ConfigInvalidError, PluginConflictError
from cdcflow.core.plugin import PluginConfig, PluginManager, hookimpl
from cdcflow.core.plugin.registry import PluginOrigin, PluginRegistry


class _Cfg(PluginConfig):
    size: int = Field(1, description="a size")


def make_sink(type_name, config=_Cfg):
    class _S(Sink):
        Config = config

        def write_batch(self, batch: MicroBatch) -> None:
            pass

    _S.type_name = type_name
    _S.__qualname__ = f"Sink_{type_name.replace('-', '_')}"
    return _S


ORIGIN_A = PluginOrigin("entry-point", "alpha", "alpha_mod", "alpha-dist 1.0")
ORIGIN_B = PluginOrigin("entry-point", "beta", "beta_mod", "beta-dist 2.0")


def test_add_and_lookup():
    reg = PluginRegistry("sinks", Sink)
    cls = make_sink("demo")
    reg.add(cls, ORIGIN_A)
    assert reg["demo"] is cls
    assert "demo" in reg
    assert reg.names() == ["demo"]
    assert reg.get("demo").origin == ORIGIN_A


def test_conflict_names_both_origins():
    reg = PluginRegistry("sinks", Sink)
    reg.add(make_sink("demo"), ORIGIN_A)
    with pytest.raises(PluginConflictError) as info:
        reg.add(make_sink("demo"), ORIGIN_B)
    text = str(info.value)
    assert "alpha-dist 1.0" in text and "beta-dist 2.0" in text
    assert "'demo'" in text


def test_same_class_twice_is_not_a_conflict():
    reg = PluginRegistry("sinks", Sink)
    cls = make_sink("demo")
    reg.add(cls, ORIGIN_A)
    reg.add(cls, ORIGIN_A)
    assert len(reg) == 1


@pytest.mark.parametrize("bad", ["Demo", "demo_sink", "-x", "", "two--dash"])
def test_type_name_must_be_kebab(bad):
    reg = PluginRegistry("sinks", Sink)
    with pytest.raises(ConfigInvalidError, match="type_name"):
        reg.add(make_sink(bad), ORIGIN_A)


def test_config_fields_need_description_and_default():
    class NoDesc(PluginConfig):
        size: int = 1

    class NoDefault(PluginConfig):
        size: int = Field(description="a size")

    reg = PluginRegistry("sinks", Sink)
    with pytest.raises(ConfigInvalidError, match="no description"):
        reg.add(make_sink("a", NoDesc), ORIGIN_A)
    with pytest.raises(ConfigInvalidError, match="no default"):
        reg.add(make_sink("b", NoDefault), ORIGIN_A)


def test_config_must_forbid_extra_and_be_frozen():
    from pydantic import ConfigDict

    class Loose(PluginConfig):
        model_config = ConfigDict(extra="allow", frozen=True)
        size: int = Field(1, description="a size")

    reg = PluginRegistry("sinks", Sink)
    with pytest.raises(ConfigInvalidError, match="frozen with extra='forbid'"):
        reg.add(make_sink("loose", Loose), ORIGIN_A)


def test_wrong_kind_is_rejected():
    from cdcflow.core.control.scheduling import Scheduler

    reg = PluginRegistry("schedulers", Scheduler)
    with pytest.raises(ConfigInvalidError, match="does not derive"):
        reg.add(make_sink("demo"), ORIGIN_A)


def test_runtime_plugin_conflicting_with_builtin_names_both():
    pm = PluginManager.default(autoload=False)

    class Dup:
        @hookimpl
        def cdcflow_register_sinks(self, registry):
            registry.add(make_sink("file"))

    with pytest.raises(PluginConflictError) as info:
        pm.register(Dup(), name="dup-plugin")
    assert "builtin (cdcflow.plugins.sinks.file)" in str(info.value)
    assert "dup-plugin" in str(info.value)
