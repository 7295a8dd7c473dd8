"""High availability with real ``cdcflow server`` processes.

On one real etcd, three captures: SIGKILL the owner → another capture becomes
owner (the failover time is printed), changefeeds keep their state and every
acknowledged checkpoint, and no two captures ever say they are the owner at
once; SIGKILL a non-owner → its maintainers and spans move. On SQLite, one
capture runs the same lifecycle and survives a SIGKILL and restart.
"""

from __future__ import annotations

import threading
import time

import pytest
import yaml

from cdcflow.core.testing import until_sync
from tests.etcd_server import EtcdServer
from tests.integration.control.cluster import REST_POLL, Server, cli, env_with_plugin

pytestmark = pytest.mark.integration


def changefeed_config(tmp, name):
    path = tmp / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "source": {"type": "ticker", "tables": 3},
                "sinks": [{"type": "file", "path": str(tmp / "out" / name), "protocol": "json"}],
            }
        )
    )
    return str(path)


def output_files(tmp, name):
    return len(list((tmp / "out" / name).rglob("*.jsonl")))


def output_settled(tmp, name, quiet):
    """A poll: the number of output files of ``name`` once it has not changed for ``quiet``
    seconds, else None."""
    seen = {"files": -1, "since": 0.0}

    def poll():
        files, now = output_files(tmp, name), time.monotonic()
        if files != seen["files"]:
            seen.update(files=files, since=now)
            return None
        return files if now - seen["since"] >= quiet else None

    return poll


def checkpoints(server):
    return {i["id"]: (i["state"], i["checkpoint_tso"]) for i in server.get("/api/v2/changefeeds?state=all")["items"]}


def all_advanced(server, than):
    now = checkpoints(server)
    return all(now[cf][1] > ts for cf, (_, ts) in than.items())


class OwnerWatch:
    """Polls every live server's status; records the owners seen in each round."""

    def __init__(self, servers):
        self.servers = servers
        self.rounds: list[list[str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            owners = [
                s.name
                for s in list(self.servers)
                if s.alive and (st := s.status()) is not None and st["is_owner"] and s.alive
            ]
            self.rounds.append(owners)
            time.sleep(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join(10)


def owner_of(servers):
    for s in servers:
        st = s.status() if s.alive else None
        if st is not None and st["is_owner"]:
            return s
    return None


def test_three_captures_on_etcd_survive_sigkill(tmp_path):
    etcd = EtcdServer(tmp_path)
    env = env_with_plugin(tmp_path / "plugins")
    metastore = f"etcd://{etcd.endpoint}/ha"
    servers = [Server(tmp_path, f"capture-{i}", metastore, env) for i in range(3)]
    watch = OwnerWatch(servers)
    try:
        first = until_sync(lambda: owner_of(servers), interval=REST_POLL, message="an owner")
        until_sync(lambda: first.get("/api/v2/captures")["total"] == 3, interval=REST_POLL, message="three captures")
        for i in range(4):
            created = cli(servers[i % 3], env, "changefeed", "create", "-c", f"cf-{i}", "--config",
                          changefeed_config(tmp_path, f"cf-{i}"))  # fmt: skip
            assert created["state"] == "normal"
        start = checkpoints(first)
        until_sync(lambda: all_advanced(first, start), interval=REST_POLL, message="checkpoints advancing")

        # a pause stops the changefeed's spans on every capture: its sink output stops growing
        # (each capture closes its spans once the pause reaches it: on a loaded machine, the
        # last one a second or two after the others)
        cli(servers[1], env, "changefeed", "pause", "-c", "cf-1")
        written = until_sync(
            output_settled(tmp_path, "cf-1", quiet=1.5), interval=0.25, message="cf-1's output to stop after the pause"
        )
        time.sleep(2)
        assert output_files(tmp_path, "cf-1") == written
        cli(servers[2], env, "changefeed", "resume", "-c", "cf-1")
        until_sync(lambda: output_files(tmp_path, "cf-1") > written, interval=REST_POLL, message="output after resume")

        # SIGKILL the owner: another capture takes over, nothing acknowledged is lost.
        acknowledged = checkpoints(first)
        killed_at = time.monotonic()
        first.kill()
        survivors = [s for s in servers if s is not first]
        second = until_sync(lambda: owner_of(survivors), timeout=60, interval=REST_POLL, message="a new owner")
        failover = time.monotonic() - killed_at
        print(f"\nowner failover after SIGKILL: {failover:.2f}s (session TTL 3s)")
        after = checkpoints(second)
        assert set(after) == set(acknowledged)
        for cf, (state, ts) in acknowledged.items():
            assert after[cf][0] == state and after[cf][1] >= ts
        until_sync(
            lambda: all_advanced(second, after), timeout=60, interval=REST_POLL, message="progress after owner failover"
        )
        until_sync(
            lambda: second.get("/api/v2/captures")["total"] == 2, interval=REST_POLL, message="dead capture gone"
        )

        # SIGKILL the non-owner: its maintainers and spans move to the owner.
        other = next(s for s in survivors if s is not second)
        before = checkpoints(second)
        other.kill()
        until_sync(
            lambda: second.get("/api/v2/captures")["total"] == 1, timeout=30, interval=REST_POLL, message="capture gone"
        )
        until_sync(
            lambda: all_advanced(second, before),
            timeout=60,
            interval=REST_POLL,
            message="progress after non-owner loss",
        )

        # lifecycle through the cli still works on the survivor
        cli(second, env, "changefeed", "pause", "-c", "cf-0")
        assert cli(second, env, "changefeed", "query", "-c", "cf-0")["state"] == "paused"
        cli(second, env, "changefeed", "resume", "-c", "cf-0")
        cli(second, env, "changefeed", "remove", "-c", "cf-3")
        listed = cli(second, env, "changefeed", "list")
        assert sorted(i["id"] for i in listed["items"]) == ["cf-0", "cf-1", "cf-2"]
        assert second.terminate() == 0  # graceful drain
    finally:
        watch.stop()
        for s in servers:
            if s.alive:
                s.kill()
        etcd.stop()
    assert all(len(owners) <= 1 for owners in watch.rounds), "two captures acted as owner at once"


def test_one_capture_on_sqlite_lifecycle_and_restart(tmp_path):
    env = env_with_plugin(tmp_path / "plugins")
    metastore = f"sqlite:///{tmp_path}/meta.db"
    server = Server(tmp_path, "capture", metastore, env)
    try:
        until_sync(lambda: owner_of([server]), interval=REST_POLL, message="owner")
        cli(server, env, "changefeed", "create", "-c", "cf-a", "--config", changefeed_config(tmp_path, "cf-a"))
        start = checkpoints(server)
        until_sync(lambda: all_advanced(server, start), interval=REST_POLL, message="progress")
        acknowledged = checkpoints(server)
        server.kill()
        server = Server(tmp_path, "capture-restarted", metastore, env)
        # the dead capture's session must expire before the new one can own the store
        until_sync(lambda: owner_of([server]), timeout=30, interval=REST_POLL, message="owner after restart")
        after = checkpoints(server)
        assert after["cf-a"][0] == "normal" and after["cf-a"][1] >= acknowledged["cf-a"][1]
        until_sync(
            lambda: all_advanced(server, after), timeout=30, interval=REST_POLL, message="progress after restart"
        )
        captures = cli(server, env, "capture", "list")
        assert captures["total"] == 1 and captures["items"][0]["is_owner"]
        assert server.terminate() == 0
    finally:
        if server.alive:
            server.kill()
