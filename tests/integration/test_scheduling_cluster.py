"""Two-phase scheduling across real ``cdcflow server`` processes on a real etcd.

Three captures, one changefeed of 30 tables (one span each): the spans spread
within one of each other; a move-table through the cli completes while rows
keep flowing; SIGKILL of a capture sends its spans to the survivors.
"""

from __future__ import annotations

from collections import Counter

import pytest
import yaml

from tests.etcd_server import EtcdServer
from tests.integration.cluster import Server, cli, env_with_plugin, wait_until

pytestmark = pytest.mark.integration

TABLES = 30


def spans_by_capture(server, cf="cf-sched"):
    """Primaries of the spans, if every span replicates; else None."""
    try:
        items = server.get(f"/api/v2/changefeeds/{cf}/tables")["items"]
    except OSError:
        return None
    if len(items) != TABLES or any(i["state"] != "replicating" for i in items):
        return None
    return {i["table_id"]: i["primary"] for i in items}


def balanced_over(server, captures):
    placed = spans_by_capture(server)
    if placed is None:
        return None
    counts = Counter(placed.values())
    if set(counts) != set(captures) or max(counts.values()) - min(counts.values()) > 1:
        return None
    return placed


def checkpoint(server, cf="cf-sched"):
    return server.get(f"/api/v2/changefeeds/{cf}")["checkpoint_tso"]


def rows_written(tmp):
    return sum(p.stat().st_size for p in (tmp / "out").rglob("*.jsonl"))


def test_thirty_tables_over_three_captures_balance_move_and_failover(tmp_path):
    etcd = EtcdServer(tmp_path)
    env = env_with_plugin(tmp_path / "plugins")
    metastore = f"etcd://{etcd.endpoint}/sched"
    servers = [Server(tmp_path, f"capture-{i}", metastore, env) for i in range(3)]
    try:
        ids = {s.name: s.status()["id"] for s in servers}
        wait_until(lambda: servers[0].get("/api/v2/captures")["total"] == 3, what="three captures")
        config = tmp_path / "cf.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "source": {"type": "ticker", "tables": TABLES, "interval": 0.2},
                    "sinks": [{"type": "file", "path": str(tmp_path / "out"), "protocol": "json"}],
                    "scheduler": {"type": "two-phase"},
                }
            )
        )
        cli(servers[0], env, "changefeed", "create", "-c", "cf-sched", "--config", str(config))

        # Spread within one of each other over the three captures (10 each).
        placed = wait_until(lambda: balanced_over(servers[1], ids.values()), timeout=90, what="balanced spans")
        assert sorted(Counter(placed.values()).values()) == [10, 10, 10]

        # Move a table through the cli of a capture that may not host the maintainer.
        table, source = next(iter(sorted(placed.items())))
        target = next(c for c in ids.values() if c != source)
        before, written = checkpoint(servers[0]), rows_written(tmp_path)
        moved = cli(servers[2], env, "changefeed", "move-table", "-c", "cf-sched",
                    "--table-id", str(table), "--target-capture", target)  # fmt: skip
        assert len(moved["spans"]) == 1
        wait_until(lambda: (spans_by_capture(servers[0]) or {}).get(table) == target, timeout=60, what="moved")
        wait_until(lambda: checkpoint(servers[0]) > before, timeout=60, what="progress after the move")
        wait_until(lambda: rows_written(tmp_path) > written, timeout=30, what="rows after the move")
        listed = cli(servers[1], env, "changefeed", "list-tables", "-c", "cf-sched")
        assert {i["table_id"]: i["primary"] for i in listed["items"]}[table] == target

        # SIGKILL a capture: its spans replicate on the two survivors, balanced again.
        victim = next(s for s in servers if s.status()["is_owner"] is False)
        victim.kill()
        survivors = [s for s in servers if s is not victim]
        alive = [ids[s.name] for s in survivors]
        placed = wait_until(lambda: balanced_over(survivors[0], alive), timeout=120, what="spans on survivors")
        assert sorted(Counter(placed.values()).values()) == [15, 15]
        after = checkpoint(survivors[0])
        wait_until(lambda: checkpoint(survivors[0]) > after, timeout=60, what="progress after SIGKILL")
    finally:
        for s in servers:
            if s.alive:
                s.kill()
        etcd.stop()
