"""A batch's frames for Sink.write_frame: given, or made on first read and only then."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from cdcflow.core.data.sink import BatchFrame, RowDecoder


class _NoDecoder(RowDecoder):
    def rows(self, batch: Any) -> list[Any]:
        raise AssertionError("not decoded here")


def test_frames_given_are_the_frames_read() -> None:
    frame, ordered = object(), object()
    rows = BatchFrame(frame, _NoDecoder(), 10, False, ordered)
    assert rows.frame is frame and rows.ordered is ordered
    assert BatchFrame(frame, _NoDecoder(), 10).ordered is None


def test_frames_given_as_functions_are_made_once_on_first_read_and_only_then() -> None:
    made: list[str] = []

    def maker(name: str) -> Any:
        def make() -> str:
            made.append(name)
            return f"{name} frame"

        return make

    rows = BatchFrame(maker("records"), _NoDecoder(), 10, False, maker("ordered"))
    assert made == []
    threads = [threading.Thread(target=lambda: rows.ordered) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == ["ordered"] and rows.ordered == "ordered frame"
    assert rows.frame == "records frame" and rows.frame == "records frame"
    assert made == ["ordered", "records"]


def test_a_batch_frame_stays_a_frozen_dataclass() -> None:
    rows = BatchFrame(lambda: "records frame", _NoDecoder(), 10)
    other = dataclasses.replace(rows, expected_rows=20)
    assert (other.frame, other.expected_rows, other.ordered) == ("records frame", 20, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows.frame = "another"  # type: ignore[misc]
