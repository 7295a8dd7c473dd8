"""What ``cdcflow run`` shows while it runs, and the exit summary.

* **Live view** (stdout is a terminal, no ``--plain``): with rich, a table per
  changefeed (state, checkpoint, checkpoint and resolved lag, rows/s, rows,
  last error) and, while a changefeed catches up, a progress bar with an ETA.
* **Plain lines** (stdout is not a terminal, or ``--plain``): one line for all
  changefeeds on stderr every :data:`PLAIN_INTERVAL` seconds.

Rows are counted from the ``cdcflow_batch_flushed`` hook (every sink of the
changefeed flushed the batch), so the rate shown is the rate at which changes
became durable downstream, not the rate at which they were read. Lags are
measured against the wall clock from the TSO's physical part.

**Catch-up.** When a changefeed is first seen running (at start, or after a
resume) with its checkpoint more than :data:`CATCH_UP_MIN_LAG` seconds behind
the clock, the ts it has to reach is the clock at that moment: progress is how
far its checkpoint moved from where it was towards that ts, and the ETA
extrapolates the speed of that move so far. A changefeed created with a
``start_ts`` in the past (its incremental scan) shows the same way. Once the
checkpoint passes the target the bar goes away.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from cdcflow.core.data.events import tso_physical_ms
from cdcflow.core.plugin.hookspec import hookimpl

__all__ = ["CATCH_UP_MIN_LAG", "PLAIN_INTERVAL", "CatchUp", "FdRelay", "LiveView", "ProgressReporter"]

#: Seconds of history the rows/s figure averages over.
RATE_WINDOW = 10.0
#: Without a terminal, print a progress line this often instead of redrawing one.
PLAIN_INTERVAL = 10.0
#: A changefeed first seen running further behind than this many seconds is catching up.
CATCH_UP_MIN_LAG = 10.0


def _lag(ts: int, now: float) -> float:
    return max(0.0, now - tso_physical_ms(ts) / 1000) if ts else 0.0


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass
class CatchUp:
    """A changefeed moving its checkpoint from ``start_ms`` to ``target_ms`` (TSO physical
    milliseconds), observed since ``began`` (monotonic seconds)."""

    began: float
    start_ms: int
    target_ms: int
    done_ms: int = 0

    def update(self, checkpoint_ts: int) -> None:
        self.done_ms = max(self.done_ms, min(tso_physical_ms(checkpoint_ts), self.target_ms) - self.start_ms)

    @property
    def total_ms(self) -> int:
        return max(1, self.target_ms - self.start_ms)

    @property
    def fraction(self) -> float:
        return min(1.0, self.done_ms / self.total_ms)

    @property
    def finished(self) -> bool:
        return self.done_ms >= self.total_ms

    def eta(self, now: float) -> float | None:
        """Seconds until the target at the speed so far; None before the checkpoint moved."""
        elapsed = now - self.began
        if self.done_ms <= 0 or elapsed <= 0:
            return None
        return (self.total_ms - self.done_ms) / (self.done_ms / elapsed)

    def describe(self, now: float) -> str:
        eta = self.eta(now)
        return (
            f"catching up {self.fraction:.0%} of {_duration(self.total_ms / 1000)}, "
            f"ETA {_duration(eta) if eta is not None else 'unknown'}"
        )


@dataclass
class _Changefeed:
    rows: int = 0
    batches: int = 0
    #: The initial snapshot's progress line while it is read (empty: none, or done).
    snapshot: str = ""
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    checkpoint_lags: list[float] = field(default_factory=list)
    running: bool = False
    catch_up: CatchUp | None = None

    def rate(self, now: float) -> float:
        while self.samples and now - self.samples[0][0] > RATE_WINDOW:
            self.samples.popleft()
        if not self.samples:
            return 0.0
        span = max(now - self.samples[0][0], 1.0)
        return sum(n for _, n in self.samples) / span


class ProgressReporter:
    """A plugin (registered with the plugin manager) that counts flushed rows, follows
    catch-ups and renders progress; ``render`` is called about once a second. ``live``
    (a :class:`LiveView`) draws on a terminal; without it, plain lines go to ``out``."""

    def __init__(self, out: TextIO | None = None, live: LiveView | None = None) -> None:
        self.out = out or sys.stderr
        self.live = live
        self.started = time.monotonic()
        self._feeds: dict[str, _Changefeed] = defaultdict(_Changefeed)
        self._last_plain: float | None = None

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

    def observe(self, changefeeds: list[tuple[Any, Any]], now_wall: float, now: float) -> None:
        """Follow each changefeed's lags and catch-up (called with every render)."""
        for info, status in changefeeds:
            feed = self._feeds[info.id]
            # This run's lags: from its first flushed batch on (before it, the metastore may
            # still hold the checkpoint an earlier run left, hours old).
            if status.checkpoint_ts and feed.batches:
                feed.checkpoint_lags.append(_lag(status.checkpoint_ts, now_wall))
            running = bool(info.state.runs)
            if running and not feed.running and _lag(status.checkpoint_ts, now_wall) > CATCH_UP_MIN_LAG:
                start_ms = tso_physical_ms(status.checkpoint_ts)
                feed.catch_up = CatchUp(began=now, start_ms=start_ms, target_ms=int(now_wall * 1000))
            feed.running = running
            if feed.catch_up is not None:
                feed.catch_up.update(status.checkpoint_ts)
                if feed.catch_up.finished or not running:
                    feed.catch_up = None

    def rows(self, changefeed_id: str) -> int:
        return self._feeds[changefeed_id].rows

    def rate(self, changefeed_id: str, now: float) -> float:
        return self._feeds[changefeed_id].rate(now)

    def catch_up(self, changefeed_id: str) -> CatchUp | None:
        return self._feeds[changefeed_id].catch_up

    def line(self, changefeeds: list[tuple[Any, Any]], now_wall: float | None = None, now: float | None = None) -> str:
        """One line for every changefeed: state, rows/s, checkpoint and resolved lag, catch-up."""
        now_wall = time.time() if now_wall is None else now_wall
        now = time.monotonic() if now is None else now
        parts = []
        for info, status in changefeeds:
            feed = self._feeds[info.id]
            error = ""
            if info.error:
                error = f" ({info.error.get('code_name')}: {str(info.error.get('message', ''))[:80]})"
            catch_up = f", {feed.catch_up.describe(now)}" if feed.catch_up is not None else ""
            parts.append(
                f"{info.id} {info.state.value}{error}{feed.snapshot} {feed.rate(now):,.0f} rows/s, "
                f"checkpoint lag {_lag(status.checkpoint_ts, now_wall):.1f}s, "
                f"resolved lag {_lag(status.resolved_ts, now_wall):.1f}s{catch_up}"
            )
        return "; ".join(parts) or "no connectors"

    def render(self, changefeeds: list[tuple[Any, Any]]) -> None:
        now_wall, now = time.time(), time.monotonic()
        self.observe(changefeeds, now_wall, now)
        if self.live is not None:
            self.live.update(self, changefeeds, now_wall, now)
        elif self._last_plain is None or now - self._last_plain >= PLAIN_INTERVAL:
            self._last_plain = now
            self.out.write(self.line(changefeeds, now_wall, now) + "\n")
            self.out.flush()

    def close(self) -> None:
        """Stop the live view (the terminal is the process's again)."""
        if self.live is not None:
            self.live.stop()

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


