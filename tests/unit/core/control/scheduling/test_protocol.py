import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.control.scheduling import (
    AddSpan,
    CaptureLiveness,
    DispatchTableRequest,
    DispatchTableResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    RemoveSpan,
    decode_message,
    encode_message,
)
from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SnapshotReport, SpanState, SpanStatus

spans = st.builds(Span, st.integers(0, 2**40), st.binary(max_size=8), st.binary(max_size=8))
ts = st.integers(0, 2**64 - 1)
statuses = st.builds(SpanStatus, spans, st.sampled_from(SpanState), ts, ts)
counts = st.integers(0, 2**40)
reports = st.builds(
    SnapshotReport,
    st.none() | spans,
    st.sampled_from(["region", "range"]),
    st.sampled_from(["read", "deliver", "done"]),
    counts,
    counts,
    counts,
    counts,
    st.floats(0, 2e9, allow_nan=False),
)
head = (st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8), st.integers(0, 2**31))
messages = st.one_of(
    st.builds(HeartbeatRequest, *head, checkpoint_ts=ts),
    st.builds(HeartbeatResponse, *head, st.tuples(statuses, statuses), st.sampled_from(CaptureLiveness)),
    st.builds(
        HeartbeatResponse,
        *head,
        st.tuples(statuses),
        st.sampled_from(CaptureLiveness),
        snapshot=st.lists(reports, max_size=3).map(tuple),
    ),
    st.builds(DispatchTableResponse, *head, statuses),
    st.builds(DispatchTableRequest, *head, st.builds(AddSpan, spans, ts, st.booleans())),
    st.builds(DispatchTableRequest, *head, st.builds(RemoveSpan, spans)),
)


@given(messages)
def test_encoding_round_trips_through_json(msg):
    assert decode_message(json.loads(json.dumps(encode_message(msg)))) == msg


def test_unknown_type_is_refused():
    with pytest.raises(ValueError, match="not a scheduling message"):
        decode_message({"type": "nope", "changefeed_id": "cf", "capture_id": "c", "epoch": 1})
