import json
import socket

import pytest

from cdcflow.core.cli import main as cli_main
from cdcflow.core.cli._common import EXIT_CONFIG
from cdcflow.core.version import __version__
from tests import REPO


def run(capsys, *argv):
    code = cli_main.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys):
    code, out, _ = run(capsys, "version")
    assert code == 0
    assert out.strip() == f"cdcflow {__version__}"
    code, out, _ = run(capsys, "version", "--json")
    assert json.loads(out)["cdcflow"] == __version__


def test_plugins_lists_builtins_with_origin(capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    for kind in ("sources:", "sinks:", "schedulers:", "codecs:"):
        assert kind in out
    assert "file" in out and "from builtin (cdcflow.plugins.sinks.file)" in out
    code, out, _ = run(capsys, "plugins", "--json", "--kind", "sinks")
    data = json.loads(out)
    assert list(data) == ["sinks"]
    file_sink = next(p for p in data["sinks"] if p["type"] == "file")
    assert "protocol" in file_sink["config_schema"]["properties"]


def test_validate_ok_and_broken(capsys, tmp_path):
    code, out, _ = run(capsys, "validate", str(REPO / "connectors.yaml"))
    assert code == 0
    assert "valid" in out
    broken = tmp_path / "broken.yaml"
    broken.write_text((REPO / "connectors.yaml").read_text().replace("api-addr:", "api-adr:"))
    code, _, err = run(capsys, "validate", str(broken))
    assert code == EXIT_CONFIG
    assert f"{broken}:" in err
    assert "server.api-adr: unknown field 'api-adr'" in err
    code, out, _ = run(capsys, "validate", "--json", str(broken))
    issue = json.loads(out)["error"]["detail"]["issues"][0]
    assert issue["path"] == "server.api-adr"
    assert isinstance(issue["line"], int)


def test_every_command_has_help(capsys):
    parser = cli_main.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, subparser in sub.choices.items():
        assert subparser.description, name
        for action in subparser._actions:
            if action.dest not in ("help",) and action.option_strings:
                assert action.help, (name, action.dest)


@pytest.mark.parametrize("argv", [["changefeed", "list"], ["capture", "list"], ["changefeed", "pause", "-c", "x"]])
def test_cli_says_when_the_server_cannot_be_reached(capsys, argv):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        code, out, err = run(capsys, "cli", "--server", f"127.0.0.1:{port}", *argv)
    assert code == 1
    assert "cannot reach the cdcflow server" in err
    assert out == ""


def test_plugins_lists_the_executors_executor_names(capsys):
    code, out, _ = run(capsys, "plugins", "--kind", "executors")
    assert code == 0
    assert "in-process" in out and "from builtin (cdcflow.core.testing.inprocess)" in out
    assert "spark" in out and "from builtin (cdcflow.core.data.pipeline)" in out


def test_an_unknown_executor_is_an_error_naming_the_known_ones(capsys):
    code, _, err = run(capsys, "run", str(REPO / "connectors.yaml"), "--executor", "nope")
    assert code == 1
    assert "unknown executor 'nope'; known: in-process, spark" in err
