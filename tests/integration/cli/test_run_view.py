"""What ``cdcflow run`` shows: the rich live view on a terminal (a pseudo-terminal here),
plain lines with ``--plain`` or without a terminal, and ``--log-format json``."""

from __future__ import annotations

import json
import os
import select
import subprocess

import pytest

from tests.integration.cli.test_run import write_file
from tests.integration.control.cluster import CDCFLOW, env_with_plugin

pytestmark = pytest.mark.integration

# The control plane's in-process executor: this is about the terminal, not Spark.
RUN = ["run", "--duration", "6", "--executor", "in-process"]


def run_on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run with stdout on a pseudo-terminal (120 columns); its output, and stderr."""
    primary, secondary = os.openpty()
    env = {**env, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen(argv, stdout=secondary, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    os.close(secondary)
    shown = bytearray()
    while True:
        ready, _, _ = select.select([primary], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal closed: the process exited
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(primary)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, shown.decode(errors="replace"), err.decode(errors="replace")


def test_a_terminal_gets_the_live_view_and_plain_gets_lines(tmp_path):
    env = env_with_plugin(tmp_path / "plugins")
    path = write_file(tmp_path)
    code, shown, err = run_on_a_terminal([CDCFLOW, *RUN[:1], path, *RUN[1:]], env)
    assert code == 0, err
    # The live view: a table titled with the changefeed, its columns, drawn with box characters.
    assert "ticks" in shown and "checkpoint lag" in shown and "rows/s" in shown, shown
    assert "┏" in shown and "normal" in shown
    assert "ticks normal" not in err  # no plain lines beside it
    assert "ticks: normal, checkpoint" in shown  # the summary after the view

    code, shown, err = run_on_a_terminal([CDCFLOW, *RUN[:1], path, *RUN[1:], "--plain"], env)
    assert code == 0, err
    assert "┏" not in shown and "\x1b[" not in err
    assert any(line.startswith("ticks normal") and "rows/s, checkpoint lag" in line for line in err.splitlines()), err


def test_json_logs_without_a_terminal(tmp_path):
    env = env_with_plugin(tmp_path / "plugins")
    path = write_file(tmp_path)
    argv = [CDCFLOW, "--log-level", "info", *RUN[:1], path, *RUN[1:], "--log-format", "json"]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stdout + result.stderr  # no terminal: no live view
    logs = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    plain = [line for line in result.stderr.splitlines() if line and not line.startswith("{")]
    assert logs, result.stderr
    assert all({"ts", "level", "logger", "message"} <= set(doc) for doc in logs)
    assert {doc["level"] for doc in logs} <= {"debug", "info", "warning", "error", "critical"}
    started = [d for d in logs if d["message"].startswith("maintainer of ticks")]
    assert started and started[0]["changefeed"] == "ticks" and started[0]["logger"].startswith("cdcflow.")
    # What is not a log record is the progress line (no terminal: plain).
    assert plain and all(line.startswith("ticks normal") for line in plain), plain
