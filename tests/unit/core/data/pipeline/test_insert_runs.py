"""An initial snapshot's record batches (raw puts of one table at one ts) are mounted as
one InsertRun and written whole by sinks that take runs (Kafka's table lane, Open
Protocol's encoder): the same rows and the same bytes the row-by-row path gives."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pyarrow as pa
import pytest

from cdcflow.core.data.codec import EncodedMessage
from cdcflow.core.data.events import InsertRun, MicroBatch, RawKVEvent, RowChange, Span
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice.records import raw_puts_batch
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.pipeline.tasks import RowPlan, WriteTask
from cdcflow.core.data.sink import LaneWriter
from cdcflow.core.data.source import BatchMounter
from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
from cdcflow.plugins.sinks.kafka.dispatch import DispatchRule, EventRouter
from cdcflow.plugins.sinks.kafka.sink import _KafkaTaskWriter
from cdcflow.plugins.sources.playground.catalog import Column
from cdcflow.plugins.sources.playground.shop import SHOP_TABLES, random_value
from cdcflow.plugins.sources.tikv.tidb import keys, rowcodec
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBBatchMounter
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBColumn, TiDBDatabase, TiDBTable
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore

TABLE_ID = 100
OTHER_ID = 101
TS = 5_000


def _store() -> tuple[SchemaStore, dict[int, list[Column]]]:
    store = SchemaStore()
    store.add_database(TiDBDatabase(1, "shop"))
    columns = {}
    for table_id, name in ((TABLE_ID, "orders"), (OTHER_ID, "customers")):
        cols = [Column(n + 1, c, ft) for n, (c, ft) in enumerate(SHOP_TABLES[name])]
        fields = tuple(TiDBColumn(c.id, c.name, o, c.ft) for o, c in enumerate(cols))
        tidb = TiDBTable(table_id, name, fields, pk_is_handle=True)
        store.add_table(1, "shop", tidb, 10)
        columns[table_id] = cols
    return store.snapshot(0, TS + 10), columns


STORE, COLUMNS = _store()
SPANS = {1: Span(TABLE_ID, *keys.table_record_span(TABLE_ID)), 2: Span(OTHER_ID, *keys.table_record_span(OTHER_ID))}


def _pairs(table_id: int, rows: int, seed: int = 3, first: int = 1) -> tuple[list[bytes], list[bytes]]:
    rng = random.Random(seed)
    cols = COLUMNS[table_id]
    ks = [keys.record_key(table_id, h) for h in range(first, first + rows)]
    vs = [rowcodec.encode_row({c.id: (c.ft, random_value(rng, c)) for c in cols[1:]}) for _ in range(rows)]
    return ks, vs


def _rows_one_by_one(mounter: BatchMounter, ks: Sequence[bytes], vs: Sequence[bytes]) -> list[RowChange | None]:
    return mounter.mount_many([RawKVEvent(SPANS[1], k, v, b"", TS, TS) for k, v in zip(ks, vs, strict=True)])


def test_a_tables_puts_at_one_ts_mount_as_one_run_of_the_rows_mounted_one_by_one() -> None:
    mounter = TiDBBatchMounter(STORE)
    ks, vs = _pairs(TABLE_ID, 500)
    run = mounter.mount_inserts(SPANS[1], ks, vs, TS, TS)
    assert isinstance(run, InsertRun) and len(run) == 500
    assert run.rows() == _rows_one_by_one(mounter, ks, vs)
    assert any(row.after["note"] is None for row in run.rows())  # NULLs among them
    assert run.slice(10, 20).rows() == run.rows()[10:20]


def test_puts_the_run_does_not_take_are_left_to_the_row_path() -> None:
    mounter = TiDBBatchMounter(STORE)
    ks, vs = _pairs(TABLE_ID, 20)
    other_ks, other_vs = _pairs(OTHER_ID, 1)
    assert mounter.mount_inserts(SPANS[1], ks + other_ks, vs + other_vs, TS, TS) is None  # two tables
    assert mounter.mount_inserts(SPANS[1], ks, [*vs[:-1], b""], TS, TS) is None  # a delete's empty value
    assert mounter.mount_inserts(SPANS[1], ks, [*vs[:-1], b"\x80\x01"], TS, TS) is None  # not a v2 row
    assert mounter.mount_inserts(SPANS[1], [*ks[:-1], b"m" + ks[-1][1:]], vs, TS, TS) is None  # not a record key
    assert mounter.mount_inserts(SPANS[1], [], [], TS, TS) is None
    assert BatchMounter.mount_inserts(mounter, SPANS[1], ks, vs, TS, TS) is None  # the contract's default


class _Recorded(_KafkaTaskWriter):
    """The Kafka sink's task writer, each lane's messages packed and kept instead of produced."""

    messages: dict[tuple[str, int], list[bytes]]

    def open_lanes(self, batch: MicroBatch, partition: int) -> LaneWriter:
        return _Keep(self)


class _Keep(LaneWriter):
    def __init__(self, target: _Recorded) -> None:
        self.target = target

    def write(self, route: str, lane: int, parts: Sequence[EncodedMessage]) -> None:
        kept = self.target.messages.setdefault((route, lane), [])
        kept += [m.key + m.value for m in self.target.codec.assemble(route, parts)]

    def flush(self) -> None:
        pass


def _written(batches: list[pa.RecordBatch], rule: str, monkeypatch: pytest.MonkeyPatch | None = None, **codec) -> dict:
    if monkeypatch is not None:  # the row path: a mounter that takes no runs
        monkeypatch.setattr(TiDBBatchMounter, "mount_inserts", BatchMounter.mount_inserts)
    router = EventRouter("snap", [DispatchRule(partition=rule)])
    writer = _Recorded({}, router, OpenProtocolCodec(OpenProtocolConfig(**codec)), {"snap": 3}, 10.0, "test")
    writer.messages = {}
    plan = RowPlan("cf", "/nonexistent", SPANS, TiDBBatchMounter(STORE), TableFilter(["shop.orders"]))
    summary = list(WriteTask(plan, MicroBatch("cf", -1, TS, TS), (writer,), ColumnSelection())(iter(batches)))
    assert pa.Table.from_batches(summary).column("error").to_pylist() == [b""]
    if monkeypatch is not None:
        monkeypatch.undo()
    return writer.messages


def _snapshot_batches() -> list[pa.RecordBatch]:
    ks, vs = _pairs(TABLE_ID, 9_000)
    other_ks, other_vs = _pairs(OTHER_ID, 50)
    return [
        raw_puts_batch(ks[:8_192], vs[:8_192], 1, TABLE_ID, TS),
        raw_puts_batch(other_ks, other_vs, 2, OTHER_ID, TS),  # filtered out
        raw_puts_batch(ks[8_192:], vs[8_192:], 1, TABLE_ID, TS),
    ]


@pytest.mark.parametrize("rule", ["table", "default"])
def test_a_snapshot_written_in_runs_gives_the_bytes_of_the_row_path(rule: str, monkeypatch) -> None:
    batches = _snapshot_batches()
    runs = _written(batches, rule)
    rows = _written(batches, rule, monkeypatch)
    assert runs == rows
    assert sum(len(m) for m in runs.values()) >= 9_000 // 16  # Open Protocol's batches of 16 rows
    if rule == "table":
        assert len(runs) == 1  # the table's one lane


def test_rows_over_the_message_limit_and_images_left_to_python_are_encoded_as_rows_are(monkeypatch) -> None:
    ks, vs = _pairs(TABLE_ID, 300)
    cols = {c.name: c for c in COLUMNS[TABLE_ID]}
    rng = random.Random(5)
    for i in range(0, 300, 7):  # a note of 255 "<", HTML-escaped to 1,530 bytes: over 1,024
        image = {c.id: (c.ft, random_value(rng, c)) for c in COLUMNS[TABLE_ID][1:]}
        image[cols["note"].id] = (cols["note"].ft, "<" * 255)
        vs[i] = rowcodec.encode_row(image)
    batches = [raw_puts_batch(ks, vs, 1, TABLE_ID, TS)]
    codec = {"max_message_bytes": 1024, "large_message_handle_option": "handle-key-only"}
    assert _written(batches, "table", **codec) == _written(batches, "table", monkeypatch, **codec)
    codec = OpenProtocolCodec(OpenProtocolConfig())
    run = TiDBBatchMounter(STORE).mount_inserts(SPANS[1], ks, vs, TS, TS)
    assert run is not None
    # An image the C writer does not take (a value of a type it leaves to Python).
    odd = InsertRun(run.table, run.schema, TS, TS, run.keys[:2], [{**run.afters[0], "quantity": 7.0}, run.afters[1]])
    assert codec.encode_insert_parts("t", odd) == codec.encode_row_parts("t", odd.rows())


def test_batches_that_are_not_one_tables_puts_at_one_ts_are_mounted_row_by_row() -> None:
    ks, vs = _pairs(TABLE_ID, 10)
    plan = RowPlan("cf", "/nonexistent", SPANS, TiDBBatchMounter(STORE), TableFilter(["shop.*"]))
    one = raw_puts_batch(ks, vs, 1, TABLE_ID, TS)
    two_ts = pa.concat_batches([one.slice(0, 5), raw_puts_batch(ks[5:], vs[5:], 1, TABLE_ID, TS + 1)])
    updates = one.set_column(11, "old_value", pa.array([vs[0]] * 10, pa.binary()))
    kinds = [type(r) for b in (one, two_ts, updates) for r in plan.runs([b])]
    assert kinds == [InsertRun, list, list]
    rows = [r for r in next(plan.runs([updates]))]
    assert [r.op.value for r in rows] == ["update"] * 10
