"""The test kit's canal-json consumer rebuilds tables from what cdcflow's codec writes."""

from __future__ import annotations

import datetime as dt
import decimal

from cdcflow.core.data.events import ColumnInfo, OpType, RowChange, TableName, TableSchema, tso_from_ms
from cdcflow.core.testing.canal_json import decode, rebuild, typed_value
from cdcflow.plugins.codecs.canal_json import CanalJsonCodec, CanalJsonConfig

T = TableName("shop", "items", 3)
PK = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY
SCHEMA = TableSchema(
    T,
    (
        ColumnInfo("id", 8, PK),
        ColumnInfo("price", 246, ColumnInfo.NULLABLE, sql_type="decimal(10,2)"),
        ColumnInfo("at", 12, ColumnInfo.NULLABLE),
        ColumnInfo("window", 11, ColumnInfo.NULLABLE),
        ColumnInfo("raw", 252, ColumnInfo.NULLABLE | ColumnInfo.BINARY),
        ColumnInfo("name", 15, ColumnInfo.NULLABLE),
    ),
)


def ts(n: int) -> int:
    return tso_from_ms(1_700_000_000_000 + n, 0)


def row(i: int, name: str = "a") -> dict[str, object]:
    return {
        "id": i,
        "price": decimal.Decimal("12.50"),
        "at": dt.datetime(2024, 5, 6, 7, 8, 9),
        "window": dt.timedelta(hours=-3, minutes=-4),
        "raw": b"\xff\x00\x01",
        "name": name,
    }


def change(op: OpType, commit: int, after: dict[str, object] | None, before: dict[str, object] | None = None):
    return RowChange(T, op, ts(commit), ts(commit) - 1, after, before, SCHEMA)


def encode(codec: CanalJsonCodec, *items: RowChange | int) -> list[dict]:
    """Messages of row changes, and of watermarks for the ints."""
    out = []
    for item in items:
        if isinstance(item, int):
            message = codec.encode_resolved(ts(item))
            assert message is not None
            out.append(decode(message.value))
        else:
            out += [decode(m.value) for m in codec.encode_rows([item])]
    return out


def test_values_come_back_typed_from_the_codecs_text():
    [doc] = encode(CanalJsonCodec(CanalJsonConfig()), change(OpType.INSERT, 1, row(1)))
    replica = rebuild({0: [doc]})
    assert replica.tables[("shop", "items")] == {(1,): row(1)}
    assert typed_value("0000-00-00 00:00:00", "datetime") == "0000-00-00 00:00:00"  # zero dates stay text
    assert typed_value(None, "int") is None


def test_with_watermarks_duplicates_are_dropped_and_rows_above_the_last_watermark_wait():
    codec = CanalJsonCodec(CanalJsonConfig(enable_tidb_extension=True))
    first = change(OpType.INSERT, 1, row(1))
    moved = change(OpType.UPDATE, 6, row(10, "b"), row(1))  # the key moves from 1 to 10
    p0 = encode(codec, first, change(OpType.INSERT, 2, row(2)), 5, first, moved, 9, change(OpType.INSERT, 12, row(3)))
    p1 = encode(codec, 5, change(OpType.DELETE, 7, None, row(2)), 9, 12 - 1)
    replica = rebuild({0: p0, 1: p1})
    assert replica.resolved_ts == ts(9)  # partition 0 has not passed 11
    assert replica.duplicates_dropped == 1  # the replayed insert at 1, below partition 0's watermark 5
    assert replica.tables[("shop", "items")] == {(10,): row(10, "b")}


def test_without_watermarks_a_replayed_suffix_ends_in_the_same_state():
    codec = CanalJsonCodec(CanalJsonConfig())
    changes = [
        change(OpType.INSERT, 1, row(1)),
        change(OpType.INSERT, 2, row(2)),
        change(OpType.UPDATE, 3, row(2, "c"), row(2)),
        change(OpType.DELETE, 4, None, row(1)),
    ]
    replayed = encode(codec, *changes, *changes[1:])
    replica = rebuild({0: replayed, 1: []})
    assert replica.resolved_ts == 0
    assert replica.tables[("shop", "items")] == {(2,): row(2, "c")}
