"""Writes the changefeed checkpoint to a changefeed's sinks (``Sink.write_checkpoint``).

The maintainer's checkpoint reaches the executor with its heartbeats, up to
ten times a second. :class:`CheckpointWriter` keeps only the newest one and
writes it from a thread of its own, off the event loop, holding the
pipeline's delivery lock: a checkpoint never lands between the writes of a
batch, and a batch waits for a checkpoint write in progress. A sink gets a ts
only when it is above the last one it accepted.

Errors are handled like a batch's: a retryable ``CdcflowError`` is kept as
:attr:`CheckpointWriter.last_error` (the changefeed goes Warning) and the
write is tried again with backoff, with the newest checkpoint by then; any
other error stops the writer and is its :attr:`CheckpointWriter.failure`.

On :meth:`CheckpointWriter.stop` the newest checkpoint not written yet gets
one last attempt, so a capture that shuts down gracefully leaves its
consumers at the last checkpoint it knew. Nothing is written on abrupt
shutdown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from cdcflow.core.data.pipeline.backoff import is_retryable, retry_delay
from cdcflow.core.data.sink import Sink
from cdcflow.core.errors import CdcflowError

__all__ = ["CheckpointWriter"]

log = logging.getLogger(__name__)


class CheckpointWriter:
    """Writes the newest offered checkpoint to every sink, in the background."""

    def __init__(self, changefeed_id: str, sinks: Sequence[Sink[Any]], delivery_lock: threading.Lock) -> None:
        self.changefeed_id = changefeed_id
        self.sinks = list(sinks)
        self._delivery_lock = delivery_lock
        self._written = [0] * len(self.sinks)
        self._wanted = 0
        self._closing = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        #: The retryable error of the last attempt, while it is retried (None once a write succeeds).
        self.last_error: CdcflowError | None = None
        #: The error that stopped the writer (not retryable).
        self.failure: BaseException | None = None

    @property
    def written_ts(self) -> int:
        """The checkpoint every sink has accepted."""
        return min(self._written, default=self._wanted)

    def offer(self, ts: int) -> None:
        """Write ``ts`` soon (ignored unless above every ts offered before)."""
        with self._wake:
            if ts <= self._wanted:
                return
            self._wanted = ts
            self._wake.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"checkpoints-{self.changefeed_id}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write the newest checkpoint one last time (if not written yet), then end the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("changefeed %s: the last checkpoint write took over %.0fs", self.changefeed_id, timeout)

    def _run(self) -> None:
        attempt = 0
        while True:
            with self._wake:
                while not self._closing and self._wanted <= self.written_ts:
                    self._wake.wait()
                closing, ts = self._closing, self._wanted
            if ts > self.written_ts and not self._write(ts, attempt, final=closing):
                if closing or self.failure is not None:
                    return
                delay = retry_delay(attempt)
                attempt += 1
                with self._wake:
                    self._wake.wait_for(lambda: self._closing, delay)
                continue
            attempt = 0
            if closing:
                return

    def _write(self, ts: int, attempt: int, *, final: bool) -> bool:
        """One attempt at writing ``ts`` to every sink that has not got it; whether it succeeded."""
        try:
            with self._delivery_lock:
                for n, sink in enumerate(self.sinks):
                    if self._written[n] < ts:
                        sink.write_checkpoint(ts)
                        self._written[n] = ts
        except CdcflowError as exc:
            if not is_retryable(exc):
                self._fail(exc)
                return False
            self.last_error = exc
            log.warning(
                "changefeed %s: writing checkpoint %d failed (%s)%s",
                *(self.changefeed_id, ts, exc, "; not retried: stopping" if final else f"; retry {attempt + 1}"),
            )
            return False
        except Exception as exc:  # noqa: BLE001 - the writer's failure, reported through failure
            self._fail(exc)
            return False
        self.last_error = None
        return True

    def _fail(self, exc: BaseException) -> None:
        log.error("changefeed %s: writing the checkpoint failed: %r", self.changefeed_id, exc)
        self.failure = exc
