import pytest

from cdcflow.core.plugin import PluginManager, hookimpl
from cdcflow.core.plugin.hookspec import PROJECT_NAME
from cdcflow.core.plugin.manager import BUILTIN_PLUGINS


def test_builtins_are_registered_through_the_manager():
    pm = PluginManager.default(autoload=False)
    assert "file" in pm.sinks
    assert "json" in pm.codecs
    assert "round-robin" in pm.schedulers
    assert "tikv" in pm.sources
    for kind, registry in pm.registries().items():
        for entry in registry:
            assert entry.origin.kind == "builtin", (kind, entry.type_name)
            assert entry.origin.module in BUILTIN_PLUGINS


def test_autoload_switch(monkeypatch):
    calls = []
    monkeypatch.setattr(PluginManager, "load_entry_points", lambda self, group="cdcflow": calls.append(group))
    monkeypatch.setenv("CDCFLOW_DISABLE_PLUGIN_AUTOLOAD", "1")
    PluginManager.default()
    assert calls == []
    monkeypatch.setenv("CDCFLOW_DISABLE_PLUGIN_AUTOLOAD", "0")
    PluginManager.default()
    assert calls == ["cdcflow"]


class Observer:
    def __init__(self):
        self.events = []

    @hookimpl
    def cdcflow_changefeed_state_changed(self, changefeed_id, old_state, new_state, error):
        self.events.append(("state", changefeed_id, old_state, new_state, error))

    @hookimpl
    def cdcflow_batch_flushed(self, changefeed_id, batch_id, checkpoint_ts, row_count):
        self.events.append(("batch", changefeed_id, batch_id, checkpoint_ts, row_count))

    @hookimpl
    def cdcflow_spark_conf(self, master):
        return {"spark.demo": master}


def test_lifecycle_facade_calls_observers():
    pm = PluginManager.default(autoload=False)
    obs = Observer()
    pm.register(obs)
    pm.changefeed_state_changed("cf", "normal", "paused")
    pm.batch_flushed("cf", 3, 42, 10)
    assert obs.events == [("state", "cf", "normal", "paused", None), ("batch", "cf", 3, 42, 10)]
    assert pm.spark_conf("local[2]") == {"spark.demo": "local[2]"}


def test_faulty_observer_does_not_raise(caplog):
    class Faulty:
        @hookimpl
        def cdcflow_batch_flushed(self, changefeed_id, batch_id, checkpoint_ts, row_count):
            raise RuntimeError("observer bug")

    pm = PluginManager.default(autoload=False)
    pm.register(Faulty())
    pm.batch_flushed("cf", 1, 2, 3)
    assert "observer bug" in caplog.text


def test_spark_conf_later_plugins_win_in_registration_order():
    class First:
        @hookimpl
        def cdcflow_spark_conf(self, master):
            return {"k": "first", "only-first": "1"}

    class Second:
        @hookimpl
        def cdcflow_spark_conf(self, master):
            return {"k": "second"}

    pm = PluginManager.default(autoload=False)
    pm.register(First())
    pm.register(Second())
    assert pm.spark_conf("local") == {"k": "second", "only-first": "1"}


def test_trace_env_writes_hook_calls(monkeypatch, capsys):
    monkeypatch.setenv("CDCFLOW_TRACE_PLUGINS", "1")
    pm = PluginManager.default(autoload=False)
    pm.batch_flushed("cf", 1, 2, 3)
    assert "cdcflow_batch_flushed" in capsys.readouterr().err


def test_project_name():
    assert PROJECT_NAME == "cdcflow"


def test_every_core_module_imports_first_in_a_fresh_interpreter():
    """Importing a plugin base module before anything else must not be circular."""
    import subprocess
    import sys

    for module in (
        "cdcflow.core.data.source",
        "cdcflow.core.data.sink",
        "cdcflow.core.data.codec",
        "cdcflow.core.control.scheduling",
    ):
        result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False)
        assert result.returncode == 0, (module, result.stderr)


