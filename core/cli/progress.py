"""The live progress line and the exit summary of ``cdcflow run``.

Rows are counted from the ``cdcflow_batch_flushed`` hook (every sink of the
changefeed flushed the batch), so the rate shown is the rate at which changes
became durable downstream, not the rate at which they were read. Lags are
measured against the wall clock from the TSO's physical part.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, TextIO

from cdcflow.core.data.events import tso_physical_ms
from cdcflow.core.plugin.hookspec import hookimpl

__all__ = ["ProgressReporter"]

#: Seconds of history the rows/s figure averages over.
RATE_WINDOW = 10.0
#: Without a terminal, print a progress line this often instead of redrawing one.
PLAIN_INTERVAL = 10.0


def _lag(ts: int, now: float) -> float:
    return max(0.0, now - tso_physical_ms(ts) / 1000) if ts else 0.0


@dataclass
class _Changefeed:
    rows: int = 0
    batches: int = 0
    #: The initial snapshot's progress line while it is read (empty: none, or done).
    snapshot: str = ""
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    checkpoint_lags: list[float] = field(default_factory=list)

    def rate(self, now: float) -> float:
        while self.samples and now - self.samples[0][0] > RATE_WINDOW:
            self.samples.popleft()
        if not self.samples:
            return 0.0
        span = max(now - self.samples[0][0], 1.0)
        return sum(n for _, n in self.samples) / span


class ProgressReporter:
    """A plugin (registered with the plugin manager) that counts flushed rows
    and renders progress; ``render`` is called about once a second."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stderr
        self.started = time.monotonic()
        self._feeds: dict[str, _Changefeed] = defaultdict(_Changefeed)
        self._tty = bool(getattr(self.out, "isatty", lambda: False)())
        self._last_plain = 0.0

    @hookimpl
    def cdcflow_batch_flushed(self, changefeed_id: str, batch_id: int, checkpoint_ts: int, row_count: int) -> None:
        feed = self._feeds[changefeed_id]
        feed.rows += row_count
        feed.batches += 1
        feed.samples.append((time.monotonic(), row_count))

    @hookimpl
    def cdcflow_snapshot_progress(
        self,
        changefeed_id: str,
        ts: int,
        unit: str,
        parts_done: int,
        parts_total: int,
        rows_done: int,
        rows_estimate: int,
        phase: str,
    ) -> None:
        feed = self._feeds[changefeed_id]
        if phase == "done":
            feed.snapshot = ""
            return
        percent = 100.0 * parts_done / parts_total if parts_total else 100.0
        eta = ""
        elapsed = time.monotonic() - self.started
        if 0 < parts_done < parts_total:
            eta = f", ETA {elapsed / parts_done * (parts_total - parts_done):.0f}s"
        feed.snapshot = (
            f" snapshot {parts_done}/{parts_total} {unit}s ({percent:.0f}%), "
            f"{rows_done:,}/~{max(rows_done, rows_estimate):,} rows{eta};"
        )

    def line(self, changefeeds: list[tuple[Any, Any]]) -> str:
        """One line for every changefeed: state, rows/s, checkpoint and resolved lag."""
        now_wall, now = time.time(), time.monotonic()
        parts = []
        for info, status in changefeeds:
            feed = self._feeds[info.id]
            checkpoint_lag = _lag(status.checkpoint_ts, now_wall)
            if status.checkpoint_ts:
                feed.checkpoint_lags.append(checkpoint_lag)
            error = ""
            if info.error:
                error = f" ({info.error.get('code_name')}: {str(info.error.get('message', ''))[:80]})"
            parts.append(
                f"{info.id} {info.state.value}{error}{feed.snapshot} {feed.rate(now):,.0f} rows/s, "
                f"checkpoint lag {checkpoint_lag:.1f}s, resolved lag {_lag(status.resolved_ts, now_wall):.1f}s"
            )
        return "; ".join(parts) or "no connectors"

    def render(self, changefeeds: list[tuple[Any, Any]]) -> None:
        text = self.line(changefeeds)
        if self._tty:
            self.out.write("\r" + text + "\033[K")
        elif time.monotonic() - self._last_plain >= PLAIN_INTERVAL:
            self._last_plain = time.monotonic()
            self.out.write(text + "\n")
        self.out.flush()

    def summary(self, changefeeds: list[tuple[Any, Any]]) -> list[str]:
        """Lines for stdout at exit: per changefeed state, checkpoint, rows, rate, lag percentiles."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        lines = []
        for info, status in changefeeds:
            feed = self._feeds[info.id]
            lags = sorted(feed.checkpoint_lags)
            p50 = lags[len(lags) // 2] if lags else 0.0
            p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else 0.0
            lines.append(
                f"{info.id}: {info.state.value}, checkpoint {status.checkpoint_ts}, "
                f"{feed.rows} rows in {feed.batches} batches, {feed.rows / elapsed:,.0f} rows/s over "
                f"{elapsed:.0f}s, checkpoint lag p50 {p50:.1f}s p99 {p99:.1f}s"
            )
        return lines
