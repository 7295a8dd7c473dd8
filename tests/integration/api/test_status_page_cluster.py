"""The status page's document on a cluster: two ``cdcflow server`` processes on etcd, the
overview asked of the capture that is not the owner (forwarded to the owner), the spans of
both captures, and rows flushed on both added up."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from cdcflow.core.testing import until_sync
from tests.etcd_server import EtcdServer
from tests.integration.control.cluster import REST_POLL, Server, cli, env_with_plugin

pytestmark = pytest.mark.integration

TABLES = 4


def test_any_capture_answers_with_the_owners_view_of_the_whole_cluster(tmp_path):
    etcd = EtcdServer(tmp_path)
    env = env_with_plugin(tmp_path / "plugins")
    servers = [Server(tmp_path, f"capture-{i}", f"etcd://{etcd.endpoint}/status", env) for i in range(2)]
    try:
        ids = [s.status()["id"] for s in servers]  # type: ignore[index]
        until_sync(lambda: servers[0].get("/api/v2/captures")["total"] == 2, interval=REST_POLL, message="two captures")

        def owner_of() -> str | None:
            return next((c["id"] for c in servers[0].get("/api/v2/captures")["items"] if c["is_owner"]), None)

        owner_id = until_sync(owner_of, interval=REST_POLL, message="an owner")
        other = servers[ids.index(next(i for i in ids if i != owner_id))]
        owner = servers[ids.index(owner_id)]
        config = tmp_path / "cf.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "source": {"type": "ticker", "tables": TABLES, "interval": 0.05},
                    "sinks": [{"type": "file", "path": str(tmp_path / "out"), "protocol": "json"}],
                    "scheduler": {"type": "two-phase"},
                }
            )
        )
        cli(other, env, "changefeed", "create", "-c", "spread", "--config", str(config))

        def spread() -> dict[str, Any] | None:
            doc: dict[str, Any] = other.get("/api/v2/status/overview")
            on = {c["id"]: [s for s in c["spans"] if s["role"] == "primary"] for c in doc["captures"]}
            return doc if sorted(len(v) for v in on.values()) == [TABLES // 2, TABLES // 2] else None

        doc = until_sync(spread, timeout=90, interval=REST_POLL, message="the spans spread over both captures")
        assert doc["served_by"] == owner_id and doc["owner"] == owner_id  # the non-owner forwarded
        tables = sorted(s["table_id"] for c in doc["captures"] for s in c["spans"] if s["role"] == "primary")
        assert tables == list(range(1, TABLES + 1))
        assert {c["id"] for c in doc["captures"]} == set(ids)

        def flushed_on_both() -> list[int] | None:
            rows = [s.get("/api/v2/status/local")["flushed"].get("spread", {}).get("rows", 0) for s in servers]
            return rows if all(rows) else None

        local = until_sync(flushed_on_both, timeout=60, interval=REST_POLL, message="rows flushed on both captures")
        # Counters only grow: the owner's total, read after, is at least what both had.
        [cf] = owner.get("/api/v2/status/overview")["changefeeds"]
        assert cf["rows_flushed"] >= sum(local) > max(local)
    finally:
        for s in servers:
            s.terminate()
        etcd.stop()
