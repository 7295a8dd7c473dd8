"""Two-phase scheduling across real ``cdcflow server`` processes on a real etcd.

Three captures, one changefeed of 30 tables (one span each): the spans spread
within one of each other; a move-table through the cli completes while rows
keep flowing; SIGKILL of a capture sends its spans to the survivors. The
ticker's rows are deterministic (one per table per tick, id and commit ts from
the tick), so at the end every table's output is checked row by row: every row
up to the changefeed's checkpoint is there, duplicates are replays only, and
rows first appear in commit-ts order.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from cdcflow.core.testing import until_sync
from tests.etcd_server import EtcdServer
from tests.integration.control.cluster import REST_POLL, Server, cli, env_with_plugin
from tests.ticker_source import first_tick_after, tick_ts

pytestmark = pytest.mark.integration

TABLES = 30
INTERVAL = 0.2


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


def written_files(table_dir: Path) -> list[Path]:
    """A table's batch files in the order they were written (by mtime; ties by end ts)."""

    def key(path: Path) -> tuple[int, int, str]:
        end_ts = int(path.stem.split("-")[1])
        return path.stat().st_mtime_ns, end_ts, path.name

    return sorted(table_dir.glob("*.jsonl"), key=key)


def check_rows_exact(out: Path, start_ts: int, checkpoint_ts: int) -> int:
    """Assert, per table, no gap up to ``checkpoint_ts``, replays only, commit-ts order.

    Returns how many rows were expected in all (so the caller can see the check had work to do).
    """
    first, last = first_tick_after(start_ts, INTERVAL), first_tick_after(checkpoint_ts, INTERVAL) - 1
    expected = set(range(first, last + 1))
    problems = []
    for i in range(TABLES):
        seen: list[int] = []  # ids in the order they first appear downstream
        known: set[int] = set()
        for path in written_files(out / "db" / f"t{i}"):
            for line in path.read_text().splitlines():
                doc = json.loads(line)
                k = doc["after"]["id"]
                # A duplicate must be the same row (a replay), never a different one under the same id.
                ts = tick_ts(k, INTERVAL)
                row = (doc["table"], doc["op"], doc["commit_ts"], doc["start_ts"])
                assert row == (f"t{i}", "insert", ts, ts - 1), f"{path}: {doc}"
                assert k >= first, f"{path}: row {k} is older than the changefeed's start ts"
                if k not in known:
                    known.add(k)
                    seen.append(k)
        missing = sorted(expected - known)
        if missing:
            problems.append(f"t{i}: {len(missing)} rows missing, first {missing[:5]}")
        if seen != sorted(seen):
            wrong = next(j for j in range(1, len(seen)) if seen[j] < seen[j - 1])
            problems.append(f"t{i}: row {seen[wrong]} first appears after row {seen[wrong - 1]}")
    assert not problems, "\n".join(problems)
    return len(expected) * TABLES


def test_thirty_tables_over_three_captures_balance_move_and_failover(tmp_path):
    etcd = EtcdServer(tmp_path)
    env = env_with_plugin(tmp_path / "plugins")
    metastore = f"etcd://{etcd.endpoint}/sched"
    servers = [Server(tmp_path, f"capture-{i}", metastore, env) for i in range(3)]
    try:
        ids = {s.name: s.status()["id"] for s in servers}
        until_sync(
            lambda: servers[0].get("/api/v2/captures")["total"] == 3, interval=REST_POLL, message="three captures"
        )
        config = tmp_path / "cf.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "source": {"type": "ticker", "tables": TABLES, "interval": INTERVAL, "replay": True},
                    "sinks": [{"type": "file", "path": str(tmp_path / "out"), "protocol": "json"}],
                    "scheduler": {"type": "two-phase"},
                }
            )
        )
        cli(servers[0], env, "changefeed", "create", "-c", "cf-sched", "--config", str(config))
        start_ts = servers[0].get("/api/v2/changefeeds/cf-sched")["start_ts"]

        # Spread within one of each other over the three captures (10 each).
        placed = until_sync(
            lambda: balanced_over(servers[1], ids.values()), timeout=90, interval=REST_POLL, message="balanced spans"
        )
        assert sorted(Counter(placed.values()).values()) == [10, 10, 10]

        # Move a table through the cli of a capture that may not host the maintainer.
        table, source = next(iter(sorted(placed.items())))
        target = next(c for c in ids.values() if c != source)
        before, written = checkpoint(servers[0]), rows_written(tmp_path)
        moved = cli(servers[2], env, "changefeed", "move-table", "-c", "cf-sched",
                    "--table-id", str(table), "--target-capture", target)  # fmt: skip
        assert len(moved["spans"]) == 1
        until_sync(
            lambda: (spans_by_capture(servers[0]) or {}).get(table) == target,
            timeout=60,
            interval=REST_POLL,
            message="moved",
        )
        until_sync(
            lambda: checkpoint(servers[0]) > before, timeout=60, interval=REST_POLL, message="progress after the move"
        )
        until_sync(
            lambda: rows_written(tmp_path) > written, timeout=30, interval=REST_POLL, message="rows after the move"
        )
        listed = cli(servers[1], env, "changefeed", "list-tables", "-c", "cf-sched")
        assert {i["table_id"]: i["primary"] for i in listed["items"]}[table] == target

        # SIGKILL a capture: its spans replicate on the two survivors, balanced again.
        victim = next(s for s in servers if s.status()["is_owner"] is False)
        victim.kill()
        survivors = [s for s in servers if s is not victim]
        alive = [ids[s.name] for s in survivors]
        placed = until_sync(
            lambda: balanced_over(survivors[0], alive), timeout=120, interval=REST_POLL, message="spans on survivors"
        )
        assert sorted(Counter(placed.values()).values()) == [15, 15]
        after = checkpoint(survivors[0])
        until_sync(
            lambda: checkpoint(survivors[0]) > after, timeout=60, interval=REST_POLL, message="progress after SIGKILL"
        )

        # Stop, then check the downstream row by row up to the final checkpoint.
        final = checkpoint(survivors[0])
        for s in survivors:
            s.terminate()
        assert check_rows_exact(tmp_path / "out", start_ts, final) > TABLES * 10
    finally:
        for s in servers:
            if s.alive:
                s.kill()
        etcd.stop()
