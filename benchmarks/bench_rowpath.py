"""Per-row CPU cost of a task: mounting the playground's shop rows, and encoding them as Open Protocol.

Run:  .venv/bin/python benchmarks/bench_rowpath.py [--rows N] [--rounds R] [--profile STAGE]

Builds ``N`` raw writes spread over the three ``shop`` tables (the
playground workload's schema: ints, unsigned, varchar, decimal, double,
datetime, timestamp, duration, enum, JSON, nullable columns; one insert in
two, then updates with old values and deletes), all committed in one batch's
ts range with two schema versions of each table, and measures in each round,
in one process:

* mount — the batch mounter a Spark task gets (:class:`TiDBBatchMounter`):
  ``mount_many`` over the whole list when the mounter has it, else ``mount``
  per event;
* encode — :class:`OpenProtocolCodec.encode_rows` over the mounted rows, in
  chunks of 4,096 rows (what a task hands its Kafka writer at a time);
* task — the same events as the event store's Arrow record batches (4,096
  records each) through a :class:`WriteTask` with the Kafka sink's task writer
  (Arrow → raw events → mounted, filtered rows → routed by the table dispatcher
  to a 3-partition topic, encoded, each lane's parts packed into messages): a
  write task's CPU work short of the Kafka client;
* snapshot task / snapshot task rows — the task above over an initial snapshot's
  record batches (``N`` inserts of ``shop.orders`` read at one ts, 8,192 a batch, as
  its parts hold them): mounted as one run per batch and written whole
  (:meth:`BatchMounter.mount_inserts`, ``write_inserts``), then the same batches with
  a mounter that declines runs, row by row (``rows``; the ratio of the two is printed);
* encode step / lane step — the two steps of a batch whose rows are kept in
  order per table (Kafka's default table dispatcher, see
  :class:`~cdcflow.core.data.sink.LaneTaskWriter`): the same batches through an
  :class:`EncodeTask` (mount, route, encode each row's part, Arrow out), and its
  output, sorted by lane as Spark sorts it, through a :class:`LaneTask` whose
  lanes are packed into Open Protocol messages (not produced);
* parts step / unpack step — the Spark sink's tasks when it writes a batch
  from its frame (``frame-writes``; a catch-up's and an initial snapshot's
  batches by default): the same batches through a :class:`RowsTask` running
  the sink's :class:`PartsTask` (mount, then each table's change log columns
  as Arrow IPC parts, in one pass), then each table's parts through its
  :class:`UnpackTask` (read, brought to the batch's types, ``seq`` moved;
  Spark's Parquet write not included).

Where the mounter's C row decoder (``_rowfast``) and the codec's C image
writer (``_opfast``) are built, mount, encode and encode step run a second
time in each round with both turned off (``mount python``, ``encode python``,
``encode step python``), so both ways are compared in one run.

It prints rows/s of each (median over rounds), by the wall clock and per
CPU-second of the process (steadier when other work shares the cores). The
same file runs against
another checkout by putting a ``cdcflow`` directory whose ``core`` and
``plugins`` link to that checkout first on ``PYTHONPATH``, so two builds
compare under the same machine load. ``--profile`` runs one stage under
cProfile and prints its top costs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import gc
import pickle
import pstats
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.core.data.codec import EncodedMessage
from cdcflow.core.data.events import MicroBatch, RawKVEvent, RowChange, Span, TableSchema
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice.records import raw_puts_batch, record_from_event, records_to_batch
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.pipeline.tasks import LANE_ORDER, EncodeTask, LaneTask, RowPlan, RowsTask, WriteTask
from cdcflow.core.data.sink import LaneWriter
from cdcflow.core.data.source import BatchMounter
from cdcflow.plugins.codecs import open_protocol
from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
from cdcflow.plugins.sinks.kafka.dispatch import EventRouter
from cdcflow.plugins.sinks.kafka.sink import _KafkaTaskWriter
from cdcflow.plugins.sinks.spark.batchframe import PartsTask, TableRows, UnpackTask, changelog_columns, read_parts
from cdcflow.plugins.sources.playground.catalog import Column
from cdcflow.plugins.sources.playground.shop import SHOP_TABLES, random_value
from cdcflow.plugins.sources.tikv.tidb import keys, rowcodec
from cdcflow.plugins.sources.tikv.tidb import mounter as tidb_mounter
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBBatchMounter
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBColumn, TiDBDatabase, TiDBTable
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore

#: Rows handed to a task's writers at a time (core.data.pipeline.tasks).
CHUNK = 4_096
FIRST_TABLE_ID = 100


def build(rows: int, seed: int = 7) -> tuple[TiDBBatchMounter, list[RawKVEvent]]:
    """A batch mounter over the shop tables (two versions each) and ``rows`` raw writes."""
    rng = random.Random(seed)
    store = SchemaStore()
    store.add_database(TiDBDatabase(1, "shop"))
    tables: list[tuple[int, list[Column]]] = []
    for i, (name, spec) in enumerate(sorted(SHOP_TABLES.items())):
        table_id = FIRST_TABLE_ID + i
        columns = [Column(n + 1, col_name, ft) for n, (col_name, ft) in enumerate(spec)]
        tidb = TiDBTable(
            table_id,
            name,
            tuple(TiDBColumn(c.id, c.name, offset, c.ft) for offset, c in enumerate(columns)),
            pk_is_handle=True,
        )
        for ts in (10, 1_000 + rows):  # a second version mid-batch: rows above it use it
            store.add_table(1, "shop", tidb, ts)
        tables.append((table_id, columns))
    snapshot = store.snapshot(0, 10_000 + 4 * rows)
    events: list[RawKVEvent] = []
    live: dict[int, list[tuple[int, bytes]]] = {tid: [] for tid, _ in tables}
    for n in range(rows):
        table_id, columns = tables[n % len(tables)]
        span = Span(table_id, *keys.table_record_span(table_id))
        commit_ts = 2_000 + 2 * n
        rows_of = live[table_id]
        choice = rng.random()
        value = rowcodec.encode_row({c.id: (c.ft, random_value(rng, c)) for c in columns[1:]})
        if not rows_of or choice < 0.5:
            handle = len(rows_of) + 1 + 1_000_000 * n
            rows_of.append((handle, value))
            events.append(RawKVEvent(span, keys.record_key(table_id, handle), value, b"", commit_ts - 1, commit_ts))
        elif choice < 0.85:
            i = rng.randrange(len(rows_of))
            handle, old = rows_of[i]
            rows_of[i] = (handle, value)
            key = keys.record_key(table_id, handle)
            events.append(RawKVEvent(span, key, value, old, commit_ts - 1, commit_ts))
        else:
            handle, old = rows_of.pop(rng.randrange(len(rows_of)))
            key = keys.record_key(table_id, handle)
            events.append(RawKVEvent(span, key, b"", old, commit_ts - 1, commit_ts, delete=True))
    return snapshot_mounter(snapshot), events


@contextlib.contextmanager
def pure_python() -> Iterator[None]:
    """The mounter's layouts decoded and the codec's images written in Python, as where
    the C extensions are not built."""
    native, tidb_mounter.NATIVE = tidb_mounter.NATIVE, None
    writer, open_protocol.NATIVE = open_protocol.NATIVE, None
    try:
        yield
    finally:
        tidb_mounter.NATIVE = native
        open_protocol.NATIVE = writer


def snapshot_mounter(snapshot: SchemaStore) -> TiDBBatchMounter:
    return TiDBBatchMounter(snapshot)


def mount_all(mounter: TiDBBatchMounter, events: Sequence[RawKVEvent]) -> list[RowChange]:
    many = getattr(mounter, "mount_many", None)
    mounted: list[Any] = many(events) if many is not None else [mounter.mount(e) for e in events]
    rows = [r for r in mounted if r is not None]
    if len(rows) != len(events):
        raise SystemExit(f"{len(events) - len(rows)} events did not mount")
    return rows


def new_codec() -> OpenProtocolCodec:
    return OpenProtocolCodec(OpenProtocolConfig())


def encode_all(codec: OpenProtocolCodec, rows: Sequence[RowChange]) -> int:
    messages = 0
    for i in range(0, len(rows), CHUNK):
        messages += len(codec.encode_rows(rows[i : i + CHUNK]))
    return messages


def record_batches(events: Sequence[RawKVEvent]) -> tuple[dict[int, Span], list[pa.RecordBatch]]:
    """The events as the event store's records (span id = table id), in Arrow batches of CHUNK."""
    spans = {e.span.table_id: e.span for e in events}
    records = [record_from_event(e, e.span.table_id, _NoIds()) for e in events]
    return spans, [records_to_batch(records[i : i + CHUNK]) for i in range(0, len(records), CHUNK)]


