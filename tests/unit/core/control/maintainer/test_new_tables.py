"""Tables created while a changefeed runs, through a real maintainer, span agent and in-process
executor (the ticker source creates ``db.t1`` at a chosen ts; the file sink receives the batches):
a changefeed whose filter matches no table yet advances on its table-trigger span, and the new
table's span is added at the CREATE TABLE's commit ts, with the checkpoint held there until then."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.control.maintainer.maintainer import Maintainer
from cdcflow.core.control.maintainer.manager import MaintainerManager
from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.messages import AddMaintainerRequest, CoordinatorBootstrapRequest, Topic
from cdcflow.core.control.scheduling import ReplicationState
from cdcflow.core.control.span_host import SpanHost
from cdcflow.core.data.events import Span, tso_from_ms, tso_physical_ms
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until
from cdcflow.core.testing.inprocess import executor_factory
from tests import ticker_source
from tests.ticker_source import TRIGGER, create_query, first_tick_after, tick_ts

INTERVAL = 0.05
T1 = Span(2, b"t2", b"t2~")  # the ticker's span of table db.t1


def plugins() -> PluginManager:
    pm = PluginManager.default(autoload=False)
    pm.register(sys.modules[ticker_source.__name__])
    return pm


def now_ts() -> int:
    return tso_from_ms(int(time.time() * 1000))


def later(ts: int, seconds: float) -> int:
    return tso_from_ms(tso_physical_ms(ts) + int(seconds * 1000))


class Capture:
    """One capture's maintainer manager and span agent on an in-process message center."""

    def __init__(self, tmp: Path) -> None:
        self.pm = plugins()
        self.center = MessageCenter("c1")
        self.host = SpanHost("c1", self.center, executor_factory, self.pm, str(tmp), lambda: ["c1"])
        self.manager = MaintainerManager("c1", self.center, self.host, self.pm, lambda: ["c1"])

    def add(self, info: ChangeFeedInfo, checkpoint_ts: int) -> None:
        add = AddMaintainerRequest("c1", "c1", 1, "cf", 1, info.to_json(), checkpoint_ts)
        self.center.send("c1", Topic.MAINTAINER_MANAGER, CoordinatorBootstrapRequest("c1", "c1", 1))
        self.center.send("c1", Topic.MAINTAINER_MANAGER, add)

    async def maintainer(self) -> Maintainer:
        return await until(lambda: self.manager.maintainers.get("cf"), message="the maintainer of cf")

    async def close(self) -> None:
        await self.manager.close()
        await self.center.close()


def changefeed(out: Path, created: int) -> ChangeFeedInfo:
    return ChangeFeedInfo(
        "cf",
        # replay: a span's feed delivers every tick above its start ts, as an upstream would
        {"type": "ticker", "tables": 1, "interval": INTERVAL, "replay": True, "created": {1: created}},
        [{"type": "file", "path": str(out), "protocol": "json"}],
        filter_rules=["db.t1"],  # db.t0 exists from the start and is not replicated
        epoch=1,
    )


def replicating(m: Maintainer, span: Span) -> bool:
    return m.placement is not None and any(
        r.span == span and r.state is ReplicationState.REPLICATING for r in m.replication_status()
    )


def span_checkpoint(m: Maintainer, span: Span) -> int:
    return max((r.checkpoint_ts for r in m.replication_status() if r.span == span), default=0) if m.placement else 0


def test_a_changefeed_whose_filter_matches_no_table_yet_advances(tmp_path):
    async def main():
        capture = Capture(tmp_path)
        start = now_ts()
        capture.add(changefeed(tmp_path / "out", later(start, 3600)), start)
        try:
            m = await capture.maintainer()
            await until(lambda: m.checkpoint_ts > start or m.error is not None, observe=m.status)
            assert m.error is None
            assert m.placement is not None and m.placement.spans == [TRIGGER]  # the table-trigger span alone
            assert replicating(m, TRIGGER)
        finally:
            await capture.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_table_created_while_running_is_added_at_its_create_ts(tmp_path):
    async def main():
        capture = Capture(tmp_path)
        start = now_ts()
        created = later(start, 2.0)
        capture.add(changefeed(tmp_path / "out", created), start)
        samples: list[tuple[int, bool, bool]] = []  # (checkpoint, t1's span wanted, t1 replicating)
        flushed: list[tuple[int, bool]] = []  # (the trigger span's checkpoint, t1 replicating)
        try:
            m = await capture.maintainer()

            def past_the_create() -> bool:
                """Whether the checkpoint passed the CREATE TABLE by a second; until then, sample."""
                if m.checkpoint_ts > later(created, 1.0) or m.error is not None:
                    return True
                wanted = m.placement is not None and T1 in m.placement.spans
                samples.append((m.checkpoint_ts, wanted, replicating(m, T1)))
                flushed.append((span_checkpoint(m, TRIGGER), samples[-1][2]))
                return False

            await until(past_the_create, interval=0.01, observe=m.status)
            assert m.error is None
            final = m.checkpoint_ts
        finally:
            await capture.close()
        # The checkpoint moved before the table existed; the table's span was added only once
        # the checkpoint reached its CREATE TABLE (the DDL was flushed), and the checkpoint did
        # not pass the CREATE TABLE before the span replicated.
        assert any(start < ckpt < created for ckpt, _, _ in samples)
        assert all(ckpt >= created for ckpt, wanted, _ in samples if wanted)
        assert all(ckpt <= created for ckpt, _, t1 in samples if not t1)
        assert any(t1 for _, _, t1 in samples)
        # The barrier: no span was flushed past the CREATE TABLE before t1 replicated.
        assert all(ckpt <= created for ckpt, t1 in flushed if not t1)
        return final

    final = asyncio.run(asyncio.wait_for(main(), 60))
    out = tmp_path / "out" / "db" / "t1"
    (ddl_file,) = out.glob("ddl-*.jsonl")
    ddl = json.loads(ddl_file.read_text())
    assert ddl["query"] == create_query(1) and ddl["action_type"] == 3
    created = ddl["commit_ts"]
    rows = [json.loads(line) for f in sorted(out.glob("0*.jsonl")) for line in f.read_text().splitlines()]
    got = {r["after"]["id"] for r in rows if r["commit_ts"] <= final}
    first = first_tick_after(created, INTERVAL)
    want = set(range(first, first_tick_after(final, INTERVAL)))
    assert want and got == want  # every row after the CREATE TABLE up to the checkpoint, none before
    assert all(tick_ts(k, INTERVAL) > created for k in got)
    assert not (tmp_path / "out" / "db" / "t0").exists()
