"""A ``cdcflow server`` (SQLite, the Spark executor on ``local[1]``, ``reclaim-interval: 1s``)
reclaims the files of removed changefeeds from its data directory: one left from before it
started goes at once; a paused changefeed's files stay through sweeps; once the changefeed is
removed (``cli changefeed remove``), its files go, with one log line saying how many bytes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cdcflow.core.data.pipeline.files import changefeed_dir, claim_changefeed_dir
from cdcflow.core.testing import until_sync
from cdcflow.plugins.sources.playground import Playground
from tests.integration.control.cluster import REST_POLL, Server, cli, env_with_plugin

pytestmark = pytest.mark.integration

CF = "cf-reclaim"
STARTED = 240.0  # Spark's start on a loaded machine, then the first batch
SWEPT = 60.0


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=1, seed=3, ddl_every=0) as playground:
        yield playground


def _stale(data: Path, cf: str) -> Path:
    """The files a capture kept of a changefeed that no longer exists."""
    directory = changefeed_dir(data, cf)
    claim_changefeed_dir(directory, cf, 1.0)
    (directory / "store").mkdir()
    (directory / "store" / "chunk-0.arrow").write_bytes(b"x" * 2048)
    return directory


def test_a_removed_changefeeds_files_go_and_a_paused_ones_stay(pg: Playground, tmp_path: Path) -> None:
    env = env_with_plugin(tmp_path / "plugins")
    data = tmp_path / "capture"  # the server's --data-dir
    before = _stale(data, "gone-before-start")
    settings = tmp_path / "server.yaml"
    spark = {"master": "local[1]", "conf": {"spark.sql.shuffle.partitions": 2, "spark.ui.enabled": False}}
    settings.write_text(yaml.safe_dump({"server": {"spark": spark, "reclaim-interval": "1s"}}))
    extra = ("--executor", "spark", "--config", str(settings))
    server = Server(tmp_path, "capture", f"sqlite:///{tmp_path}/meta.db", env, extra=extra)

    def log() -> str:
        return server.log_path.read_text(errors="replace")

    def tail() -> str:
        return log()[-3000:]

    try:
        until_sync(lambda: not before.exists(), timeout=SWEPT, interval=REST_POLL,
                   message="the files kept from before the start reclaimed", observe=tail)  # fmt: skip
        config = tmp_path / "cf.yaml"
        source = {"type": "tikv", "playground": False, "pd": [pg.pd_address], "tidb-status": pg.status_address}
        sinks = [{"type": "file", "path": str(tmp_path / "out"), "protocol": "json"}]
        config.write_text(yaml.safe_dump({"source": source, "sinks": sinks, "filter": {"rules": ["shop.*"]}}))
        cli(server, env, "changefeed", "create", "-c", CF, "--config", str(config))
        mine = changefeed_dir(data, CF)
        until_sync((mine / "spark-checkpoint").exists, timeout=STARTED, interval=REST_POLL,
                   message="the changefeed's pipeline files", observe=tail)  # fmt: skip

        cli(server, env, "changefeed", "pause", "-c", CF)
        closed = f"changefeed {CF}: its executor on capture"
        until_sync(lambda: closed in log(), timeout=SWEPT, interval=REST_POLL,
                   message="the paused changefeed's executor closed", observe=tail)  # fmt: skip
        # A sweep runs after the executor closed (it reclaims this one): the paused changefeed's files stay.
        during = _stale(data, "gone-while-paused")
        until_sync(lambda: not during.exists(), timeout=SWEPT, interval=REST_POLL,
                   message="a sweep after the pause", observe=tail)  # fmt: skip
        assert (mine / "store").is_dir() and (mine / "spark-checkpoint").is_dir()
        assert cli(server, env, "changefeed", "query", "-c", CF)["state"] == "paused"

        cli(server, env, "changefeed", "remove", "-c", CF)
        # The directory is moved aside first, then deleted, then the line is logged.
        reclaimed = f"reclaimed the files of removed changefeed {CF}:"
        until_sync(lambda: reclaimed in log(), timeout=SWEPT, interval=REST_POLL,
                   message="the removed changefeed's files reclaimed", observe=tail)  # fmt: skip
        assert not mine.exists()
        [line] = [x for x in log().splitlines() if reclaimed in x]
        freed = re.search(r"\((\d+) bytes freed\)", line)
        assert str(mine) in line and freed is not None and int(freed.group(1)) > 0, line
        for name in ("gone-before-start", "gone-while-paused"):
            assert f"changefeed {name}: " in log(), name
        assert server.alive
    finally:
        server.terminate()
