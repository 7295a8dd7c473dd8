"""Waiting in tests: poll a condition until it holds instead of sleeping and hoping.

A test that sleeps for a while and then asserts is slow when the machine is fast
and flaky when it is loaded. :func:`until` polls a predicate until it returns a
truthy value and returns that value; when the timeout passes first it fails with
a :class:`WaitTimeout` that says what was awaited and what was last observed::

    from cdcflow.core.testing import until

    await until(lambda: executor.status(span).state is SpanState.REPLICATING)
    checkpoint = await until(lambda: sink.checkpoints, message="a checkpoint written to the sink")

The timeout is a hang guard, not a speed check: pick one that a loaded machine
never reaches. :func:`until_sync` is the same for code without an event loop
(threads, subprocesses).

A sleep that must let time pass — to show that something does *not* happen
within a window, or to simulate elapsed time — is not a wait on a condition and
stays a sleep.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar, overload

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_TIMEOUT", "WaitTimeout", "until", "until_resolved", "until_sync"]

T = TypeVar("T")


class _Resolved(Protocol):
    resolved_ts: int


R = TypeVar("R", bound=_Resolved)

#: Seconds :func:`until` waits by default: long enough for any unit test step on a loaded machine.
DEFAULT_TIMEOUT = 30.0
#: Seconds between two evaluations of the predicate.
DEFAULT_INTERVAL = 0.02
_SHOWN = 2000  # characters of the last observed value shown in the failure message


class WaitTimeout(AssertionError):
    """A condition did not hold within its timeout.

    ``what`` describes the condition, ``observed`` is the last value seen (the
    predicate's last result, or what ``observe`` returned).
    """

    def __init__(self, what: str, timeout: float, observed: object) -> None:
        self.what = what
        self.timeout = timeout
        self.observed = observed
        shown = repr(observed)
        if len(shown) > _SHOWN:  # its beginning and its end (a log's last lines, a list's last items)
            shown = f"{shown[: _SHOWN // 2]} … {shown[-_SHOWN // 2 :]}"
        super().__init__(f"timed out after {timeout:g}s waiting for {what}; last observed: {shown}")


@overload
async def until(  # an awaitable result is awaited, not returned
    predicate: Callable[[], Awaitable[T]],
    *,
    timeout: float = ...,
    interval: float = ...,
    message: str | None = ...,
    observe: Callable[[], object] | None = ...,
) -> T: ...


@overload
async def until(
    predicate: Callable[[], T],
    *,
    timeout: float = ...,
    interval: float = ...,
    message: str | None = ...,
    observe: Callable[[], object] | None = ...,
) -> T: ...


async def until(
    predicate: Callable[[], object],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    message: str | None = None,
    observe: Callable[[], object] | None = None,
) -> object:
    """Poll ``predicate`` on the running event loop until it returns a truthy value; return that value.

    ``predicate`` takes no arguments and may be a coroutine function (its result is
    awaited). It is evaluated at once, then every ``interval`` seconds, and once
    more when ``timeout`` has passed; if it is still falsy then, :class:`WaitTimeout`
    is raised. An exception the predicate raises propagates at once (an assertion
    inside it is an invariant checked on every poll, not a reason to retry).

    ``message`` says what is awaited (by default the predicate's source);
    ``observe``, when given, is called (and awaited) on timeout and its value is
    reported instead of the predicate's last result — for a predicate that only
    answers yes or no.
    """
    _check(timeout, interval)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        remaining = deadline - loop.time()
        if remaining <= 0:
            if observe is not None:
                value = observe()
                if inspect.isawaitable(value):
                    value = await value
            raise WaitTimeout(message or _describe(predicate), timeout, value)
        await asyncio.sleep(min(interval, remaining))


def until_sync(
    predicate: Callable[[], T],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    message: str | None = None,
    observe: Callable[[], object] | None = None,
) -> T:
    """:func:`until` for a caller without an event loop: it blocks the calling thread between polls.

    The predicate must be a plain function; an awaitable result is a mistake (it
    would always be truthy) and raises :class:`TypeError`.
    """
    _check(timeout, interval)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()
            raise TypeError(f"{_describe(predicate)} returned an awaitable: await until(...) instead")
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(message or _describe(predicate), timeout, observe() if observe is not None else value)
        time.sleep(min(interval, remaining))


def until_resolved(read: Callable[[], R], ts: int, *, timeout: float = 60.0, interval: float = 0.5) -> R:
    """``read()`` (a topic rebuilt by a consumer recipe) again until its ``resolved_ts``
    reaches ``ts`` or ``timeout`` passes; the last result either way, for the caller to
    assert on and to show.

    A changefeed's Kafka resolved events trail its persisted checkpoint: the
    checkpoint reaches the captures with the maintainer's next heartbeat, and
    each writes it to its sinks between two batches. A topic read at the moment
    the checkpoint passed ``ts`` may hold every row and not yet the resolved
    event that lets a consumer apply them.
    """
    _check(timeout, interval)
    deadline = time.monotonic() + timeout
    latest = read()
    while latest.resolved_ts < ts and time.monotonic() < deadline:
        time.sleep(interval)
        latest = read()
    return latest


def _describe(predicate: Callable[..., object]) -> str:
    """A short description of ``predicate``: a lambda's body as written, otherwise its qualified name."""
    name = str(getattr(predicate, "__qualname__", None) or repr(predicate))
    if getattr(predicate, "__name__", None) != "<lambda>":
        return f"{name}()"
    try:
        source = textwrap.dedent(inspect.getsource(predicate)).strip()
    except (OSError, TypeError):
        return name
    try:
        lambdas = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Lambda)]
    except SyntaxError:  # a lambda on a continuation line: its lines alone do not parse
        lambdas = []
    if len(lambdas) == 1:
        body = ast.get_source_segment(source, lambdas[0].body)
        if body:
            return " ".join(body.split())
    return " ".join(source.split())


def _check(timeout: float, interval: float) -> None:
    if timeout < 0:
        raise ValueError(f"timeout must not be negative, not {timeout}")
    if interval <= 0:
        raise ValueError(f"interval must be positive, not {interval}")