_STATE_STYLES = {"normal": "green", "warning": "yellow", "failed": "bold red", "paused": "dim", "finished": "blue"}


class FdRelay:
    """File descriptor 2 routed through a pipe: every line written to it — by Python, or
    straight to the descriptor by the Spark JVM, librdkafka or gRPC's C core, and by the
    processes started after :meth:`start`, which inherit the pipe — is handed to
    ``line`` (the live view prints it above itself), or to the original descriptor
    when ``line`` returns False. :meth:`stop` gives descriptor 2 back; lines that
    processes still holding the pipe write later go to the original descriptor."""

    def __init__(self, line: Callable[[str], bool]) -> None:
        self.line = line
        self._saved: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        sys.stderr.flush()
        self._saved = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(target=self._pump, args=(read, self._saved), name="fd2-relay", daemon=True)
        self._thread.start()

    def _pump(self, read: int, original: int) -> None:
        with os.fdopen(read, "rb") as pipe:
            for raw in pipe:
                if not (self._saved is not None and self.line(raw.decode(errors="replace").rstrip("\n"))):
                    os.write(original, raw)

    def stop(self) -> None:
        if self._saved is not None:
            sys.stderr.flush()
            os.dup2(self._saved, 2)
            self._saved = None


def _same_terminal() -> bool:
    """Whether stderr is the terminal stdout is (so writes to it would tear the view)."""
    try:
        return os.isatty(2) and os.isatty(1) and os.ttyname(1) == os.ttyname(2)
    except OSError:
        return False


