"""Bad command-line input and bad request bodies: a message and a documented exit
status (or a JSON 4xx), never a traceback."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

from cdcflow.core.cli import main as cli_main
from cdcflow.core.cli._common import EXIT_CONFIG, EXIT_USAGE
from cdcflow.core.cli.ctl import changefeed_path
from tests.unit.core.api.live import LiveApi


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli_main.main(list(argv))
    except SystemExit as exit_:  # argparse: usage errors
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("addr", ["notaport", "127.0.0.1:99999", ":8300", "127.0.0.1:"])
def test_server_addr_that_is_not_host_port_is_a_usage_error(capsys, tmp_path, monkeypatch, addr):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "server", "--addr", addr, "--executor", "in-process")
    assert code == EXIT_USAGE
    assert "argument --addr" in err and "is not host:port" in err
    assert not (tmp_path / "data").exists()  # nothing started


@pytest.mark.parametrize("server", ["not a url", "ftp://h:1", "http://h:notaport", "http://h:1/x?y", "http://"])
def test_cli_server_that_is_not_an_address_is_a_usage_error(capsys, server):
    code, _, err = run(capsys, "cli", "--server", server, "changefeed", "list")
    assert code == EXIT_USAGE
    assert "is not a server address" in err and "host:port" in err


@pytest.mark.parametrize("cf", ["a b", "x?y", "../x", "-x", "a--b", ""])
def test_an_invalid_changefeed_id_says_what_ids_may_contain(capsys, cf):
    port = closed_port()
    for verb in ("query", "remove", "pause"):
        code, _, err = run(capsys, "cli", "--server", f"127.0.0.1:{port}", "changefeed", verb, f"--changefeed-id={cf}")
        assert code == EXIT_USAGE
        assert "is not a changefeed id: ids contain letters and digits, words joined by single dashes" in err
        assert "cannot reach" not in err  # refused before anything is sent


def test_ids_are_percent_encoded_in_paths():
    assert changefeed_path("x?y") == "/api/v2/changefeeds/x%3Fy"
    assert changefeed_path("a/b", "/pause") == "/api/v2/changefeeds/a%2Fb/pause"
    assert changefeed_path("orders-1") == "/api/v2/changefeeds/orders-1"


def test_a_bad_config_file_is_an_invalid_configuration(capsys, tmp_path):
    port = closed_port()
    base = ["cli", "--server", f"127.0.0.1:{port}", "changefeed", "create", "-c", "cf-1", "--config"]
    code, _, err = run(capsys, *base, str(tmp_path / "missing.yaml"))
    assert code == EXIT_CONFIG and "missing.yaml: cannot read it" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("source:\n  type: ticker\nsinks: [\n")
    code, _, err = run(capsys, *base, str(broken))
    assert code == EXIT_CONFIG and f"{broken}:4" in err and "not valid YAML" in err
    listed = tmp_path / "list.yaml"
    listed.write_text("- source: {type: ticker}\n")
    code, _, err = run(capsys, *base, str(listed))
    assert code == EXIT_CONFIG and "holds a list, not a mapping of changefeed fields" in err
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"source: \xff\xfe\n")
    code, _, err = run(capsys, *base, str(binary))
    assert code == EXIT_CONFIG and "not UTF-8 text" in err
    assert "cannot reach" not in err  # nothing was sent


def test_connection_options_after_the_verb(capsys, tmp_path):
    with LiveApi(tmp_path) as api:
        code, out, err = run(capsys, "cli", "changefeed", "list", f"--server={api.url}", "--json")
        assert code == 0, err
        assert json.loads(out) == {"total": 0, "items": []}
        code, out, err = run(capsys, "cli", "capture", "list", "--json", "--server", api.url)
        assert code == 0 and json.loads(out)["total"] == 1
        # Given in both places, the one after the verb wins.
        port = closed_port()
        code, out, err = run(capsys, "cli", "--server", f"127.0.0.1:{port}", "changefeed", "list", "--server", api.url)
        assert code == 0 and "STATE" in out
        # An encoded id reaches the server whole: the answer names it, not a truncated one.
        status, body = _get(f"{api.url}{changefeed_path('x?y')}")
        assert status == 404 and "x?y" in body["error_msg"]


def _get(url: str, data: bytes | None = None, method: str = "GET") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        assert exc.headers.get_content_type() == "application/json", raw[:200]
        return exc.code, json.loads(raw)


@pytest.mark.parametrize("depth", [900, 5000, 100_000])
def test_deeply_nested_request_bodies_are_a_json_400(tmp_path, depth):
    nested_object = ('{"changefeed_id": "cf-1", "source": ' + '{"a": ' * depth + "1" + "}" * depth + "}").encode()
    nested_array = ("[" * depth + "]" * depth).encode()
    with LiveApi(tmp_path) as api:
        # A paused changefeed: an update and a resume read their bodies.
        create = {
            "changefeed_id": "cf-1",
            "source": {"type": "ticker"},
            "sinks": [{"type": "file", "path": str(tmp_path)}],
        }
        assert _get(f"{api.url}/api/v2/changefeeds", json.dumps(create).encode(), "POST")[0] == 201
        assert _get(f"{api.url}/api/v2/changefeeds/cf-1/pause", b"", "POST")[0] == 200
        for path, method in (
            ("/api/v2/changefeeds", "POST"),
            ("/api/v2/verify_config", "POST"),
            ("/api/v2/changefeeds/cf-1", "PUT"),
            ("/api/v2/changefeeds/cf-1/resume", "POST"),
        ):
            for body in (nested_object, nested_array):
                status, answer = _get(f"{api.url}{path}", body, method)
                assert status == 400, (path, answer)
                assert answer["code"] == 1001 and "more than 64 levels deep" in answer["error_msg"]


def test_bodies_that_are_not_json_objects_are_a_json_400(tmp_path):
    with LiveApi(tmp_path) as api:
        for body in (b"\xff\xfe", b"[1, 2]", b'"text"', b"{", b"nul\x00l"):
            status, answer = _get(f"{api.url}/api/v2/changefeeds", body, "POST")
            assert status == 400 and answer["error_code"] == "ErrConfigInvalid", body
        status, answer = _get(f"{api.url}/api/v2/no-such-path")
        assert status == 404 and answer["error_code"] == "ErrNotFound"
