"""The Spark sink's ``frame-writes`` option: true, false, or auto (the default)."""

from __future__ import annotations

import pydantic
import pytest

from cdcflow.plugins.sinks.spark import SparkSinkConfig


def test_frame_writes_defaults_to_auto() -> None:
    assert SparkSinkConfig().frame_writes == "auto"


@pytest.mark.parametrize(
    ("given", "value"), [("auto", "auto"), ("true", True), ("false", False), (True, True), (False, False)]
)
def test_frame_writes_takes_a_boolean_or_auto(given: object, value: object) -> None:
    assert SparkSinkConfig.model_validate({"frame-writes": given}).frame_writes == value


def test_another_word_is_refused_naming_the_option() -> None:
    with pytest.raises(pydantic.ValidationError, match="frame-writes"):
        SparkSinkConfig.model_validate({"frame-writes": "sometimes"})
