"""The pipeline's checkpoint writer: the changefeed checkpoint reaches every sink off
the caller's thread, never during a batch's writes, only forward; errors as for batches."""

from __future__ import annotations

import threading

from cdcflow.core.data.pipeline.checkpoints import CheckpointWriter
from cdcflow.core.errors import ConfigInvalidError, DownstreamUnavailableError
from cdcflow.core.testing import ListSink, until_sync

WAIT = 30.0  # seconds a step may take at most on a loaded machine (a hang, not a speed check)


class GatedSink(ListSink):
    """A list sink whose ``write_checkpoint`` fails ``failures`` times first, and notes
    whether a batch was being written when it was called."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        super().__init__()
        self.failures = list(failures or [])
        self.in_batch = False
        self.overlapped = False
        self.written = threading.Event()

    def write_checkpoint(self, ts: int) -> None:
        self.overlapped |= self.in_batch
        if self.failures:
            raise self.failures.pop(0)
        super().write_checkpoint(ts)
        self.written.set()


def test_checkpoints_wait_for_the_batch_being_written_and_only_move_forward():
    lock = threading.Lock()
    sink = GatedSink()
    writer = CheckpointWriter("cf", [sink, ListSink()], lock)
    with lock:  # a batch is being written
        sink.in_batch = True
        writer.offer(100)
        writer.offer(90)  # lower: ignored
        writer.offer(120)
        # Time passes on purpose (not a wait on a condition): room for a writer that
        # ignores the lock to write now, which ``overlapped`` would then show.
        threading.Event().wait(0.2)
        sink.in_batch = False
    assert sink.written.wait(WAIT)
    until_sync(lambda: writer.written_ts == 120, timeout=WAIT)
    assert not sink.overlapped
    assert sink.checkpoints in ([120], [100, 120])  # the newest; an older one only if taken before
    writer.offer(120)  # a repeat: not written again
    writer.offer(130)
    writer.stop()
    assert sink.checkpoints[-1] == 130 and sink.checkpoints.count(120) == 1
    assert writer.written_ts == 130 and writer.last_error is None and writer.failure is None


def test_retryable_errors_are_retried_and_reported_meanwhile():
    unavailable = DownstreamUnavailableError("brokers down")
    sink = GatedSink([unavailable, unavailable])
    writer = CheckpointWriter("cf", [sink], threading.Lock())
    writer.offer(100)
    until_sync(lambda: writer.last_error is unavailable, timeout=WAIT)  # the changefeed shows the warning
    assert sink.written.wait(WAIT)
    until_sync(lambda: writer.last_error is None, timeout=WAIT)
    writer.stop()
    assert sink.checkpoints == [100] and writer.failure is None


def test_a_fatal_error_stops_the_writer():
    sink = GatedSink([ConfigInvalidError("bad topic")])
    writer = CheckpointWriter("cf", [sink], threading.Lock())
    writer.offer(100)
    until_sync(lambda: writer.failure is not None, timeout=WAIT)
    writer.offer(200)
    writer.stop()
    assert isinstance(writer.failure, ConfigInvalidError)
    assert sink.checkpoints == []


def test_stop_writes_the_newest_checkpoint_not_written_yet():
    lock = threading.Lock()
    sink = GatedSink()
    writer = CheckpointWriter("cf", [sink], lock)
    with lock:
        writer.offer(100)
        writer.offer(140)
    writer.stop()
    assert sink.checkpoints[-1] == 140
