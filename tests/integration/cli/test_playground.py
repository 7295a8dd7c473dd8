"""``cdcflow playground``: addresses printed, real servers behind them, clean stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import grpc
import pytest

from cdcflow.core.cli import main as cli_main
from cdcflow.plugins.sources.tikv.kvproto import pdpb_pb2, pdpb_pb2_grpc

pytestmark = pytest.mark.integration


def test_ctrl_c_stops_the_playground_cleanly() -> None:
    command = [sys.executable, "-m", "cdcflow.core.cli.main", "playground", "--pd-port", "0", "--status-port", "0"]
    process = subprocess.Popen(
        [*command, "--stores", "2", "--rate", "50", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        addresses = json.loads(process.stdout.readline())
        assert len(addresses["stores"]) == 2
        with grpc.insecure_channel(addresses["pd"]) as channel:
            members = pdpb_pb2_grpc.PDStub(channel).GetMembers(pdpb_pb2.GetMembersRequest())
            assert members.header.cluster_id == addresses["cluster_id"]
        with urllib.request.urlopen(f"http://{addresses['tidb_status']}/schema/shop") as response:
            assert {t["name"]["O"] for t in json.loads(response.read())} == {"customers", "products", "orders"}
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert out.startswith("playground stopped:")


def test_duration_and_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main.main(["playground", "--pd-port", "0", "--status-port", "0", "--rate", "0", "--duration", "0.3"])
    out = capsys.readouterr().out
    assert code == 0
    assert "cdcflow playground is up" in out and "export CDCFLOW_PD=127.0.0.1:" in out
    assert "playground stopped: 0 transactions" in out


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["playground", "--stores", "0", "--duration", "0.1"]) == 2
    assert "--stores must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main.main(["playground", "--pd-port", "70000"])


def test_a_port_in_use_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for option in ("--pd-port", "--status-port"):
            args = ["playground", "--pd-port", "0", "--status-port", "0", "--rate", "0", "--duration", "0.1"]
            args[args.index(option) + 1] = str(port)
            assert cli_main.main(args) == 1
            assert f"127.0.0.1:{port}" in capsys.readouterr().err
