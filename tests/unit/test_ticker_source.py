"""The ticker test source is deterministic: a feed's rows follow from its start ts alone."""

from __future__ import annotations

import asyncio
import time

from cdcflow.core.data.events import ResolvedEvent, RowChange, Span, tso_from_ms
from tests.ticker_source import TickerConfig, TickerSource, first_tick_after, tick_ts

INTERVAL = 0.01
SPAN = Span(3, b"t3", b"t3~")


def head(start_ts: int, rows: int, replay: bool = True) -> list[tuple[str, int, int]]:
    """The events of a feed from ``start_ts`` up to its ``rows``-th row: (kind, id or 0, ts)."""

    async def collect() -> list[tuple[str, int, int]]:
        events: list[tuple[str, int, int]] = []
        feed = TickerSource(TickerConfig(tables=3, interval=INTERVAL, replay=replay)).feed(SPAN, start_ts)
        async for event in feed:
            if isinstance(event, RowChange):
                assert event.table.table == "t2"
                assert event.start_ts == event.commit_ts - 1
                events.append(("row", event.after["id"], event.commit_ts))
            elif isinstance(event, ResolvedEvent):
                events.append(("resolved", 0, event.ts))
            if sum(kind == "row" for kind, _, _ in events) == rows:
                break
        await feed.aclose()
        return events

    return asyncio.run(collect())


def test_a_feed_replays_every_tick_after_its_start_ts_then_follows_the_clock():
    start = tso_from_ms(int(time.time() * 1000) - 500)  # half a second of ticks already passed
    events = head(start, 80)  # 50 passed ticks, then ticks as the clock reaches them
    rows = [(k, ts) for kind, k, ts in events if kind == "row"]
    first = first_tick_after(start, INTERVAL)
    assert rows == [(k, tick_ts(k, INTERVAL)) for k in range(first, first + 80)]
    # A resolved ts covers the rows before it and none after it.
    for i, (kind, _, ts) in enumerate(events):
        if kind == "resolved":
            assert all(t <= ts for kd, _, t in events[:i] if kd == "row")
            assert all(t > ts for kd, _, t in events[i + 1 :] if kd == "row")


def test_a_later_start_ts_yields_the_same_rows_from_there_on():
    start = tso_from_ms(int(time.time() * 1000) - 300)
    whole = [(k, ts) for kind, k, ts in head(start, 20) if kind == "row"]
    later = [(k, ts) for kind, k, ts in head(whole[4][1], 15) if kind == "row"]
    assert later == whole[5:]


def test_without_replay_a_feed_starts_at_the_clock():
    start = tso_from_ms(int(time.time() * 1000) - 2000)
    rows = [(k, ts) for kind, k, ts in head(start, 3, replay=False) if kind == "row"]
    assert rows[0][0] > first_tick_after(start, INTERVAL) + 100  # the two passed seconds are skipped
    assert rows == [(k, tick_ts(k, INTERVAL)) for k in range(rows[0][0], rows[0][0] + 3)]
