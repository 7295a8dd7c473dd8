"""A capture killed with SIGKILL mid-run resumes from its last checkpoint: no row goes missing."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.data.pipeline_capture import FINAL_TS, GATE_TS, ROWS_PER_TXN, TXNS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def start_capture(tmp_path):
    args = [str(tmp_path / "data"), str(tmp_path / "out"), str(tmp_path / "checkpoint")]
    with (tmp_path / "capture.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.data.pipeline_capture", *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the JVM and Python workers are in its process group
        )


def kill_group(proc):
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def flushed_checkpoint(tmp_path):
    try:
        return json.loads((tmp_path / "out" / "metadata").read_text())["checkpoint-ts"]
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def delivered_ids(tmp_path):
    ids = []
    for path in (tmp_path / "out" / "shop" / "orders").glob("*.jsonl"):
        ids.extend(json.loads(line)["after"]["id"] for line in path.read_text().splitlines())
    return ids


def test_sigkill_mid_run_then_restart_delivers_every_row(tmp_path):
    first = start_capture(tmp_path)
    try:
        deadline = time.monotonic() + 240
        while flushed_checkpoint(tmp_path) < GATE_TS:
            assert first.poll() is None, (tmp_path / "capture.log").read_text()
            assert time.monotonic() < deadline, "no batch was flushed in time"
            time.sleep(0.1)
    finally:
        kill_group(first)
    killed_at = int((tmp_path / "checkpoint").read_text())
    assert GATE_TS <= killed_at < FINAL_TS, "the capture must be killed mid-run for this test to mean anything"
    before_restart = set(delivered_ids(tmp_path))
    assert before_restart and len(before_restart) < TXNS * ROWS_PER_TXN

    second = start_capture(tmp_path)
    try:
        assert second.wait(timeout=240) == 0, (tmp_path / "capture.log").read_text()
    finally:
        if second.poll() is None:
            kill_group(second)
    log = (tmp_path / "capture.log").read_text()
    assert f"started {killed_at}" in log
    ids = delivered_ids(tmp_path)
    assert set(ids) == set(range(TXNS * ROWS_PER_TXN))  # nothing missing; repeats are allowed
    assert flushed_checkpoint(tmp_path) == FINAL_TS
