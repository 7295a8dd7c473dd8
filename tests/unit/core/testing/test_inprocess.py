"""The in-process executor as a writer to the sinks: its batch ids start at 0, so every
executor is a writer of its own (``SinkContext.writer_id``)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import defaultdict

from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.control.coordinator.spec import connector_for
from cdcflow.core.data.events import tso_from_ms
from cdcflow.core.data.span_executor import ExecutorContext
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until
from cdcflow.core.testing.inprocess import executor_factory
from tests import ticker_source

INTERVAL = 0.02


def test_two_executors_of_one_changefeed_write_a_table_as_two_writers(tmp_path):
    """Two captures' executors holding the same table (one before and one after a move, for
    a moment both) write batches of the same ids and end ts: each keeps its own files, and
    each writer's files hold every tick it was resolved past, in full."""
    plugins = PluginManager.default(autoload=False)
    plugins.register(sys.modules[ticker_source.__name__])
    out = tmp_path / "out"
    info = ChangeFeedInfo(
        "cf",
        {"type": "ticker", "interval": INTERVAL, "tables": 1, "replay": True},
        [{"type": "file", "path": str(out), "protocol": "json", "fsync": False}],
    )
    table = ticker_source.table_name(0)

    async def main() -> None:
        [table_span] = await ticker_source.TickerSource(ticker_source.TickerConfig()).spans_for(table)
        begin = tso_from_ms(int(time.time() * 1000) - 500)  # a replayed half second, then the clock
        executors = []
        for capture in ("c1", "c2"):
            context = ExecutorContext(
                info, connector_for(info, plugins), capture, plugins, str(tmp_path / capture), start_ts=begin
            )
            executor = executor_factory(context)
            await executor.add_span(table_span, begin, prepare=False)
            executors.append(executor)
        try:
            folder = out / table.schema / table.table
            await until(lambda: len({p.stem.split("-w")[1] for p in folder.glob("0*.jsonl")}) == 2, timeout=30)
            for executor in executors:
                assert executor.error() is None
        finally:
            for executor in executors:
                await executor.close()
        by_writer: dict[str, set[int]] = defaultdict(set)
        for path in folder.glob("0*.jsonl"):
            by_writer[path.stem.split("-w")[1]] |= {
                json.loads(line)["after"]["id"] for line in path.read_text().splitlines()
            }
        assert sorted(by_writer) == sorted(e.writer_id for e in executors)
        first = ticker_source.first_tick_after(begin, INTERVAL)
        for ids in by_writer.values():
            assert ids == set(range(first, max(ids) + 1)), "a writer's files miss a tick"

    asyncio.run(main())