class _NoIds:
    def id_of(self, schema: object) -> int:
        return -1


def run_task(plan: RowPlan, batches: Sequence[pa.RecordBatch]) -> int:
    """A write task over ``batches`` with the Kafka sink's task writer, its lanes packed, not produced."""
    head = MicroBatch("bench", 0, 0, 0)
    summaries = list(WriteTask(plan, head, (lane_writer(),), ColumnSelection())(iter(batches)))
    return sum(pa.Table.from_batches(summaries).column("rows").to_pylist())


class _PackOnly(_KafkaTaskWriter):
    """The Kafka sink's task writer (routing, table dispatcher, codec) whose lanes are
    packed into messages and dropped instead of produced."""

    def open_lanes(self, batch: MicroBatch, partition: int) -> LaneWriter:
        return _Packer(self)


class _Packer(LaneWriter):
    def __init__(self, target: _PackOnly) -> None:
        self.target = target
        self.messages = 0

    def write(self, route: str, lane: int, parts: Sequence[EncodedMessage]) -> None:
        self.messages += len(self.target.codec.assemble(route, parts))

    def flush(self) -> None:
        pass


def lane_writer() -> _PackOnly:
    codec = OpenProtocolCodec(OpenProtocolConfig())
    return _PackOnly({}, EventRouter("bench", []), codec, {"bench": 3}, 10.0, "bench")


