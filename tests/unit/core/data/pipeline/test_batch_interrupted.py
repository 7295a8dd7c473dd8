"""A batch cut short by stopping its query fails quietly and short, and is not
checkpointed (Spark replays it on the next start)."""

import json
import logging

import pytest

from cdcflow.core.data.events import Span
from cdcflow.core.data.logservice import EventStore
from cdcflow.core.data.pipeline.runtime import _PY4J_FILTER, BatchInterruptedError, ChangefeedPipeline
from cdcflow.core.testing import insert

SPAN = Span(1, b"t1", b"t1~")


class _CancelledFrame:
    """A micro-batch whose Spark job is cancelled, as ``query.stop()`` does to a running batch."""

    def _cancelled(self, *args):
        raise RuntimeError("[SPARK_JOB_CANCELLED] Job 22 cancelled Query cdcflow-cf was stopped" + " at x" * 5000)

    toArrow = orderBy = _cancelled  # DataFrame's names


def _pipeline(tmp_path):
    store = EventStore(tmp_path / "store", "cf", start_ts=10, fsync=False)
    store.add_span(SPAN, 10, replicating=True)
    store.put(SPAN, insert("shop", "orders", {"id": 1}, commit_ts=15))
    store.resolve(SPAN, 20)  # one chunk: the batch has rows to read
    checkpoint_dir = tmp_path / "ckpt"
    (checkpoint_dir / "offsets").mkdir(parents=True)
    offset = {"resolved_ts": 20, "chunk": store.next_chunk}
    (checkpoint_dir / "offsets" / "0").write_text("v1\n{}\n" + json.dumps(offset))
    pipeline = ChangefeedPipeline(changefeed_id="cf", store=store, sinks=[], spark=None, checkpoint_dir=checkpoint_dir)
    return store, pipeline


def test_a_batch_cancelled_by_stop_raises_a_short_error_and_is_not_checkpointed(tmp_path):
    store, pipeline = _pipeline(tmp_path)
    pipeline._stopping.set()
    with pytest.raises(BatchInterruptedError) as raised:
        pipeline._on_batch(_CancelledFrame(), 0)
    assert raised.value.__suppress_context__ and raised.value.__cause__ is None
    assert len(str(raised.value)) < 200
    assert store.checkpoint_ts == 10


def test_a_batch_failing_while_running_keeps_its_error(tmp_path):
    store, pipeline = _pipeline(tmp_path)
    with pytest.raises(RuntimeError, match="SPARK_JOB_CANCELLED"):
        pipeline._on_batch(_CancelledFrame(), 0)
    assert store.checkpoint_ts == 10


def test_py4j_does_not_log_an_interrupted_batch_as_an_error():
    def record(error):
        info = (type(error), error, None)
        return logging.LogRecord("py4j.clientserver", logging.ERROR, "x", 1, "proxy failed", (), info)

    assert not _PY4J_FILTER.filter(record(BatchInterruptedError("stopped")))
    assert _PY4J_FILTER.filter(record(RuntimeError("a real failure")))
