"""A third-party plugin installed as a real distribution is discovered through
the ``cdcflow`` entry-point group and usable by ``type:`` in connectors.yaml."""

import os
import subprocess
import sys
import textwrap

import pytest

# Builds and installs a distribution with pip, then runs the command line in subprocesses.
pytestmark = pytest.mark.integration

PLUGIN_MODULE = '''
from typing import Any
from pydantic import Field
from cdcflow.core.plugin import PluginConfig, hookimpl
from cdcflow.core.data.sink import Sink


class EchoConfig(PluginConfig):
    prefix: str = Field("echo", description="Prefix of every line.")


class EchoSink(Sink[EchoConfig]):
    """Prints row counts (a third-party test plugin)."""

    type_name = "echo"
    Config = EchoConfig
    uri_schemes = ("echo",)

    def write_batch(self, batch: Any) -> None:
        print(self.config.prefix, len(batch.rows))


@hookimpl
def cdcflow_register_sinks(registry):
    registry.add(EchoSink)
'''


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    src = tmp_path_factory.mktemp("echo-src")
    (src / "cdcflow_echo.py").write_text(PLUGIN_MODULE)
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "cdcflow-echo"
            version = "1.2.3"

            [project.entry-points.cdcflow]
            echo = "cdcflow_echo"

            [tool.setuptools]
            py-modules = ["cdcflow_echo"]
            """
        )
    )
    target = tmp_path_factory.mktemp("echo-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
    )
    return target


def cdcflow(target, *args, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(target), **(env_extra or {})}
    env.pop("CDCFLOW_DISABLE_PLUGIN_AUTOLOAD", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "cdcflow.core.cli.main", *args], env=env, capture_output=True, text=True, check=False
    )


def test_entry_point_plugin_is_listed_with_distribution(installed_plugin):
    result = cdcflow(installed_plugin, "plugins", "--kind", "sinks")
    assert result.returncode == 0, result.stderr
    assert "echo" in result.stdout
    assert "entry point 'echo' in distribution cdcflow-echo 1.2.3 (cdcflow_echo)" in result.stdout


def test_autoload_can_be_disabled(installed_plugin):
    result = cdcflow(installed_plugin, "plugins", env_extra={"CDCFLOW_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.returncode == 0
    assert "echo" not in result.stdout


def test_entry_point_plugin_usable_in_connectors_yaml(installed_plugin, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        textwrap.dedent(
            """
            connectors:
              - name: demo
                source: {type: tikv}
                sinks:
                  - type: echo
                    prefix: ">>"
                  - uri: echo://anything?prefix=x
            """
        )
    )
    ok = cdcflow(installed_plugin, "validate", str(config))
    assert ok.returncode == 0, ok.stderr
    config.write_text(config.read_text().replace('prefix: ">>"', "prefx: 1"))
    bad = cdcflow(installed_plugin, "validate", str(config))
    assert bad.returncode == 3
    assert "unknown field 'prefx'; allowed: prefix" in bad.stderr
    assert f"{config}:7:" in bad.stderr