#: The ts an initial snapshot's rows are read at (the first schema version's range, see build).
SNAPSHOT_TS = 500


def snapshot_batches(rows: int, seed: int = 11) -> tuple[dict[int, Span], list[pa.RecordBatch]]:
    """``rows`` rows of shop.orders read at SNAPSHOT_TS, as an initial snapshot's parts
    hold them: raw puts of one span, 8,192 records a batch."""
    rng = random.Random(seed)
    table_id = FIRST_TABLE_ID + sorted(SHOP_TABLES).index("orders")
    columns = [Column(n + 1, name, ft) for n, (name, ft) in enumerate(SHOP_TABLES["orders"])]
    ks = [keys.record_key(table_id, handle) for handle in range(1, rows + 1)]
    vs = [rowcodec.encode_row({c.id: (c.ft, random_value(rng, c)) for c in columns[1:]}) for _ in ks]
    spans = {1: Span(table_id, *keys.table_record_span(table_id))}
    return spans, [
        raw_puts_batch(ks[i : i + 8_192], vs[i : i + 8_192], 1, table_id, SNAPSHOT_TS) for i in range(0, rows, 8_192)
    ]


class RowsOnly(BatchMounter):
    """A batch mounter that declines runs (``mount_inserts``' default): every row mounted one by one."""

    def __init__(self, mounter: BatchMounter) -> None:
        self.mounter = mounter

    def mount(self, event: RawKVEvent) -> RowChange | None:
        return self.mounter.mount(event)

    def mount_many(self, events: Sequence[RawKVEvent]) -> list[RowChange | None]:
        return self.mounter.mount_many(events)

    def schemas(self) -> Sequence[TableSchema]:
        return self.mounter.schemas()


