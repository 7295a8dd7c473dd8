"""``cdcflow run connectors.yaml``: one embedded capture on SQLite runs the file's connectors."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.control.cluster import CDCFLOW, env_with_plugin

pytestmark = pytest.mark.integration


def write_file(tmp):
    path = tmp / "connectors.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "server": {"metastore": f"sqlite:///{tmp}/meta.db", "api-addr": "127.0.0.1:0", "data-dir": str(tmp)},
                "connectors": [
                    {
                        "name": "ticks",
                        "source": {"type": "ticker"},
                        "sinks": [{"uri": f"file://{tmp}/out?protocol=json"}],
                    }
                ],
            }
        )
    )
    return str(path)


def summary_checkpoint(stdout: str) -> int:
    line = next(line for line in stdout.splitlines() if line.startswith("ticks:"))
    assert "normal" in line, line
    match = re.search(r"checkpoint (\d+),", line)
    assert match, line
    return int(match.group(1))


def test_run_stopped_then_again_from_the_checkpoint(tmp_path):
    env = env_with_plugin(tmp_path / "plugins")
    path = write_file(tmp_path)
    # Each run is stopped with Ctrl-C once it has stored a checkpoint past the one it started
    # from, rather than after a fixed duration long enough for the embedded Spark session to
    # start on a loaded machine (its startup alone took 20-70 s with the load average at 7 per core).
    first = run_until_checkpoint_passes(path, env, tmp_path, None)
    progress = [line for line in first.stderr.splitlines() if line.startswith("ticks normal")]
    assert progress, first.stderr  # the progress line
    assert "rows/s, checkpoint lag" in progress[0] and "resolved lag" in progress[0]
    assert re.search(r"ticks: normal, checkpoint \d+, [1-9]\d* rows in \d+ batches", first.stdout), first.stdout
    checkpoint = summary_checkpoint(first.stdout)
    assert list((tmp_path / "out").rglob("*.jsonl"))
    second = run_until_checkpoint_passes(path, env, tmp_path, checkpoint)
    assert summary_checkpoint(second.stdout) > checkpoint  # the stored connector resumed, not recreated


def run_until_checkpoint_passes(path: str, env: dict[str, str], tmp: Path, past: int | None, timeout: float = 240):
    """``cdcflow run FILE``, stopped with Ctrl-C once a progress line is out and the stored
    checkpoint of ``ticks`` passes ``past`` (its start ts when None); the finished process."""
    err: list[str] = []
    with subprocess.Popen([CDCFLOW, "run", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as proc:  # fmt: skip
        reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
        reader.start()
        deadline = time.monotonic() + timeout
        try:
            while not (any(line.startswith("ticks normal") for line in err) and _passed(tmp, past)):
                assert proc.poll() is None, "".join(err)
                assert time.monotonic() < deadline, f"no checkpoint past {past} in {timeout:.0f}s:\n" + "".join(err)
                time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            out = proc.stdout.read()  # type: ignore[union-attr]
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(timeout=10)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(err))
    assert result.returncode == 0, result.stderr
    return result


def _passed(tmp: Path, past: int | None) -> bool:
    record = asyncio.run(_stored_or_none(tmp, "ticks"))
    if record is None:
        return False
    info, status = record
    return status.checkpoint_ts > (info.start_ts if past is None else past)


def test_ctrl_c_stops_cleanly(tmp_path):
    env = env_with_plugin(tmp_path / "plugins")
    proc = subprocess.Popen([CDCFLOW, "run", write_file(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    time.sleep(4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert summary_checkpoint(out) > 0


def test_a_changed_file_is_applied_to_the_existing_changefeed(tmp_path):
    env = env_with_plugin(tmp_path / "plugins")
    path = write_file(tmp_path)
    # The control plane's in-process executor: this is about declarations, not Spark.
    run = [CDCFLOW, "run", path, "--duration", "8", "--executor", "in-process"]
    first = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    checkpoint = summary_checkpoint(first.stdout)

    document = yaml.safe_load(Path(path).read_text())
    document["connectors"][0]["sinks"] = [{"uri": f"file://{tmp_path}/elsewhere?protocol=json"}]
    document["connectors"][0]["description"] = "ticks, moved"
    Path(path).write_text(yaml.safe_dump(document))
    second = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    assert "ticks: description, sinks changed in the file" in second.stderr, second.stderr
    assert summary_checkpoint(second.stdout) > checkpoint  # resumed from its checkpoint, not recreated
    assert list((tmp_path / "elsewhere").rglob("*.jsonl"))  # the new sink took the rows

    third = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert third.returncode == 0, third.stderr
    assert "changed in the file" not in third.stderr


def test_a_changefeed_of_the_embedded_playground_is_replaced_in_a_new_run(tmp_path):
    """The embedded playground is a new upstream in every run: the changefeed the metastore
    kept from the previous run is replaced, not resumed from a checkpoint of another upstream."""
    path = tmp_path / "connectors.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "server": {
                    "metastore": f"sqlite:///{tmp_path}/meta.db",
                    "api-addr": "127.0.0.1:0",
                    "data-dir": str(tmp_path),
                },
                "connectors": [
                    {
                        "name": "shop",
                        "source": {"type": "tikv", "playground": True},
                        "sinks": [{"uri": f"file://{tmp_path}/out?protocol=json"}],
                        "filter": {"rules": ["shop.*"]},
                    }
                ],
            }
        )
    )
    # The control plane's in-process executor: this is about declarations, not Spark.
    run = [CDCFLOW, "run", str(path), "--duration", "8", "--executor", "in-process"]
    first = subprocess.run(run, capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    first_info = asyncio.run(_stored(tmp_path, "shop"))
    line = next(line for line in first.stdout.splitlines() if line.startswith("shop:"))
    checkpoint = int(re.search(r"checkpoint (\d+),", line).group(1))  # type: ignore[union-attr]

    second = subprocess.run(run, capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    assert "shop: its upstream is the embedded playground, new in every run" in second.stderr, second.stderr
    # The new changefeed runs: its maintainer is not taken for the removed one's.
    assert re.search(r"^shop: normal, checkpoint \d+, [1-9]\d* rows in", second.stdout, re.M), second.stdout
    second_info = asyncio.run(_stored(tmp_path, "shop"))
    assert second_info.created_at > first_info.created_at
    assert second_info.start_ts > checkpoint  # "now" of the second run, not the first run's start


async def _stored(tmp: Path, changefeed_id: str):
    record = await _stored_or_none(tmp, changefeed_id)
    assert record is not None
    return record[0]


async def _stored_or_none(tmp: Path, changefeed_id: str):
    from cdcflow.core.control.metastore import open_metastore

    store = open_metastore(f"sqlite:///{tmp}/meta.db")
    try:
        return await store.get_changefeed(changefeed_id)
    finally:
        await store.close()
