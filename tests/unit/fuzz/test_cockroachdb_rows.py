"""Fuzz: CockroachDB changefeed rows (JSON envelopes from the wire) → RowChange.

Every feed row yields a RowChange, a Resolved, or an
:class:`UnsupportedProtocolError` (6001) naming the table, the key and what is
wrong: never a JSONDecodeError, KeyError, TypeError or RecursionError.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.events import RowChange, TableName, TableSchema
from cdcflow.core.errors import UnsupportedProtocolError
from cdcflow.plugins.sources.cockroachdb.convert import FeedRow, Resolved, convert_row
from cdcflow.plugins.sources.cockroachdb.hlc import HLC
from cdcflow.plugins.sources.cockroachdb.types import column_info
from tests.unit.fuzz._mutate import mutated
from tests.unit.fuzz.profiles import FUZZ

TABLE = TableName("shop", "products", 105)
TYPES = [
    "INT8",
    "DECIMAL(10,2)",
    "FLOAT8",
    "TIMESTAMPTZ",
    "TIMESTAMP",
    "TIME",
    "BYTES",
    "JSONB",
    "BOOL",
    "DATE",
    "STRING",
    "UUID",
]
SCHEMA = TableSchema(
    TABLE, tuple(column_info(f"c{i}", t, nullable=i > 0, primary_key=i == 0) for i, t in enumerate(TYPES))
)
SCHEMAS = {"products": SCHEMA}
TS = HLC(1_700_000_000_123_456_789, 2)

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
VALUES = st.recursive(
    SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=10
)
GOOD = [
    1,
    12.5,
    1.5,
    "2024-01-02T03:04:05.123456Z",
    "2024-01-02T03:04:05",
    "12:34:56.5",
    "\\x0aff",
    {"a": [1, 2]},
    True,
    "2024-01-02",
    "s",
    "6f1e…",
]


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    def image() -> Any:
        shape = draw(st.sampled_from(["good", "hostile", "none", "scalar"]))
        if shape == "none":
            return None
        if shape == "scalar":
            return draw(VALUES)
        return {
            f"c{i}": (GOOD[i] if shape == "good" or draw(st.booleans()) else draw(VALUES)) for i in range(len(TYPES))
        }

    env: dict[str, Any] = {"after": image(), "before": image()}
    for field in ("updated", "mvcc_timestamp"):
        if draw(st.booleans()):
            env[field] = draw(st.sampled_from([str(TS), "1.0000000001"]) | SCALARS)
    return env


def _convert(row: FeedRow) -> RowChange | Resolved | None:
    try:
        return convert_row(row, SCHEMAS)
    except UnsupportedProtocolError as e:
        assert e.code == 6001
        if row.table is not None:
            assert e.detail["table"] == "shop.products" and e.detail["key"] == (row.key or b"").hex()
        return None


@FUZZ
@given(st.sampled_from([None, "products"]), st.binary(max_size=20), st.binary(max_size=200))
def test_random_bytes(table: str | None, key: bytes, value: bytes) -> None:
    _convert(FeedRow(table, key, value))


@FUZZ
@given(envelopes())
def test_hostile_envelopes(env: dict[str, Any]) -> None:
    _convert(FeedRow("products", b"[1]", json.dumps(env).encode()))
    _convert(FeedRow(None, None, json.dumps({"resolved": env.get("updated")}).encode()))


@FUZZ
@given(mutated(envelopes().map(lambda e: json.dumps(e).encode())))
def test_mutated_envelopes(value: bytes) -> None:
    _convert(FeedRow("products", b"[1]", value))


# --------------------------------------------------------------------------- regressions


@pytest.mark.parametrize(
    ("table", "value", "match"),
    [
        ("products", b"\xff", "not JSON"),
        ("products", b"[" * 100_000, "not JSON"),
        ("products", b"[1]", "not an object"),
        ("products", b'{"after": {"c0": 1}}', "updated"),
        ("products", json.dumps({"after": {"c0": 1}, "updated": "yesterday"}).encode(), "updated"),
        ("products", json.dumps({"after": [1], "updated": str(TS)}).encode(), "after"),
        ("products", json.dumps({"after": {"c0": "x"}, "updated": str(TS)}).encode(), "c0"),
        ("products", json.dumps({"after": {"c0": 1, "c1": [1]}, "updated": str(TS)}).encode(), "c1"),
        ("products", json.dumps({"after": {"c0": 1, "c3": "2024-99-99"}, "updated": str(TS)}).encode(), "c3"),
        ("products", json.dumps({"after": {"c0": 1, "c6": "\\xZZ"}, "updated": str(TS)}).encode(), "c6"),
        ("products", json.dumps({"after": {"c0": 1, "c2": "x"}, "updated": str(TS)}).encode(), "c2"),
        (None, b'{"resolved": [5]}', "resolved"),
        (None, b"{}", "resolved"),
    ],
)
def test_malformed_rows_are_coded_errors(table: str | None, value: bytes, match: str) -> None:
    with pytest.raises(UnsupportedProtocolError, match=match):
        convert_row(FeedRow(table, b"[1]" if table else None, value), SCHEMAS)


def test_valid_row_still_converts() -> None:
    env = {"after": dict(zip([f"c{i}" for i in range(len(TYPES))], GOOD, strict=True)), "updated": str(TS)}
    change = convert_row(FeedRow("products", b"[1]", json.dumps(env).encode()), SCHEMAS)
    assert isinstance(change, RowChange) and change.after is not None and change.after["c1"] == Decimal("12.5")
