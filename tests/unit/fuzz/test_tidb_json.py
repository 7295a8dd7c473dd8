"""Fuzz: TiDB binary JSON (JSON column values) from bytes a TiKV store sends.

Every input yields JSON text or a :class:`JSONFormatError` (a ValueError the
mounter turns into RowDecodeError 6001): never a RecursionError, never a
decoding that takes time or memory out of proportion to the input.
"""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.plugins.sources.tikv.tidb import jsonbin
from tests.unit.fuzz._mutate import mutated
from tests.unit.fuzz.profiles import FUZZ

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


def _decode(data: bytes) -> str | None:
    try:
        text = jsonbin.decode_json(data)
    except jsonbin.JSONFormatError:
        return None
    assert isinstance(text, str)
    return text


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    _decode(data)


@FUZZ
@given(st.sampled_from([jsonbin.OBJECT, jsonbin.ARRAY]), st.binary(max_size=200))
def test_random_container_bodies(tp: int, body: bytes) -> None:
    _decode(bytes([tp]) + body)


@FUZZ
@given(JSON_VALUES)
def test_valid_documents_decode_to_their_text(value: Any) -> None:
    text = _decode(jsonbin.encode_json(value))
    assert text is not None
    assert json.loads(text) == json.loads(json.dumps(value))


@FUZZ
@given(mutated(st.builds(jsonbin.encode_json, JSON_VALUES)))
def test_mutated_documents(data: bytes) -> None:
    started = time.monotonic()
    text = _decode(data)
    assert time.monotonic() - started < 2.0
    if text is not None:
        assert len(text) <= 64 * max(len(data), 1)


# --------------------------------------------------------------------------- hostile shapes


def _array(entries: list[tuple[int, int]], tail: bytes = b"", size: int | None = None) -> bytes:
    """An array body: ``entries`` of (type, offset-or-inline) then ``tail`` (offsets from the header)."""
    head = 8 + 5 * len(entries)
    body = b"".join(struct.pack("<BI", tp, off) for tp, off in entries) + tail
    return struct.pack("<II", len(entries), head + len(tail) if size is None else size) + body


def _nested_arrays(depth: int) -> bytes:
    """``[[[...]]]`` ``depth`` levels deep, each array's one entry pointing at the next, right after it."""
    # Each level is 13 bytes: its header (8) and one value entry (5) pointing at offset 13.
    levels = b"".join(
        struct.pack("<II", 1, 13 * (depth - 1 - i) + 8) + struct.pack("<BI", jsonbin.ARRAY, 13)
        for i in range(depth - 1)
    )
    last = struct.pack("<II", 0, 8)
    return bytes([jsonbin.ARRAY]) + levels + last


def test_nesting_up_to_the_limit_decodes() -> None:
    assert _decode(_nested_arrays(jsonbin.MAX_DEPTH)) == "[" * (jsonbin.MAX_DEPTH - 1) + "[]" + "]" * (
        jsonbin.MAX_DEPTH - 1
    )


@pytest.mark.parametrize("depth", [jsonbin.MAX_DEPTH + 1, 5000, 100_000])
def test_nesting_past_the_limit_is_refused(depth: int) -> None:
    with pytest.raises(jsonbin.JSONFormatError, match="nested deeper than"):
        jsonbin.decode_json(_nested_arrays(depth))


def test_container_pointing_at_itself_is_refused() -> None:
    # an array whose one value entry is an array at offset 0: itself
    with pytest.raises(jsonbin.JSONFormatError):
        jsonbin.decode_json(bytes([jsonbin.ARRAY]) + _array([(jsonbin.ARRAY, 0)]))


def test_shared_values_cannot_multiply_the_output() -> None:
    # 40 levels, each an array of two entries pointing at the same next level:
    # 2^40 leaves in 400 bytes when entries may share their value
    depth = 40
    level = 8 + 2 * 5
    data = b""
    for i in range(depth):
        nxt = level
        data += struct.pack("<II", 2, level * (depth - i) + 8) + struct.pack(
            "<BIBI", jsonbin.ARRAY, nxt, jsonbin.ARRAY, nxt
        )
    data += struct.pack("<II", 0, 8)
    started = time.monotonic()
    with pytest.raises(jsonbin.JSONFormatError, match="overlap"):
        jsonbin.decode_json(bytes([jsonbin.ARRAY]) + data)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    "data",
    [
        bytes([jsonbin.ARRAY]) + struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF),  # huge count and size
        bytes([jsonbin.OBJECT]) + struct.pack("<II", 0x0FFFFFFF, 16) + b"\x00" * 8,  # count past the end
        bytes([jsonbin.STRING]) + b"\xff\xff\xff\xff\x0f",  # a 4 GiB string in 6 bytes
        bytes([jsonbin.OPAQUE, 15]) + b"\xff\xff\xff\xff\x0f",
        bytes([jsonbin.ARRAY]) + _array([(jsonbin.STRING, 13)], b"\xff\xff\xff\x7f"),  # nested string too long
    ],
)
def test_declared_lengths_past_the_end_are_refused_before_allocating(data: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(jsonbin.JSONFormatError):
            jsonbin.decode_json(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def test_offset_past_the_container_is_refused() -> None:
    with pytest.raises(jsonbin.JSONFormatError, match="outside its container"):
        jsonbin.decode_json(bytes([jsonbin.ARRAY]) + _array([(jsonbin.INT64, 200)], b"\x00" * 8))
