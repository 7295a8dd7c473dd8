"""Tables created while a changefeed runs on three real ``cdcflow server`` processes (etcd).

The ticker source starts with three tables and creates three more at chosen timestamps; one
capture is SIGKILLed after the last creation. The maintainer, the table-trigger span and the
new tables' spans land on different captures, so the changefeed barrier crosses processes
(gRPC) and a CREATE TABLE written by one capture must precede the rows another capture writes.
At the end, per table: its CREATE TABLE reached the sink before any of its rows, and every row
committed after it (or after the changefeed's start) up to the final checkpoint is there.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from cdcflow.core.data.events import tso_from_ms, tso_physical_ms
from cdcflow.core.testing import until_sync
from tests.etcd_server import EtcdServer
from tests.integration.control.cluster import REST_POLL, Server, cli, env_with_plugin
from tests.ticker_source import create_query, first_tick_after

pytestmark = pytest.mark.integration

INTERVAL = 0.2
EXISTING = 3
CREATED = (3, 4, 5)  # table indexes created while the changefeed runs
CF = "cf-new-tables"


def checkpoint(server: Server) -> int:
    return int(server.get(f"/api/v2/changefeeds/{CF}")["checkpoint_tso"])


def replicating_tables(server: Server) -> set[int]:
    try:
        items = server.get(f"/api/v2/changefeeds/{CF}/tables")["items"]
    except OSError:
        return set()
    return {i["table_id"] for i in items if i["state"] == "replicating"}


def check_table(folder: Path, first_row_ts: int, final: int) -> int:
    """Every row above ``first_row_ts`` up to ``final`` is in ``folder``, none below; returns how many."""
    ids: set[int] = set()
    for path in folder.glob("0*.jsonl"):
        ids |= {json.loads(line)["after"]["id"] for line in path.read_text().splitlines()}
    want = set(range(first_tick_after(first_row_ts, INTERVAL), first_tick_after(final, INTERVAL)))
    assert want <= ids, f"{folder.name}: {len(want - ids)} rows missing, first {sorted(want - ids)[:5]}"
    assert min(ids) >= min(want), f"{folder.name}: a row older than its table"
    return len(want)


def test_tables_created_while_running_on_three_captures(tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path)
    env = env_with_plugin(tmp_path / "plugins")
    servers = [Server(tmp_path, f"capture-{i}", f"etcd://{etcd.endpoint}/new-tables", env) for i in range(3)]
    try:
        until_sync(
            lambda: servers[0].get("/api/v2/captures")["total"] == 3, interval=REST_POLL, message="three captures"
        )
        now_ms = int(time.time() * 1000)
        created = {i: tso_from_ms(now_ms + 6000 + 3000 * n) for n, i in enumerate(CREATED)}
        source = {"type": "ticker", "tables": EXISTING, "interval": INTERVAL, "replay": True, "created": created}
        config = tmp_path / "cf.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "source": source,
                    "sinks": [{"type": "file", "path": str(tmp_path / "out"), "protocol": "json"}],
                    "scheduler": {"type": "two-phase"},
                }
            )
        )
        cli(servers[0], env, "changefeed", "create", "-c", CF, "--config", str(config))
        start_ts = int(servers[0].get(f"/api/v2/changefeeds/{CF}")["start_ts"])
        assert start_ts < min(created.values()), "the changefeed must start before the tables are created"

        every = {i + 1 for i in range(EXISTING + len(CREATED))}  # the ticker's table ids
        last = max(created.values())
        until_sync(
            lambda: replicating_tables(servers[1]) >= every,
            timeout=120,
            interval=REST_POLL,
            message="every table replicating",
        )
        until_sync(
            lambda: checkpoint(servers[1]) > last,
            timeout=120,
            interval=REST_POLL,
            message="checkpoint past the last CREATE",
        )

        victim = next(s for s in servers if s.status()["is_owner"] is False)
        victim.kill()
        survivors = [s for s in servers if s is not victim]
        after = checkpoint(survivors[0])
        target = tso_from_ms(tso_physical_ms(after) + 2000)
        until_sync(
            lambda: checkpoint(survivors[0]) > target, timeout=120, interval=REST_POLL, message="progress after SIGKILL"
        )
        final = checkpoint(survivors[0])
        for s in survivors:
            s.terminate()
    finally:
        for s in servers:
            if s.alive:
                s.kill()
        etcd.stop()

    out = tmp_path / "out" / "db"
    rows = 0
    for i in range(EXISTING):
        rows += check_table(out / f"t{i}", start_ts, final)
        assert not list((out / f"t{i}").glob("ddl-*"))
    for i, ts in created.items():
        folder = out / f"t{i}"
        ddl = folder / f"ddl-{ts}.jsonl"
        assert json.loads(ddl.read_text())["query"] == create_query(i)
        written = [p.stat().st_mtime_ns for p in folder.glob("0*.jsonl")]
        assert written and ddl.stat().st_mtime_ns <= min(written), f"t{i}: rows written before its CREATE TABLE"
        rows += check_table(folder, ts, final)
    assert rows > 6 * 10