class LiveView:
    """The terminal view: a rich ``Live`` on ``console`` redrawn at every render."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(file=sys.stdout)
        self._live: Any = None
        self._handlers: list[tuple[Any, Any]] = []
        self.relay: FdRelay | None = None

    @classmethod
    def for_terminal(cls) -> LiveView:
        """The view on stdout; when stderr is the same terminal, descriptor 2 is relayed from
        now on (before Spark starts, so that its JVM inherits the pipe): what anything writes
        there prints above the view instead of tearing it."""
        view = cls()
        if _same_terminal():
            view.relay = FdRelay(view._print_line)
            view.relay.start()
        return view

    def _print_line(self, text: str) -> bool:
        live = self._live
        if live is None:
            return False
        live.console.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)
        return True

    def renderable(
        self, reporter: ProgressReporter, changefeeds: list[tuple[Any, Any]], now_wall: float, now: float
    ) -> Any:
        """A table per changefeed, with a catch-up bar under it while it catches up."""
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        parts: list[Any] = []
        for info, status in changefeeds:
            table = Table(title=info.id, title_justify="left", title_style="bold", expand=False)
            for column in ("state", "checkpoint", "checkpoint lag", "resolved lag", "rows/s", "rows"):
                table.add_column(column, justify="right" if "lag" in column or "rows" in column else "left")
            checkpoint_time = time.strftime("%H:%M:%S", time.gmtime(tso_physical_ms(status.checkpoint_ts) / 1000))
            table.add_row(
                Text(info.state.value, style=_STATE_STYLES.get(info.state.value, "")),
                f"{status.checkpoint_ts} ({checkpoint_time} UTC)",
                f"{_lag(status.checkpoint_ts, now_wall):.1f}s",
                f"{_lag(status.resolved_ts, now_wall):.1f}s",
                f"{reporter.rate(info.id, now):,.0f}",
                f"{reporter.rows(info.id):,}",
            )
            if info.error:
                message = str(info.error.get("message", ""))[:200]
                table.caption = f"last error {info.error.get('code_name')}: {message}"
                table.caption_style = "red"
                table.caption_justify = "left"
            parts.append(table)
            catch_up = reporter.catch_up(info.id)
            if catch_up is not None:
                bar = Table.grid(padding=(0, 1))
                bar.add_row(
                    ProgressBar(total=catch_up.total_ms, completed=catch_up.done_ms, width=40),
                    Text(catch_up.describe(now)),
                )
                parts.append(bar)
        if not parts:
            parts.append(Text("no connectors"))
        return Group(*parts)

    def start(self) -> None:
        """Start drawing; log lines (and anything else written to stdout or stderr) print above the view."""
        import logging

        from rich.live import Live

        streams = (sys.stdout, sys.stderr)
        self._live = Live(console=self.console, auto_refresh=False, redirect_stdout=True, redirect_stderr=True)
        self._live.start()
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in streams:
                self._handlers.append((handler, handler.setStream(sys.stderr)))

    def update(
        self, reporter: ProgressReporter, changefeeds: list[tuple[Any, Any]], now_wall: float, now: float
    ) -> None:
        if self._live is None:
            self.start()
        self._live.update(self.renderable(reporter, changefeeds, now_wall, now), refresh=True)

    def stop(self) -> None:
        if self._live is not None:
            for handler, stream in self._handlers:
                handler.setStream(stream)
            self._handlers.clear()
            live, self._live = self._live, None
            live.stop()
        if self.relay is not None:
            self.relay.stop()
