"""A capture stopped (SIGTERM) while a micro-batch is written in Spark tasks: one line of
ours says which batch was interrupted and that it is replayed, no ERROR and no Java trace
reach the log, and the next start replays the batch (same id) to completion. A batch that
fails for a real reason after such a stop, in the same Spark, is still logged by Spark
with its cause."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import REPO
from tests.integration.data.stop_capture import FINAL_TS, ROWS, START_TS

pytestmark = pytest.mark.integration

WAIT = 240.0  # a hang guard: Spark's start and a batch take seconds, more on a loaded machine


def start_capture(tmp_path: Path, name: str, *options: str) -> subprocess.Popen[bytes]:
    (tmp_path / "gate").mkdir(exist_ok=True)
    args = [str(tmp_path / "data"), str(tmp_path / "gate"), *options]
    with (tmp_path / f"{name}.out").open("wb") as out, (tmp_path / f"{name}.err").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.data.stop_capture", *args],
            cwd=REPO,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its JVM and Python workers are in this group
        )


def finish(proc: subprocess.Popen[bytes], tmp_path: Path, name: str) -> tuple[int, str, str]:
    try:
        code = proc.wait(timeout=WAIT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return code, (tmp_path / f"{name}.out").read_text(), (tmp_path / f"{name}.err").read_text()


def wait_for(path_glob: str, directory: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT
    while not any(directory.glob(path_glob)):
        assert proc.poll() is None, "the capture ended before its batch reached the sink's tasks"
        assert time.monotonic() < deadline, f"no {path_glob} in {directory} in time"
        time.sleep(0.1)


def test_a_stop_mid_batch_is_one_line_and_a_restart_replays_the_batch(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    failing = gate / "failing"  # the second changefeed's, after the stop: fails at once
    failing.mkdir(parents=True)
    (failing / "fail").touch()
    (failing / "open").touch()
    first = start_capture(tmp_path, "first", "then-fail")
    wait_for("started-0-*", gate, first)  # batch 0's task waits at the gate: the stop comes mid-batch
    first.send_signal(signal.SIGTERM)
    code, out, err = finish(first, tmp_path, "first")
    assert code == 0, err
    assert out.splitlines()[1] == f"stopped {START_TS}"
    failed = out.partition("failed: ")[2]
    assert not (gate / "committed").exists()
    ours = [line for line in err.splitlines() if "interrupted by the stop" in line]
    assert len(ours) == 1, err
    assert " WARNING cdcflow.core.data.pipeline.runtime: changefeed stop: batch 0 " in ours[0]
    assert "replayed on the next start" in ours[0]
    # The stop's part of the log: everything until the stopped changefeed's executor closed.
    stop_log, closed, fail_log = err.partition(" INFO stop_capture: stopped closed")
    assert closed, err
    assert " ERROR " not in stop_log, err
    assert "\tat org.apache.spark" not in stop_log and "Traceback" not in stop_log, err
    # A real failure, after the stop in the same Spark: Spark's error, with its cause.
    assert "fails as" in failed
    assert " ERROR spark MicroBatchExecution: Query cdcflow-fail " in fail_log and "fails as" in fail_log, err

    (gate / "open").touch()
    second = start_capture(tmp_path, "second")
    code, out, err = finish(second, tmp_path, "second")
    assert code == 0, err
    assert out.splitlines()[-1] == f"done {FINAL_TS}"
    assert (gate / "committed").read_text().split() == ["0"]  # the interrupted batch, replayed
    ids = [int(i) for path in gate.glob("rows-0-*") for i in path.read_text().split()]
    assert sorted(set(ids)) == list(range(ROWS))
