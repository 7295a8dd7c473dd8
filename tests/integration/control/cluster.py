"""Helpers to run real ``cdcflow server`` processes in tests, with the ticker
test source installed as a third-party plugin (an entry point on PYTHONPATH)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from cdcflow.core.testing import until_sync
from tests import REPO

CDCFLOW = str(Path(sys.executable).parent / "cdcflow")
EXECUTOR = "in-process"  # the test kit's executor, registered through cdcflow_register_executors
REST_POLL = 0.1  # seconds between two looks at a server (its log, its REST API)


def plugin_path(tmp: Path) -> str:
    """A directory that makes ``tests.ticker_source`` an installed cdcflow plugin."""
    dist = tmp / "cdcflow_test_ticker-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cdcflow-test-ticker\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cdcflow]\nticker = tests.ticker_source\n")
    return f"{tmp}{os.pathsep}{REPO}"


def env_with_plugin(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = plugin_path(tmp)
    return env


class Server:
    """One ``cdcflow server`` process."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        metastore: str,
        env: dict[str, str],
        session_ttl: float = 3.0,
        extra: tuple[str, ...] = (),
    ) -> None:
        """``extra``: more ``cdcflow server`` options (e.g. ``--config FILE`` for its security settings)."""
        self.name = name
        self.log_path = tmp / f"{name}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [
                CDCFLOW, "--log-level", "info", "server",
                "--metastore", metastore, "--addr", "127.0.0.1:0",
                "--session-ttl", str(session_ttl), "--executor", EXECUTOR,
                "--data-dir", str(tmp / name), *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp,
        )  # fmt: skip
        self.api = self._wait_for_api()

    def _wait_for_api(self) -> str:
        def address() -> str | None:
            match = re.search(r"API on (http://[0-9.:]+)", self.log_path.read_text(errors="replace"))
            if match:
                return match.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log_path.read_text()}")
            return None

        return until_sync(
            address,
            timeout=60,
            interval=REST_POLL,
            message=f"{self.name} to start",
            observe=lambda: self.log_path.read_text(errors="replace"),
        )

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.api + path, timeout=5) as resp:
            return json.loads(resp.read())

    def status(self) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = self.get("/api/v2/status")
        except OSError:
            return None
        return result

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.wait()

    def terminate(self) -> int:
        self.proc.terminate()
        return self.wait()

    def wait(self) -> int:
        try:
            code = self.proc.wait(30)
        finally:
            self.log.close()
        return code

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def cli(server: Server, env: dict[str, str], *argv: str) -> Any:
    result = subprocess.run(
        [CDCFLOW, "cli", "--server", server.api, "--json", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"cdcflow cli {' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return json.loads(result.stdout)
