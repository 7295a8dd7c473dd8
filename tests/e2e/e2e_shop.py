"""Helpers of the end-to-end tests: a ``cdcflow run`` capture process, the REST API, and
typed comparison of downstream tables with the playground's snapshot.

Normalisation (what "equal" means across MariaDB, Parquet and the playground):

- DECIMAL: compared as numbers at the column's scale (Spark stores ``decimal(38,10)``).
- DATETIME / TIMESTAMP: naive UTC datetimes (the playground decodes TIMESTAMP as aware UTC;
  MariaDB and Spark sessions run in UTC and return naive values).
- TIME: a ``timedelta`` (the Spark sink stores TIME as its ``str(timedelta)`` text).
- ENUM: the member name (TiDB rows and the Spark sink carry the 1-based index).
- JSON: the parsed document (MariaDB returns the text; key order and spacing are free).
- Everything else (ints, unsigned ints, DOUBLE, VARCHAR, NULL) must be identical.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import re
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from cdcflow.core.testing import WaitTimeout, until_sync
from tests.integration.control.cluster import CDCFLOW

CHANGEFEED = "shop-e2e"
TABLES = ("customers", "products", "orders")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    """``cdcflow run FILE`` in a process group of its own (so SIGKILL takes every child)."""

    def __init__(self, path: Path, api_port: int, log_path: Path) -> None:
        self.path, self.api, self.log_path = path, f"http://127.0.0.1:{api_port}", log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
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
        try:
            with urllib.request.urlopen(f"{self.api}/api/v2/changefeeds/{CHANGEFEED}", timeout=5) as resp:
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


# -- typed comparison ---------------------------------------------------------------------------


def _time(value: Any) -> dt.timedelta:
    if isinstance(value, dt.timedelta):
        return value
    match = re.fullmatch(r"(-)?(?:(\d+) days?, )?(\d+):(\d\d):(\d\d)(?:\.(\d+))?", str(value))
    assert match, f"not a TIME value: {value!r}"
    sign, days, h, m, s, frac = match.groups()
    delta = dt.timedelta(
        days=int(days or 0), hours=int(h), minutes=int(m), seconds=int(s), microseconds=int((frac or "0").ljust(6, "0"))
    )
    return -delta if sign else delta


def normalise(value: Any, ft: Any) -> Any:
    """``value`` of a column of TiDB type ``ft`` in the comparable form documented above."""
    from cdcflow.core.data.types import TypeCode

    if value is None:
        return None
    tp = TypeCode(ft.tp)
    if tp == TypeCode.NEWDECIMAL:
        return decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-max(ft.decimal, 0)))
    if tp in (TypeCode.DATETIME, TypeCode.TIMESTAMP):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value
    if tp == TypeCode.DURATION:
        return _time(value)
    if tp == TypeCode.ENUM:
        if isinstance(value, int) or str(value).isdigit():
            return ft.elems[int(value) - 1]
        return value
    if tp == TypeCode.JSON:
        return json.loads(value) if isinstance(value, str | bytes) else value
    return value


def typed_rows(rows: list[dict[str, Any]], types: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    """Rows keyed by ``id``, every column normalised by its type."""
    return {row["id"]: {c: normalise(row.get(c), ft) for c, ft in types.items()} for row in rows}


def diff(want: dict[Any, dict[str, Any]], got: dict[Any, dict[str, Any]], limit: int = 5) -> str:
    """A short description of how ``got`` differs from ``want`` (empty when equal)."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    changed = [k for k in sorted(set(want) & set(got)) if want[k] != got[k]]
    if not (missing or extra or changed):
        return ""
    counts = f"{len(missing)} missing, {len(extra)} extra, {len(changed)} differ"
    lines = [f"{len(want)} rows wanted, {len(got)} got: {counts}"]
    lines += [f"missing {k}: {want[k]}" for k in missing[:limit]]
    lines += [f"extra {k}: {got[k]}" for k in extra[:limit]]
    lines += [f"differs {k}: want {want[k]} got {got[k]}" for k in changed[:limit]]
    return "\n".join(lines)
