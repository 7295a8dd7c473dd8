"""``cdcflow run``'s progress: catch-up tracking, the plain line, the rich live view
(rendered to a string console) and the JSON log lines."""

from __future__ import annotations

import io
import json
import logging

from rich.console import Console

from cdcflow.core.cli.logs import JsonFormatter, configure_logging
from cdcflow.core.cli.progress import CATCH_UP_MIN_LAG, LiveView, ProgressReporter
from cdcflow.core.control.changefeed import ChangeFeedInfo, ChangefeedState, ChangeFeedStatus
from cdcflow.core.data.events import tso_from_ms
from cdcflow.core.errors import ConfigInvalidError, DownstreamUnavailableError

NOW = 1_800_000_000.0  # wall clock of the tests (seconds)


def feed(cf: str, behind: float, state: ChangefeedState = ChangefeedState.NORMAL, error=None):
    """A changefeed whose checkpoint (and resolved ts) is ``behind`` seconds before NOW."""
    info = ChangeFeedInfo(cf, {"type": "ticker"}, [{"type": "file"}], state=state, error=error)
    ts = tso_from_ms(int((NOW - behind) * 1000))
    return info, ChangeFeedStatus(checkpoint_ts=ts, resolved_ts=ts)


def test_a_catch_up_moves_from_where_the_checkpoint_was_to_the_clock_at_start():
    reporter = ProgressReporter(out=io.StringIO())
    # First seen 600 s behind: it has to reach NOW; nothing done yet, no ETA.
    reporter.observe([feed("late", 600)], NOW, 0.0)
    catch_up = reporter.catch_up("late")
    assert catch_up is not None and catch_up.fraction == 0 and catch_up.eta(0.0) is None
    # 60 s later the checkpoint moved 300 s: half way, at 5 s of upstream time per second: 60 s to go.
    reporter.observe([feed("late", 300)], NOW + 60, 60.0)
    assert abs(catch_up.fraction - 0.5) < 1e-6 and abs(catch_up.eta(60.0) - 60.0) < 1e-6
    assert "catching up 50% of 10:00, ETA 1:00" in reporter.line([feed("late", 300)], NOW + 60, 60.0)
    # Passing the target ends it.
    reporter.observe([feed("late", -10)], NOW + 100, 100.0)
    assert reporter.catch_up("late") is None
    # A changefeed close to the clock is not catching up; a paused one neither.
    reporter.observe([feed("fresh", CATCH_UP_MIN_LAG / 2), feed("idle", 900, ChangefeedState.PAUSED)], NOW, 0.0)
    assert reporter.catch_up("fresh") is None and reporter.catch_up("idle") is None
    # Resumed far behind: a new catch-up from there.
    reporter.observe([feed("idle", 900)], NOW + 5, 5.0)
    assert reporter.catch_up("idle") is not None and reporter.catch_up("idle").total_ms == 905_000


def test_the_plain_line_comes_every_interval_and_has_no_terminal_codes():
    out = io.StringIO()
    reporter = ProgressReporter(out=out)
    error = {"code": 2001, "code_name": "ErrDownstreamUnavailable", "message": "disk full"}
    reporter.render([feed("ticks", 1.0), feed("broken", 2.0, ChangefeedState.WARNING, error)])
    reporter.render([feed("ticks", 1.0)])  # within PLAIN_INTERVAL: nothing more
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "\x1b" not in out.getvalue() and "\r" not in out.getvalue()
    assert lines[0].startswith("ticks normal 0 rows/s, checkpoint lag ")
    assert "broken warning (ErrDownstreamUnavailable: disk full)" in lines[0]