def run_encode_step(plan: RowPlan, batches: Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
    return list(EncodeTask(plan, (lane_writer(),), ColumnSelection())(iter(batches)))


def by_lane(encoded: list[pa.RecordBatch]) -> pa.Table:
    """The encode step's output sorted by lane, as the lane step's partition gets it (not timed)."""
    return pa.Table.from_batches(encoded).sort_by([(c, "ascending") for c in LANE_ORDER])


def run_lane_step(parts: pa.Table) -> int:
    head = MicroBatch("bench", 0, 0, 0)
    summaries = list(LaneTask(head, (lane_writer(),))(iter(parts.to_batches(max_chunksize=CHUNK))))
    return sum(pa.Table.from_batches(summaries).column("rows").to_pylist())


def run_parts_step(plan: RowPlan, batches: Sequence[pa.RecordBatch]) -> pa.Table:
    task = PartsTask(0, {}, changelog=True, changes=False)
    return pa.Table.from_batches(list(RowsTask(plan, ColumnSelection(), task)(iter(batches))))


def read_found(parts: pa.Table) -> dict[tuple[str, str], TableRows]:
    """What the driver reads of the parts (not timed)."""
    return read_parts(parts.drop_columns(["payload"]).to_pylist())


def by_table(parts: pa.Table) -> dict[tuple[str, str], list[pa.RecordBatch]]:
    """Each table's parts, as the sink's per-table frame hands them to its tasks (not timed)."""
    names = set(zip(parts.column("schema_name").to_pylist(), parts.column("table_name").to_pylist(), strict=True))
    out = {}
    for schema, table in names:
        match = pc.and_(pc.equal(parts.column("schema_name"), schema), pc.equal(parts.column("table_name"), table))
        out[(schema, table)] = parts.filter(match).to_batches()
    return out


def run_unpack_step(
    found: dict[tuple[str, str], TableRows], tables: dict[tuple[str, str], list[pa.RecordBatch]]
) -> int:
    rows = 0
    for name, table in found.items():
        task = UnpackTask(changelog_columns(table.whole.types), table.whole.offsets, "seq")
        for out in task(iter(tables[name])):
            rows += out.num_rows
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--profile",
        choices=(
            "mount",
            "encode",
            "task",
            "snapshot-task",
            "snapshot-task-rows",
            "encode-step",
            "lane-step",
            "parts-step",
            "unpack-step",
        ),
        help="profile one stage instead",
    )
    args = parser.parse_args()
    mounter, events = build(args.rows)
    rows = mount_all(pickle.loads(pickle.dumps(mounter)), events)
    spans, batches = record_batches(events)
    snapshot_spans, snapshot = snapshot_batches(args.rows)
    with tempfile.TemporaryDirectory() as store_dir:

        def task_plan() -> RowPlan:
            return RowPlan("bench", store_dir, spans, pickle.loads(pickle.dumps(mounter)), TableFilter())

        def snapshot_plan(runs: bool = True) -> RowPlan:
            fresh: BatchMounter = pickle.loads(pickle.dumps(mounter))
            return RowPlan("bench", store_dir, snapshot_spans, fresh if runs else RowsOnly(fresh), TableFilter())

        measure(args, mounter, events, rows, batches, task_plan, (snapshot, snapshot_plan))


