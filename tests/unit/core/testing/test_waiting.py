"""``until`` and ``until_sync``: poll until a condition holds, return what it returned,
and on timeout say what was awaited and what was last seen."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest

from cdcflow.core.testing import WaitTimeout, until, until_sync
from cdcflow.core.testing.waiting import until_resolved


class Counter:
    """A predicate that turns true on its ``after``-th evaluation, returning that count."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.calls if self.calls >= self.after else 0


def test_until_polls_until_the_predicate_holds_and_returns_its_value():
    ready = Counter(after=3)
    assert asyncio.run(until(ready, interval=0.001)) == 3
    assert ready.calls == 3  # not evaluated again once it held


def test_until_awaits_a_coroutine_predicate():
    ready = Counter(after=2)

    async def probe() -> int:
        await asyncio.sleep(0)
        return ready()

    assert asyncio.run(until(probe, interval=0.001)) == 2


def test_a_condition_already_true_is_returned_even_with_no_time_to_wait():
    assert asyncio.run(until(lambda: "yes", timeout=0)) == "yes"
    assert until_sync(lambda: ["yes"], timeout=0) == ["yes"]


def test_a_timeout_says_what_was_awaited_and_the_last_value_seen():
    state = {"paused": False, "rows": []}
    with pytest.raises(WaitTimeout) as raised:
        asyncio.run(until(lambda: state["rows"], timeout=0.05, interval=0.01))
    assert isinstance(raised.value, AssertionError)  # a test failure, not an error
    assert 'waiting for state["rows"]; last observed: []' in str(raised.value)
    assert raised.value.what == 'state["rows"]' and raised.value.observed == []

    with pytest.raises(WaitTimeout, match=r"waiting for the feed to pause; last observed: False"):
        until_sync(lambda: state["paused"], timeout=0.05, message="the feed to pause")


def test_a_long_observed_value_is_shown_by_its_beginning_and_its_end():
    log = "started\n" + "x" * 10_000 + "\nfailed: port in use"
    with pytest.raises(WaitTimeout) as raised:
        until_sync(lambda: None, timeout=0, observe=lambda: log)
    shown = str(raised.value)
    assert "'started\\n" in shown and "failed: port in use'" in shown and " … " in shown
    assert len(shown) < 2_200
    assert raised.value.observed == log  # whole on the exception


def test_a_named_predicate_is_described_by_its_name():
    def settled() -> bool:
        return False

    with pytest.raises(WaitTimeout, match=r"waiting for .*settled\(\); last observed: False"):
        until_sync(settled, timeout=0)


def test_observe_reports_more_than_a_yes_or_no():
    checkpoint = {"ts": 90}

    async def shown() -> dict[str, int]:
        return dict(checkpoint)

    with pytest.raises(WaitTimeout, match=r"last observed: \{'ts': 90\}"):
        asyncio.run(until(lambda: checkpoint["ts"] > 100, timeout=0, observe=shown))
    with pytest.raises(WaitTimeout, match=r"last observed: 90"):
        until_sync(lambda: checkpoint["ts"] > 100, timeout=0, observe=lambda: checkpoint["ts"])


def test_the_predicates_own_errors_are_not_retried():
    calls: list[int] = []

    def invariant() -> int:
        calls.append(1)
        assert len(calls) < 2, "the invariant broke"
        return 0

    with pytest.raises(AssertionError, match="the invariant broke") as raised:
        asyncio.run(until(invariant, interval=0.001))
    assert not isinstance(raised.value, WaitTimeout)
    assert len(calls) == 2


def test_until_sync_waits_for_another_thread():
    done = threading.Event()
    seen: list[int] = []

    def work() -> None:
        done.wait()
        seen.append(7)

    worker = threading.Thread(target=work)
    worker.start()
    done.set()
    assert until_sync(lambda: seen) == [7]
    worker.join()


def test_until_sync_refuses_an_async_predicate():
    async def probe() -> bool:
        return True

    with pytest.raises(TypeError, match="await until"):
        until_sync(probe)


@dataclass
class Rebuilt:
    resolved_ts: int


def test_until_resolved_reads_again_until_the_resolved_ts_reaches_the_one_asked():
    reads = iter([Rebuilt(0), Rebuilt(90), Rebuilt(100), Rebuilt(120)])
    assert until_resolved(lambda: next(reads), 100, interval=0.001) == Rebuilt(100)


def test_until_resolved_returns_the_last_read_when_the_time_is_up():
    reads: list[int] = []

    def read() -> Rebuilt:
        reads.append(1)
        return Rebuilt(5)

    assert until_resolved(read, 100, timeout=0.0) == Rebuilt(5)  # the caller asserts and shows it
    assert len(reads) == 1


@pytest.mark.parametrize(("timeout", "interval"), [(-1.0, 0.1), (1.0, 0.0)])
def test_nonsense_timings_are_refused(timeout, interval):
    with pytest.raises(ValueError):
        until_sync(lambda: True, timeout=timeout, interval=interval)
    with pytest.raises(ValueError):
        asyncio.run(until(lambda: True, timeout=timeout, interval=interval))