# -- registration hooks are historic; misspelled hooks are rejected ---------------------

TYPO_PLUGIN = """
from cdcflow.core.plugin import hookimpl


@hookimpl
def cdcflow_register_sink(registry):  # the hook is cdcflow_register_sinks
    raise AssertionError("never called")
"""


def test_a_misspelled_hook_in_an_entry_point_plugin_is_rejected(monkeypatch, tmp_path):
    from importlib import metadata

    from cdcflow.core.errors import ConfigInvalidError, PluginValidationError

    (tmp_path / "cdcflow_typo_plugin.py").write_text(TYPO_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_point = metadata.EntryPoint(name="typo", value="cdcflow_typo_plugin", group="cdcflow")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [entry_point] if group == "cdcflow" else [])
    with pytest.raises(PluginValidationError) as info:
        PluginManager.default(autoload=True)
    message = str(info.value)
    assert isinstance(info.value, ConfigInvalidError)
    assert "entry point 'typo'" in message and "(cdcflow_typo_plugin)" in message
    assert "'cdcflow_register_sink' (did you mean 'cdcflow_register_sinks'?)" in message
    assert "docs/reference/hooks.md" in message
    assert info.value.detail["hooks"] == ["cdcflow_register_sink"]


def test_a_misspelled_hook_fails_the_command_line(monkeypatch, tmp_path, capsys):
    from importlib import metadata

    from cdcflow.core.cli import main as cli_main

    (tmp_path / "cdcflow_typo_plugin.py").write_text(TYPO_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_point = metadata.EntryPoint(name="typo", value="cdcflow_typo_plugin", group="cdcflow")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [entry_point] if group == "cdcflow" else [])
    monkeypatch.delenv("CDCFLOW_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    assert cli_main.main(["version"]) == 1
    assert "cdcflow_register_sink" in capsys.readouterr().err


def test_check_pending_after_a_runtime_plugin():
    from cdcflow.core.errors import PluginValidationError

    class Typo:
        @hookimpl
        def cdcflow_batch_flush(self, changefeed_id, batch_id, checkpoint_ts, row_count):
            pass

    pm = PluginManager.default(autoload=False)
    pm.register(Typo(), name="typo-observer")
    with pytest.raises(PluginValidationError, match=r"typo-observer.*did you mean 'cdcflow_batch_flushed'"):
        pm.check_pending()


def test_an_argument_the_hook_does_not_provide_is_rejected_naming_the_plugin():
    from cdcflow.core.errors import PluginValidationError

    class Wrong:
        @hookimpl
        def cdcflow_register_sinks(self, registrar):
            pass

    pm = PluginManager.default(autoload=False)
    wrong = Wrong()
    with pytest.raises(PluginValidationError, match=r"wrong-args.*registrar"):
        pm.register(wrong, name="wrong-args")
    assert pm.origin_of(wrong) is None  # not half-registered


def test_a_plugin_registered_later_still_registers_with_its_origin():
    from cdcflow.core.testing import ListSink

    class Late:
        @hookimpl
        def cdcflow_register_sinks(self, registry):
            registry.add(ListSink)

    pm = PluginManager.default(autoload=False)
    assert "list" not in pm.sinks
    pm.register(Late(), name="late-plugin")
    entry = pm.sinks.get("list")
    assert entry is not None and entry.cls is ListSink
    assert entry.origin.kind == "runtime" and entry.origin.name == "late-plugin"


def test_trace_covers_registration_hooks(monkeypatch, capsys):
    monkeypatch.setenv("CDCFLOW_TRACE_PLUGINS", "1")
    PluginManager.default(autoload=False)
    err = capsys.readouterr().err
    assert "cdcflow_register_sinks" in err and "cdcflow_register_executors" in err


# -- executors ---------------------------------------------------------------------------


def test_builtin_executors_are_registered_by_name():
    from cdcflow.core.data.pipeline import executor_factory as spark_factory
    from cdcflow.core.testing.inprocess import executor_factory as in_process_factory

    pm = PluginManager.default(autoload=False)
    assert pm.executors.names() == ["in-process", "spark"]
    assert pm.executors.factory("spark") is spark_factory
    assert pm.executors.factory("in-process") is in_process_factory
    for entry in pm.executors:
        assert entry.origin.kind == "builtin" and entry.origin.module in BUILTIN_PLUGINS
        assert entry.summary


def test_an_unknown_executor_names_the_known_ones():
    from cdcflow.core.errors import ConfigInvalidError

    pm = PluginManager.default(autoload=False)
    with pytest.raises(ConfigInvalidError, match=r"unknown executor 'sprak'; known: in-process, spark"):
        pm.executors.factory("sprak")


def test_two_executors_under_one_name_name_both_origins():
    from cdcflow.core.errors import PluginConflictError

    class Dup:
        @hookimpl
        def cdcflow_register_executors(self, registry):
            registry.add("spark", lambda context: None)

    pm = PluginManager.default(autoload=False)
    with pytest.raises(PluginConflictError) as info:
        pm.register(Dup(), name="dup-executor")
    assert "builtin (cdcflow.core.data.pipeline)" in str(info.value)
    assert "dup-executor" in str(info.value)


def test_an_executor_starts_what_it_needs_when_the_capture_starts(caplog):
    """The Spark executor starts Spark beside the capture; a start that fails is logged."""
    import threading

    from cdcflow.core.config.settings import ServerSettings
    from cdcflow.core.data.pipeline import start_spark

    started = threading.Event()
    seen = []

    class Starting:
        @hookimpl
        def cdcflow_register_executors(self, registry):
            registry.add(
                "warm", lambda context: None, start=lambda server, plugins: (seen.append(server), started.set())
            )
            registry.add("broken", lambda context: None, start=lambda server, plugins: 1 / 0)

    pm = PluginManager.default(autoload=False)
    pm.register(Starting(), name="starting")
    server = ServerSettings()
    pm.executors.start("warm", server, pm).join(timeout=10)
    assert started.is_set() and seen == [server]
    pm.executors.start("broken", server, pm).join(timeout=10)
    assert "executor broken: starting at capture start failed" in caplog.text
    assert pm.executors.start("in-process", server, pm) is None  # nothing to start
    assert pm.executors.get("spark").start is start_spark


def test_an_executor_stops_what_it_started_when_the_capture_stopped(caplog):
    """The Spark executor stops Spark once the capture stopped; a stop that fails is logged."""
    from cdcflow.core.data.pipeline import stop_spark

    stopped = []

    class Stopping:
        @hookimpl
        def cdcflow_register_executors(self, registry):
            registry.add("cold", lambda context: None, stop=lambda: stopped.append("cold"))
            registry.add("broken", lambda context: None, stop=lambda: 1 / 0)

    pm = PluginManager.default(autoload=False)
    pm.register(Stopping(), name="stopping")
    pm.executors.stop("cold")
    assert stopped == ["cold"]
    pm.executors.stop("broken")
    assert "executor broken: stopping at capture stop failed" in caplog.text
    pm.executors.stop("in-process")  # nothing to stop
    assert pm.executors.get("spark").stop is stop_spark


# -- commands ----------------------------------------------------------------------------


def test_a_plugin_adds_a_command():
    from cdcflow.core.cli.main import build_parser

    class Hello:
        @hookimpl
        def cdcflow_add_commands(self, subparsers):
            parser = subparsers.add_parser("hello", help="say hello", description="Say hello.")
            parser.set_defaults(func=lambda args: 7)

    pm = PluginManager.default(autoload=False)
    pm.register(Hello(), name="hello-plugin")
    args = build_parser(pm).parse_args(["hello"])
    assert args.func(args) == 7 and args.plugins is pm
    names = list(next(a for a in build_parser(pm)._actions if a.dest == "command").choices)
    assert names[:6] == ["run", "server", "cli", "validate", "plugins", "version"]  # built-ins first
    assert {"playground", "hello"} <= set(names)
