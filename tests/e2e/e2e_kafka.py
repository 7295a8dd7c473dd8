"""End-to-end harness: a playground upstream and a Kafka mock cluster in this process,
``cdcflow run FILE`` as a separate capture process between them.

The capture reads the playground over its real protocols (PD and TiKV gRPC, the TiDB
status API) through the ``tikv`` source, runs the Spark pipeline (the control plane's
default executor factory) and produces Open Protocol to the mock cluster's bootstrap
address as to any Kafka cluster. Progress is read from the capture's SQLite metastore
(the checkpoint the coordinator persisted), never from the capture's own output.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cdcflow.core.control.metastore import open_metastore
from cdcflow.core.testing.open_protocol import Replica, column_value, decode, read_topic, rebuild
from cdcflow.core.testing.waiting import until_resolved
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground._keys import encode_key
from cdcflow.plugins.sources.tikv.tidb import keys

CDCFLOW = str(Path(sys.executable).parent / "cdcflow")
TABLES = ("customers", "products", "orders")
CHANGEFEED = "shop-to-kafka"


class CaptureProcess:
    """``cdcflow run`` on a connectors file reading ``pg`` and writing ``topic`` at ``bootstrap``."""

    def __init__(
        self,
        tmp: Path,
        pg: Playground,
        bootstrap: str,
        topic: str,
        start_ts: int,
        *,
        memory_quota: str = "1GiB",
        partitions: int = 3,
        adds_per_tick: int = 1,
        master: str = "local[2]",
        metrics: bool = True,
        spark_conf: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.metastore = f"sqlite:///{tmp}/meta.db"
        self.log = tmp / "capture.log"
        self.file = tmp / "connectors.yaml"
        self.proc: subprocess.Popen[bytes] | None = None
        connector = {
            "name": CHANGEFEED,
            "source": {"type": "tikv", "pd": [pg.pd_address], "tidb-status": pg.status_address},
            # lz4: the mock cluster keeps only the last few MiB of each partition.
            "sinks": [
                {"uri": f"kafka://{bootstrap}/{topic}?partition-num={partitions}&max-batch-size=16&compression=lz4"}
            ],
            # 1: one span added per tick, so tables join a pipeline that is already running
            # (as when tables move between captures); 0: all spans at once.
            "scheduler": {"type": "two-phase", "max-adds-per-tick": adds_per_tick},
            "filter": {"rules": ["shop.*"]},
            "start-ts": start_ts,
            "memory-quota": memory_quota,
        }
        server = {
            "metastore": self.metastore,
            "api-addr": "127.0.0.1:0",
            "data-dir": str(tmp / "data"),
            "spark": {
                "master": master,
                "warehouse-dir": str(tmp / "lake"),
                "trigger-interval": 0.3,
                "conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", **(spark_conf or {})},
            },
            "metrics": metrics,
        }
        self.file.write_text(yaml.safe_dump({"server": server, "connectors": [connector]}))

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [CDCFLOW, "run", str(self.file)],
                cwd=self.tmp,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the JVM and the Python workers join its process group
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: no drain, no final checkpoint write."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)
            self.proc = None

    def stop(self) -> None:
        """Ctrl-C: drain and exit (SIGKILL if it does not within a minute)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        self.kill()

    def checkpoint(self) -> tuple[str, int]:
        """(state, checkpoint ts) of the changefeed as the metastore holds it; ("", 0) before it exists."""
        return asyncio.run(_read_checkpoint(self.metastore))

    def wait_checkpoint(self, ts: int, timeout: float = 240.0) -> int:
        """Block until the persisted checkpoint reaches ``ts``; fail with the capture's log otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            state, checkpoint = self.checkpoint()
            if checkpoint >= ts:
                return checkpoint
            if not self.alive() or time.monotonic() > deadline or state in ("failed", "error"):
                raise AssertionError(
                    f"checkpoint {checkpoint} ({state}) did not reach {ts}; capture log:\n{self.log_tail()}"
                )
            time.sleep(0.25)

    def api_address(self, timeout: float = 120.0) -> str:
        """host:port of the capture's REST API (it listens on a port the OS picked)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            captures = asyncio.run(_read_captures(self.metastore))
            if captures:
                return captures[0]
            time.sleep(0.25)
        raise AssertionError(f"the capture did not register; capture log:\n{self.log_tail()}")

    def log_tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


