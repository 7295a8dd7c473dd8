"""Helpers of the end-to-end tests: a ``cdcflow run`` capture process, the REST API, and
typed comparison of downstream tables with the playground's snapshot.

The typed comparison (what "equal" means across MariaDB, Parquet and the playground) is
:mod:`cdcflow.core.testing.compare`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any, Protocol

import yaml

from cdcflow.core.testing import WaitTimeout, until_sync
from tests.integration.control.cluster import CDCFLOW

CHANGEFEED = "shop-e2e"
#: What ``cdcflow run`` logs once its REST API listens (see :class:`RunProcess`).
_API_LINE = re.compile(r"API on https?://127\.0\.0\.1:(\d+)")
TABLES = ("customers", "products", "orders")


def server_settings(tmp: Path, api_port: int) -> dict[str, Any]:
    """The ``server:`` section of a capture under ``tmp``: SQLite, the REST API on ``api_port``, Spark local[1]."""
    spark_conf = {"spark.sql.shuffle.partitions": 2, "spark.ui.enabled": False}
    return {
        "metastore": f"sqlite:///{tmp}/meta.db",
        "api-addr": f"127.0.0.1:{api_port}",
        "data-dir": str(tmp / "data"),
        "spark": {"master": "local[1]", "warehouse-dir": str(tmp / "lake"), "conf": spark_conf},
    }


def write_connectors(tmp: Path, pd: str, status: str, start_ts: int, mysql_uri: str, api_port: int) -> Path:
    """A connectors file: the tikv source on the playground, MariaDB and Spark tables as sinks."""
    path = tmp / "connectors.yaml"
    server = server_settings(tmp, api_port)
    connector = {
        "name": CHANGEFEED,
        "source": {"type": "tikv", "playground": False, "pd": [pd], "tidb-status": status},
        # A short retry budget so that an outage surfaces as Warning 2001 within seconds.
        "sinks": [{"uri": f"{mysql_uri}?retry-timeout=3"}, {"uri": "spark://"}],
        "filter": {"rules": ["shop.*"]},
        "start-ts": start_ts,
    }
    path.write_text(yaml.safe_dump({"server": server, "connectors": [connector]}))
    return path


class RunProcess:
    """``cdcflow run FILE`` in a process group of its own (so SIGKILL takes every child).

    ``api_port`` 0: the file's ``api-addr`` has port 0, and the port the process took is read
    from its log ("API on …") after each start, so no port is chosen ahead and lost to
    another process meanwhile."""

    def __init__(self, path: Path, api_port: int, log_path: Path) -> None:
        self.path, self.log_path, self.api_port = path, log_path, api_port
        self._api: str | None = f"http://127.0.0.1:{api_port}" if api_port else None
        self._log_from = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def api(self) -> str | None:
        """The REST API's base URL; None until a process started with port 0 logged it."""
        if self._api is None and self.log_path.exists():
            with open(self.log_path, "rb") as log:
                log.seek(self._log_from)
                found = _API_LINE.search(log.read().decode(errors="replace"))
            if found is not None:
                self._api = f"http://127.0.0.1:{found.group(1)}"
        return self._api

    def start(self) -> None:
        if not self.api_port:  # a new process takes a new port
            self._api = None
            self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [CDCFLOW, "--log-level", "info", "run", str(self.path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL the whole process group: no drain, no final checkpoint write."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def changefeed(self) -> dict[str, Any] | None:
        api = self.api
        if api is None:
            return None
        try:
            with urllib.request.urlopen(f"{api}/api/v2/changefeeds/{CHANGEFEED}", timeout=5) as resp:
                result: dict[str, Any] = json.loads(resp.read())
                return result
        except OSError:
            return None

    def wait_for(self, what: str, check: Any, timeout: float) -> dict[str, Any]:
        """Poll the REST API until ``check(changefeed)`` holds; fail at once if the process exits."""

        def holding() -> dict[str, Any] | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"cdcflow run exited {self.proc.returncode}: {self.log_tail()}")
            cf = self.changefeed()
            return cf if cf is not None and check(cf) else None

        try:
            return until_sync(
                holding, timeout=timeout, interval=0.5, message=f"the changefeed: {what}", observe=self.changefeed
            )
        except WaitTimeout as timed_out:
            raise AssertionError(f"{timed_out}; log: {self.log_tail()}") from None

    def wait_checkpoint(self, ts: int, timeout: float) -> int:
        cf = self.wait_for(f"reached checkpoint {ts}", lambda c: c["checkpoint_tso"] >= ts, timeout)
        return int(cf["checkpoint_tso"])

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


# -- what the sinks hold (a test's ``shop`` fixture: ``db`` a MariaDB, ``spark`` and ``lake``) --


class _Downstream(Protocol):
    db: Any
    spark: Any
    lake: Path


def mysql_rows(shop: _Downstream, table: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and rows of ``shop.<table>`` in the MariaDB sink (times in UTC)."""
    import pymysql

    conn = shop.db.connect("shop", cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(f"SELECT * FROM `{table}`")
            return [d[0] for d in cur.description], list(cur.fetchall())
    finally:
        conn.close()


def spark_rows(shop: _Downstream, table: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and rows of the newest snapshot version of ``shop.<table>`` in the Spark sink's lake."""
    from cdcflow.plugins.sinks.spark.snapshot import read_snapshot
    from cdcflow.plugins.sinks.spark.storage import Storage

    spark = shop.spark
    frame = read_snapshot(spark, Storage(spark, str(shop.lake)), str(shop.lake / "shop" / table / "snapshot"))
    assert frame is not None, f"no snapshot version of shop.{table}"
    return list(frame.columns), [row.asDict() for row in frame.collect()]
