"""``cdcflow playground --cockroach``: the CockroachDB playground's DSN printed, a real pgwire server behind it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import psycopg
import pytest

from cdcflow.core.cli import main as cli_main

pytestmark = pytest.mark.integration


def test_dsn_printed_workload_running_and_ctrl_c_stops_it() -> None:
    command = [sys.executable, "-m", "cdcflow.core.cli.main", "playground", "--cockroach", "--sql-port", "0"]
    process = subprocess.Popen(
        [*command, "--rate", "50", "--password", "pw", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        printed = json.loads(process.stdout.readline())
        assert printed["dsn"].startswith(f"postgresql://root:pw@127.0.0.1:{printed['port']}/shop")
        with psycopg.connect(printed["dsn"], autocommit=True) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM crdb_internal.tables").fetchall()}
            assert {"customers", "products", "orders"} <= tables
            assert "." in str(conn.execute("SELECT cluster_logical_timestamp()").fetchone()[0])  # type: ignore[index]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert out.startswith("playground stopped:")


def test_human_output_and_a_port_in_use(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["playground", "--cockroach", "--sql-port", "0", "--rate", "0", "--duration", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "DSN  postgresql://root@127.0.0.1:" in out and "type: cockroachdb" in out
    assert "playground stopped: 0 transactions" in out
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["playground", "--cockroach", "--sql-port", str(port), "--rate", "0", "--duration", "0.1"]
        assert cli_main.main(args) == 1
        assert f"127.0.0.1:{port}" in capsys.readouterr().err