async def _read_checkpoint(url: str) -> tuple[str, int]:
    if not Path(url.removeprefix("sqlite:///")).exists():
        return "", 0
    store = open_metastore(url)
    try:
        for info, status in await store.list_changefeeds():
            if info.id == CHANGEFEED:
                return info.state.value, status.checkpoint_ts
        return "", 0
    finally:
        await store.close()


async def _read_captures(url: str) -> list[str]:
    if not Path(url.removeprefix("sqlite:///")).exists():
        return []
    store = open_metastore(url)
    try:
        return [c.api_addr for c in await store.list_captures()]
    finally:
        await store.close()


def record_key(pg: Playground, table: str, handle: int) -> bytes:
    """The raw TiDB record key ``t{table_id}_r{handle}``."""
    return keys.record_key(pg.table_id(table), handle)


def region_of(pg: Playground, raw_key: bytes) -> int:
    return pg.cluster.regions.locate(encode_key(raw_key)).id


def replicate(bootstrap: str, topic: str, at_least: int = 0) -> Replica:
    """The topic rebuilt by the consumer recipe; with ``at_least``, read again (up to a minute)
    until it is resolved to that ts: resolved events trail the persisted checkpoint."""

    def read() -> Replica:
        partitions = read_topic(bootstrap, topic)
        replica = rebuild(partitions)
        replica.raw = partitions  # type: ignore[attr-defined]  # kept to explain a mismatch
        return replica

    return until_resolved(read, at_least)


def produced_late(replica: Replica, table: str, ids: list[Any]) -> str:
    """Of ``ids`` missing from the replica: how many the topic carries at all, and how many
    of those arrived below their partition's resolved ts (dropped by the recipe as replays)."""
    carried, below, wanted = set(), set(), set(ids)
    for messages in getattr(replica, "raw", {}).values():
        resolved = 0
        for key, value in messages:
            for k, v in decode(key, value):
                if k["t"] == 3:
                    resolved = max(resolved, k["ts"])
                elif k["t"] == 1 and k.get("tbl") == table and v is not None:
                    image = v.get("u") or v.get("d") or {}
                    ident = column_value(image["id"]) if "id" in image else None
                    if ident in wanted:
                        carried.add(ident)
                        if k["ts"] <= resolved:
                            below.add(ident)
    return f"{len(carried)} of {len(ids)} are in the topic, {len(below)} of them below an earlier resolved event"


def table_rows(replica: Replica, table: str) -> dict[Any, dict[str, Any]]:
    return {key[0]: row for key, row in replica.tables.get(("shop", table), {}).items()}


def assert_equals_snapshot(pg: Playground, replica: Replica) -> dict[str, int]:
    """Every row of every shop table, rebuilt from Kafka, equals the playground at the replica's resolved ts."""
    counts = {}
    for table in TABLES:
        want = {row["id"]: row for row in pg.snapshot(table, replica.resolved_ts)}
        got = table_rows(replica, table)
        missing_all = sorted(set(want) - set(got))
        missing = missing_all[:10]
        extra = sorted(set(got) - set(want))[:10]
        differ = [k for k in want if k in got and got[k] != want[k]][:3]
        assert got == want, (
            f"shop.{table} at {replica.resolved_ts}: {len(got)} rows replicated, {len(want)} upstream; "
            f"missing ids {missing} ({produced_late(replica, table, missing_all)}), extra ids {extra}, "
            f"differing {[(got[k], want[k]) for k in differ]}"
        )
        counts[table] = len(want)
    return counts