def measure(
    args: argparse.Namespace,
    mounter: TiDBBatchMounter,
    events: list[RawKVEvent],
    rows: list[RowChange],
    batches: list[pa.RecordBatch],
    task_plan: Callable[[], RowPlan],
    snapshot: tuple[list[pa.RecordBatch], Callable[..., RowPlan]],
) -> None:
    parts = run_parts_step(task_plan(), batches)  # also imports what the step imports on its first run
    found, tables = read_found(parts), by_table(parts)
    if args.profile:
        profile(args.profile, mounter, events, rows, batches, task_plan, found, tables, snapshot)
        return
    rates: dict[str, list[float]] = {}

    def timed(name: str, count: int, step: Callable[[], Any]) -> Any:
        # A task's Python worker holds its own batch; this process holds every step's
        # inputs and outputs. Frozen, they are out of the collector's way: otherwise a
        # full collection walks them all and is charged to whichever step crosses the
        # collector's threshold (tens of milliseconds a time here, none in a worker).
        gc.collect()
        gc.freeze()
        try:
            start, cpu = time.perf_counter(), time.process_time()
            out = step()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        finally:
            gc.unfreeze()
        rates.setdefault(name, []).append(count / wall)
        rates.setdefault(f"{name} cpu", []).append(count / cpu)
        return out

    def check(name: str, got: int) -> None:
        if got != len(events):
            raise SystemExit(f"the {name} lost rows")

    def both(name: str, count: int, make: Callable[[], Callable[[], Any]]) -> tuple[Any, Any]:
        """A step (made afresh by ``make``, untimed) timed as ``name``, then again as ``name
        python`` with the C extensions turned off where one is built (None otherwise)."""
        out = timed(name, count, make())
        if tidb_mounter.NATIVE is None and open_protocol.NATIVE is None:
            return out, None
        with pure_python():
            return out, timed(f"{name} python", count, make())

    for _ in range(args.rounds):
        # A new task each time: nothing cached yet in the mounter nor the codec.
        mounted_rows, python_rows = both(
            "mount", len(events), lambda: functools.partial(mount_all, pickle.loads(pickle.dumps(mounter)), events)
        )
        if python_rows is not None and python_rows != mounted_rows:
            raise SystemExit("the C and the Python decoder mounted different rows")
        # The same bytes either way: tests/unit/fuzz/test_open_protocol_native.py.
        both("encode", len(mounted_rows), lambda r=mounted_rows: functools.partial(encode_all, new_codec(), r))
        plan = task_plan()
        check(
            "task path",
            timed("task", len(events), lambda p=plan: run_task(p, batches)),
        )
        for name, runs in (("snapshot task", True), ("snapshot task rows", False)):
            got = timed(name, args.rows, lambda r=runs: run_task(snapshot[1](r), snapshot[0]))
            if got != args.rows:
                raise SystemExit(f"the {name} path lost rows")
        encoded, _ = both("encode step", len(events), lambda: functools.partial(run_encode_step, task_plan(), batches))
        parts = by_lane(encoded)
        check("lane step", timed("lane step", len(events), lambda p=parts: run_lane_step(p)))
        spark_parts = timed("parts step", len(events), lambda: run_parts_step(task_plan(), batches))
        found, tables = read_found(spark_parts), by_table(spark_parts)
        check("unpack step", timed("unpack step", len(events), lambda f=found, t=tables: run_unpack_step(f, t)))
    print(f"rows={args.rows} rounds={args.rounds} (cpu: rows per CPU-second of this process)")
    for name in sorted(rates, key=lambda n: n.endswith(" cpu")):
        values = rates[name]
        rounds = ", ".join(f"{r:,.0f}" for r in values)
        print(f"{name + ':':24}{statistics.median(values):,.0f} rows/s  (rounds: {rounds})")
    for suffix in ("", " cpu"):
        ratios = [
            a / b for a, b in zip(rates[f"snapshot task{suffix}"], rates[f"snapshot task rows{suffix}"], strict=True)
        ]
        shown = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"snapshot task / rows{suffix}: {statistics.median(ratios):.2f}x (rounds: {shown})")


def profile(
    stage: str,
    mounter: TiDBBatchMounter,
    events: list[RawKVEvent],
    rows: list[RowChange],
    batches: list[pa.RecordBatch],
    task_plan: Callable[[], RowPlan],
    found: dict[tuple[str, str], TableRows],
    tables: dict[tuple[str, str], list[pa.RecordBatch]],
    snapshot: tuple[list[pa.RecordBatch], Callable[..., RowPlan]],
) -> None:
    """Run ``stage`` once under cProfile and print its top costs (by own time)."""
    codec = OpenProtocolCodec(OpenProtocolConfig())
    parts = by_lane(run_encode_step(task_plan(), batches)) if stage == "lane-step" else None
    steps: dict[str, Callable[[], Any]] = {
        "mount": lambda: mount_all(pickle.loads(pickle.dumps(mounter)), events),
        "encode": lambda: encode_all(codec, rows),
        "task": lambda: run_task(task_plan(), batches),
        "snapshot-task": lambda: run_task(snapshot[1](), snapshot[0]),
        "snapshot-task-rows": lambda: run_task(snapshot[1](False), snapshot[0]),
        "encode-step": lambda: run_encode_step(task_plan(), batches),
        "lane-step": lambda: run_lane_step(parts),
        "parts-step": lambda: run_parts_step(task_plan(), batches),
        "unpack-step": lambda: run_unpack_step(found, tables),
    }
    profiler = cProfile.Profile()
    gc.collect()
    gc.freeze()  # as the timed runs are (see ``timed`` in main): collections charged to no step
    try:
        profiler.enable()
        steps[stage]()
        profiler.disable()
    finally:
        gc.unfreeze()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
