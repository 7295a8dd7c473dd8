import faulthandler
import logging
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from cdcflow.plugins.sinks.kafka.mock import shutdown_mock_clusters
from tests import memory_report
from tests.memory_watch import rss_bytes

# Property tests check behaviour, not speed: Hypothesis's default per-example deadline
# (200 ms) is a wall-clock threshold that a loaded machine fails on, so there is none.
settings.register_profile("cdcflow", deadline=None)
settings.load_profile("cdcflow")


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A test that configures logging (the CLI's ``configure_logging``, run in-process) leaves
    the root logger as it found it. A handler left there writes to that test's captured stderr,
    closed once the test ends, and prints a "Logging error" with two stacks for every later
    warning of any thread in the session."""
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    yield
    for handler in list(root.handlers):
        # pytest's own capturing handlers come and go around each phase of a test.
        if handler not in before and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session", autouse=True)
def _stop_mock_kafka_clusters():
    """Kafka mock clusters live for the process; stop them when the session ends."""
    yield
    shutdown_mock_clusters()


#: Above this resident size (GiB; ``CDCFLOW_TEST_RSS_LIMIT_GIB``) the test process stops itself
#: with every thread's stack, instead of growing until the kernel's OOM killer ends it without a word.
RSS_LIMIT_GIB = float(os.environ.get("CDCFLOW_TEST_RSS_LIMIT_GIB", "8"))
#: Past this share of the limit (several times what the whole suite holds at its largest,
#: 0.3-0.6 GiB) the guard starts tracing Python's allocations, so that the stop names the
#: code that allocated the growth: a runaway has gone idle by the time the stacks are printed.
TRACE_SHARE = 0.25
_current_test = ["(between tests)"]


def _grown_by(stats: list[tracemalloc.Statistic], top: int = 8) -> str:
    """The allocation sites holding most of what was allocated since tracing began."""
    traced = sum(s.size for s in stats)
    lines = [f"Python allocations since tracing began: {traced / 2**20:.0f} MiB in {len(stats)} sites; the largest:"]
    for stat in stats[:top]:
        lines.append(f"  {stat.size / 2**20:.1f} MiB in {stat.count} blocks, allocated at (most recent call last):")
        lines.extend(f"    {line}" for line in stat.traceback.format())
    return "\n".join(lines) + "\n"


def _guard_memory(config: pytest.Config, limit: int, stop: threading.Event) -> None:
    tracing = False
    watch = memory_report.Watch()
    while not stop.wait(0.5):
        rss = rss_bytes()
        watch.size(time.monotonic(), rss)
        if tracing:
            watch.sample(skip=threading.get_ident())
        if not tracing and rss > limit * TRACE_SHARE:
            tracing = True
            tracemalloc.start(12)
            held = f"the test process holds {rss / 2**30:.1f} GiB in {_current_test[0]}"
            os.write(2, f"\n*** {held}; tracing allocations ***\n".encode())
        if rss > limit:
            # Output capture holds file descriptor 2 while a test runs: give it back first.
            capture = config.pluginmanager.getplugin("capturemanager")
            if capture is not None:
                capture.suspend_global_capture(in_=True)
            summary = (
                f"the test process holds {rss / 2**30:.1f} GiB, over its limit of {limit / 2**30:.1f} GiB, "
                f"in {_current_test[0]}"
            )
            os.write(
                2,
                f"\n*** {summary}; every thread's stack follows, then what grew, then the process exits ***\n".encode(),
            )
            faulthandler.dump_traceback(file=2, all_threads=True)
            stats = tracemalloc.take_snapshot().statistics("traceback") if tracing else None
            if stats is not None:
                os.write(2, _grown_by(stats).encode())
            # Last, so that the end of a truncated log still says it: what holds the
            # memory, a line per kind, then which test.
            report = watch.lines(time.monotonic()) + memory_report.summary(rss, stats)
            os.write(2, "".join(f"*** {line}\n" for line in report).encode())
            os.write(2, f"*** exiting: {summary} ***\n".encode())
            os._exit(3)


@pytest.fixture(scope="session", autouse=True)
def _memory_guard(pytestconfig: pytest.Config) -> Iterator[None]:
    """Stop a runaway test (a retry loop that keeps allocating) while it can still be diagnosed."""
    if not os.path.exists("/proc/self/statm") or RSS_LIMIT_GIB <= 0:
        yield
        return
    stop = threading.Event()
    limit = int(RSS_LIMIT_GIB * 2**30)
    thread = threading.Thread(
        target=_guard_memory, args=(pytestconfig, limit, stop), name="test-memory-guard", daemon=True
    )
    thread.start()
    # Past 1.5 times the limit, a process beside this one aborts it: the stacks then come
    # from faulthandler, even while a runaway in C holds the GIL and this thread cannot run.
    watchdog = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("memory_watch.py")), str(os.getpid()), str(limit * 3 // 2)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield
    stop.set()
    watchdog.kill()
    watchdog.wait()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current_test[0] = item.nodeid
    try:
        return (yield)
    finally:
        _current_test[0] = "(between tests)"