def test_the_live_view_renders_a_table_per_changefeed_and_a_catch_up_bar():
    console = Console(file=io.StringIO(), width=140, color_system=None, force_terminal=False)
    reporter = ProgressReporter(out=io.StringIO())
    for i in range(5):
        reporter.cdcflow_batch_flushed("ticks", i, 0, 40)
    error = {"code": 2001, "code_name": "ErrDownstreamUnavailable", "message": "disk full"}
    feeds = [feed("ticks", 1.5), feed("late", 600), feed("broken", 2.0, ChangefeedState.WARNING, error)]
    reporter.observe(feeds, NOW, 0.0)
    feeds[1] = feed("late", 300)
    reporter.observe(feeds, NOW + 60, 60.0)
    console.print(LiveView(console).renderable(reporter, feeds, NOW + 60, 60.0))
    text = console.file.getvalue()
    for title in ("ticks", "late", "broken"):
        assert any(line.strip() == title for line in text.splitlines()), text
    for column in ("state", "checkpoint", "checkpoint lag", "resolved lag", "rows/s", "rows"):
        assert column in text
    assert "200" in text  # the rows flushed for ticks
    assert "catching up 50% of 10:00, ETA 1:00" in text and "━" in text  # the bar
    assert "last error ErrDownstreamUnavailable: disk full" in text
    assert "warning" in text and "normal" in text


def _record(logger: str, level: int, msg: str, *args, exc=None, **extra) -> logging.LogRecord:
    record = logging.getLogger(logger).makeRecord(logger, level, __file__, 1, msg, args, exc, extra=extra or None)
    return record


def test_json_log_lines_name_the_changefeed_and_the_error_code():
    fmt = JsonFormatter()
    line = json.loads(fmt.format(_record("cdcflow.x", logging.WARNING, "changefeed %s: batch %d failed (%s)",
                                         "orders-to-kafka", 3, DownstreamUnavailableError("broker down"))))  # fmt: skip
    assert line["level"] == "warning" and line["logger"] == "cdcflow.x"
    assert line["message"].startswith("changefeed orders-to-kafka: batch 3 failed")
    assert line["changefeed"] == "orders-to-kafka"
    code = DownstreamUnavailableError.code
    assert code is not None and line["error_code"] == int(code) and line["error"] == code.name
    assert line["ts"].endswith("Z") and "T" in line["ts"]
    line = json.loads(fmt.format(_record("a", logging.INFO, "maintainer of %s epoch %d started", "ticks", 2)))
    assert line["changefeed"] == "ticks" and "error_code" not in line
    line = json.loads(fmt.format(_record("a", logging.INFO, "flushed", changefeed="from-extra")))
    assert line["changefeed"] == "from-extra"
    try:
        raise ConfigInvalidError("bad field")
    except ConfigInvalidError:
        import sys

        line = json.loads(fmt.format(_record("a", logging.ERROR, "refused", exc=sys.exc_info())))
    assert line["error_code"] == 1001 and line["error"] == "ErrConfigInvalid" and "bad field" in line["exception"]
    assert "changefeed" not in line


def test_configure_logging_json_writes_one_object_per_line(capsys):
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging("info", "json")
        logging.getLogger("cdcflow.test").info("changefeed %s: hello\nworld", "ticks")
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1  # the newline stays inside the JSON string
        assert json.loads(err[0])["message"] == "changefeed ticks: hello\nworld"
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])


RELAY_SCRIPT = r"""
import json, os, subprocess, sys, time
from cdcflow.core.cli.progress import FdRelay

got = []
taking = True
relay = FdRelay(lambda line: taking and not got.append(line))
relay.start()
os.write(2, b"straight to fd 2\n")
subprocess.run(["sh", "-c", "echo from a child process >&2"], check=True)
for _ in range(500):  # the relay's thread reads the pipe
    if len(got) == 2:
        break
    time.sleep(0.01)
taking = False
os.write(2, b"declined: to the original stderr\n")
relay.stop()  # no process holds the pipe any more: the relay reads to its end, then ends
relay._thread.join(30)
assert not relay._thread.is_alive()
os.write(2, b"after stop\n")
print(json.dumps(got))
"""


def test_the_relay_takes_what_anything_writes_to_descriptor_2():
    import subprocess
    import sys

    argv = [sys.executable, "-c", RELAY_SCRIPT]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["straight to fd 2", "from a child process"]
    assert result.stderr == "declined: to the original stderr\nafter stop\n"
