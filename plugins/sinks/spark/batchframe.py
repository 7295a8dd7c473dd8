"""A batch written from its Spark frame (``Sink.write_frame``): Spark tasks turn each row
into the sink's Arrow columns once.

The pipeline hands the sink the batch as a :class:`~cdcflow.core.data.sink.BatchFrame`;
no row reaches the driver. The sink writes it in two kinds of Spark jobs:

1. one pass over the batch's rows in the batch's order (``BatchFrame.map_rows``: on the
   pipeline, in the same Python tasks that mount them) with :class:`PartsTask`. Per
   partition, each table's rows are buffered and turned, up to :data:`PART_ROWS` at a
   time, into the columns the sink writes: the change log's records and, per step (the
   rows between two DDL of the table, as :func:`~.evolve.cut_at_ddl` cuts them), the
   snapshot's change records, typed by what those rows show (as
   :func:`~.frames.image_columns` finds types). Each such *part* is one row of the
   parts frame: table, step, kind, row count, types and key, and the columns as an
   Arrow IPC stream (pickled records instead when a column's values needed coercing to
   the type its first value gave it, so that nothing is coerced twice). A row that does
   not decode ends its partition's parts with the CdcflowError. The sink persists the
   parts frame for the batch;
2. the parts without their payloads are collected (:func:`read_parts`): per table the
   row count, the column types over every partition (first seen first, as on the
   driver) and where each partition's rows start. A partition's error stops the batch
   here, before anything is written. Then, per table, its change log and its snapshot's
   changes are each a ``mapInArrow`` over the table's parts (:class:`UnpackTask`): each
   payload read, its columns brought to the batch's types for the table (a column
   NULL throughout a part, or one whose part saw another type first), ``seq`` moved by
   the table's rows in earlier partitions so that it is the position in the batch, as
   on the driver — Arrow work per part, Python per row only for a column whose type
   differs — and written by Spark.

The frames feed the same writes as rows from the driver (dynamic partition
overwrite of the change log, snapshot versions), so both paths leave the
same tables.
"""

from __future__ import annotations

import bisect
import datetime as dt
import decimal
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.core.data.events import ColumnInfo, RowChange, TableName, TableSchema
from cdcflow.core.errors import CdcflowError
from cdcflow.plugins.sinks.spark.frames import (
    add_image_columns,
    change_records,
    changelog_records,
    decimal_ints,
    delta_records,
    merge_image_columns,
)

__all__ = [
    "CHANGELOG",
    "CHANGES",
    "DELTAS",
    "PARTS_DDL",
    "PART_ROWS",
    "Part",
    "PartsTask",
    "TableRows",
    "UnpackTask",
    "arrow_batch",
    "changelog_columns",
    "changes_columns",
    "conform",
    "read_parts",
]

#: What a PartsTask yields: a row per part (and one for a partition's error).
PARTS_DDL = (
    "partition INT, schema_name STRING, table_name STRING, step INT, kind TINYINT, rows BIGINT, "
    "info BINARY, pickled BOOLEAN, payload BINARY, error BINARY"
)
_PARTS_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("schema_name", pa.string()),
        ("table_name", pa.string()),
        ("step", pa.int32()),
        ("kind", pa.int8()),
        ("rows", pa.int64()),
        ("info", pa.binary()),
        ("pickled", pa.bool_()),
        ("payload", pa.binary()),
        ("error", pa.binary()),
    ]
)
#: Kinds of part: a table's change log records (step ``WHOLE``: every step of its rows),
#: a step's change records (a table with a key) or delta records (without one).
CHANGELOG, CHANGES, DELTAS = 0, 1, 2
#: The step of a change log part.
WHOLE = -1
#: A part holds at most this many rows: a partition buffers each table's rows up to it.
PART_ROWS = 8192

#: A column of the sink's Arrow output: a Spark type, or a struct's (name, type) pairs.
Columns = Sequence[tuple[str, str | Sequence[tuple[str, str]]]]


def _partition() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def handle_keys(schema: TableSchema | None) -> tuple[str, ...]:
    """The key columns a row's schema names (handle, else primary key), as ``SparkSink.keys_of``."""
    if schema is None:
        return ()
    return schema.handle_key_columns() or tuple(c.name for c in schema.columns if c.flags & ColumnInfo.PRIMARY_KEY)


def changelog_columns(types: Mapping[str, str]) -> list[tuple[str, str | Sequence[tuple[str, str]]]]:
    """The change log's columns (:func:`changelog_ddl`) for images of ``types``."""
    image = list(types.items())
    return [
        ("op", "string"),
        ("commit_ts", "bigint"),
        ("start_ts", "bigint"),
        ("seq", "bigint"),
        ("before", image),
        ("after", image),
        ("commit_date", "date"),
        ("batch_id", "bigint"),
    ]


def changes_columns(types: Mapping[str, str], keyed: bool) -> list[tuple[str, str | Sequence[tuple[str, str]]]]:
    """A snapshot step's columns: the row's, then change metadata (keyed) or the delta."""
    meta = [("_deleted", "boolean"), ("_commit_ts", "bigint"), ("_seq", "bigint")] if keyed else [("_delta", "bigint")]
    return [*types.items(), *meta]


def _raw_types(rows: Sequence[RowChange]) -> dict[str, str | None]:
    types: dict[str, str | None] = {}
    for row in rows:
        add_image_columns(types, row)
    return types


def _kinds(raw: Mapping[str, str | None]) -> dict[str, str]:
    return {name: kind or "string" for name, kind in raw.items()}


def _payload(records: list[tuple[Any, ...]], columns: Columns) -> tuple[bool, bytes]:
    """(pickled, bytes): the records as an Arrow IPC stream of ``columns``, or pickled when
    a column's values do not all convert to its type as they are."""
    batch = exact_arrow_batch(records, columns)
    if batch is None:
        return True, pickle.dumps((list(columns), records), protocol=pickle.HIGHEST_PROTOCOL)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return False, sink.getvalue().to_pybytes()


@dataclass(frozen=True)
class PartsTask:
    """A batch's rows (lists of them, in the batch's order, as ``BatchFrame.map_rows`` hands
    them to a task) → the sink's parts (:data:`PARTS_DDL`), see the module's description."""

    batch_id: int
    #: Commit ts of each table's DDL, ascending: a row's step is how many are at or below it.
    ddl_ts: Mapping[tuple[str, str], tuple[int, ...]]
    #: Make the change log's parts; the snapshot's (change or delta records per step).
    changelog: bool
    changes: bool
    #: The sink's configured key columns by ``schema.table``, for rows whose schema names none.
    key_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    part_rows: int = PART_ROWS

    def __call__(self, row_lists: Iterator[list[RowChange]]) -> Iterator[pa.RecordBatch]:
        parts = _Parts(self, _partition())
        buffers: dict[tuple[str, str], list[RowChange]] = {}
        try:
            for rows in row_lists:
                for row in rows:
                    name = (row.table.schema, row.table.table)
                    buffer = buffers.get(name)
                    if buffer is None:
                        buffer = buffers[name] = []
                    buffer.append(row)
                    if len(buffer) >= self.part_rows:
                        parts.add(name, buffer)
                        buffers[name] = []
                if parts.pending:
                    yield parts.take()
            for name, buffer in buffers.items():
                if buffer:
                    parts.add(name, buffer)
        except CdcflowError as exc:
            parts.fail(exc)
        if parts.pending:
            yield parts.take()


class _Parts:
    """The parts one partition made and has not yielded yet; each table's rows counted so far."""

    def __init__(self, task: PartsTask, partition: int) -> None:
        self.task = task
        self.partition = partition
        self.columns: dict[str, list[Any]] = {name: [] for name in _PARTS_SCHEMA.names}
        #: (schema, table, step) → rows of the partition in earlier parts: their first ``seq``.
        self.done: dict[tuple[str, str, int], int] = {}

    @property
    def pending(self) -> int:
        return len(self.columns["partition"])

    def take(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.columns, schema=_PARTS_SCHEMA)
        self.columns = {name: [] for name in _PARTS_SCHEMA.names}
        return batch

    def fail(self, exc: CdcflowError) -> None:
        self._append(("", ""), 0, CHANGELOG, 0, b"", (False, b""), pickle.dumps(exc))

    def add(self, name: tuple[str, str], rows: list[RowChange]) -> None:
        """The parts of one table's ``rows`` (consecutive in the partition)."""
        task = self.task
        table = rows[0].table
        raw = _raw_types(rows)
        if task.changelog:
            kinds = _kinds(raw)
            seq = self._count(name, WHOLE, len(rows))
            records = changelog_records(decimal_ints(rows, kinds), list(kinds), task.batch_id, seq)
            info = pickle.dumps((table, raw, ()))
            self._append(name, WHOLE, CHANGELOG, len(rows), info, _payload(records, changelog_columns(kinds)))
        if not task.changes:
            return
        ddl = task.ddl_ts.get(name, ())
        for step, step_rows in _steps(rows, ddl):
            step_raw = _raw_types(step_rows) if ddl else raw
            kinds = _kinds(step_raw)
            keys = next((k for r in step_rows if (k := handle_keys(r.schema))), ()) or tuple(
                task.key_columns.get(f"{name[0]}.{name[1]}", ())
            )
            seq = self._count(name, step, len(step_rows))
            prepared, names = decimal_ints(step_rows, kinds), list(kinds)
            if keys:
                kind, records = CHANGES, change_records(prepared, names, keys, seq)
            else:
                kind, records = DELTAS, delta_records(prepared, names)
            info = pickle.dumps((table, step_raw, keys))
            self._append(name, step, kind, len(step_rows), info, _payload(records, changes_columns(kinds, bool(keys))))

    def _count(self, name: tuple[str, str], step: int, rows: int) -> int:
        first = self.done.get((*name, step), 0)
        self.done[(*name, step)] = first + rows
        return first

    def _append(
        self,
        name: tuple[str, str],
        step: int,
        kind: int,
        rows: int,
        info: bytes,
        payload: tuple[bool, bytes],
        error: bytes = b"",
    ) -> None:
        values = (self.partition, name[0], name[1], step, kind, rows, info, payload[0], payload[1], error)
        for column, value in zip(_PARTS_SCHEMA.names, values, strict=True):
            self.columns[column].append(value)


def _steps(rows: list[RowChange], ddl_ts: Sequence[int]) -> list[tuple[int, list[RowChange]]]:
    """``rows`` by step (how many of ``ddl_ts`` are at or below a row's commit ts), in order."""
    if not ddl_ts:
        return [(0, rows)]
    steps: dict[int, list[RowChange]] = {}
    for row in rows:
        steps.setdefault(bisect.bisect_right(ddl_ts, row.commit_ts), []).append(row)
    return list(steps.items())


@dataclass
class Part:
    """The rows of one table in one step (or all its steps): count, types, key, and where
    each partition's rows start among them."""

    table: TableName
    rows: int = 0
    raw_types: dict[str, str | None] = field(default_factory=dict)
    keys: tuple[str, ...] = ()
    #: partition → the position of its first row among the part's rows.
    offsets: dict[int, int] = field(default_factory=dict)

    @property
    def types(self) -> dict[str, str]:
        return _kinds(self.raw_types)

    def add(self, partition: int, rows: int, raw_types: Mapping[str, str | None], keys: tuple[str, ...]) -> None:
        # A step's parts were made with their partition's key: all must agree, or some
        # would hold change records and others deltas.
        if self.offsets and keys != self.keys:
            raise CdcflowError(
                f"rows of {self.table} name different key columns in one batch "
                f"({', '.join(self.keys) or 'none'} and {', '.join(keys) or 'none'}): "
                "give the table's key in the Spark sink's key-columns"
            )
        if partition not in self.offsets:
            self.offsets[partition] = self.rows
        self.rows += rows
        merge_image_columns(self.raw_types, raw_types)
        self.keys = keys


@dataclass
class TableRows:
    """The rows of one table in the batch: the whole, and per step."""

    whole: Part
    steps: dict[int, Part] = field(default_factory=dict)


def read_parts(rows: Sequence[Any]) -> dict[tuple[str, str], TableRows]:
    """The tables of the batch from its parts (rows of :data:`PARTS_DDL` without ``payload``,
    in any order); raises the first partition's error."""
    ordered = sorted(enumerate(rows), key=lambda item: (item[1]["partition"], item[0]))
    for _, row in ordered:
        if row["error"]:
            raise pickle.loads(row["error"])
    tables: dict[tuple[str, str], TableRows] = {}
    for _, row in ordered:
        table, raw, keys = pickle.loads(row["info"])
        entry = tables.get((row["schema_name"], row["table_name"]))
        if entry is None:
            entry = tables[(row["schema_name"], row["table_name"])] = TableRows(Part(table))
        step = row["step"]
        part = entry.whole if step == WHOLE else entry.steps.setdefault(step, Part(table))
        part.add(row["partition"], row["rows"], raw, keys)
    for entry in tables.values():
        if not entry.whole.rows:  # no change log parts: the rows are the steps'
            entry.whole.rows = sum(part.rows for part in entry.steps.values())
    return tables


@dataclass(frozen=True)
class UnpackTask:
    """``mapInArrow`` over one table's parts of one kind (and step): their records as
    Arrow batches of ``columns``, ``seq_column`` moved by the rows of the table (step)
    in earlier partitions (``offsets``), ``seq_scale`` per row."""

    columns: Columns
    offsets: Mapping[int, int]
    seq_column: str | None = None
    seq_scale: int = 1

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            partitions = batch.column("partition").to_pylist()
            pickled = batch.column("pickled").to_pylist()
            payloads = batch.column("payload")
            for i, partition in enumerate(partitions):
                data = payloads[i].as_buffer()
                if pickled[i]:
                    columns, records = pickle.loads(data)
                    out = arrow_batch(realign(records, columns, self.columns), self.columns)
                else:
                    out = conform(pa.ipc.open_stream(data).read_next_batch(), self.columns)
                offset = self.offsets.get(partition, 0) * self.seq_scale
                if self.seq_column is not None and offset:
                    at = out.schema.get_field_index(self.seq_column)
                    moved = pc.add(out.column(at), pa.scalar(offset, pa.int64()))
                    out = out.set_column(at, self.seq_column, moved)
                yield out


def realign(records: list[tuple[Any, ...]], columns: Columns, target: Columns) -> list[tuple[Any, ...]]:
    """``records`` of ``columns`` as records of ``target``: values by column name (and an
    image's by its columns' names), None for a column the records do not have."""
    if list(columns) == list(target):
        return records
    kinds = dict(columns)
    out = []
    for record in records:
        values = dict(zip((name for name, _ in columns), record, strict=True))
        out.append(tuple(_realign(values.get(name), kinds.get(name), kind) for name, kind in target))
    return out


def _realign(value: Any, kind: str | Sequence[tuple[str, str]] | None, target: str | Sequence[tuple[str, str]]) -> Any:
    if value is None or isinstance(target, str) or kind is None or isinstance(kind, str):
        return value
    image = dict(zip((name for name, _ in kind), value, strict=True))
    return tuple(image.get(name) for name, _ in target)


# -- Arrow columns of Spark types ----------------------------------------------------------------


def _arrow_type(spark_type: str) -> pa.DataType:
    simple = {
        "boolean": pa.bool_(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "string": pa.string(),
        "binary": pa.binary(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "timestamp_ntz": pa.timestamp("us"),
    }
    if spark_type in simple:
        return simple[spark_type]
    if spark_type.startswith("decimal(") and spark_type.endswith(")"):
        precision, scale = (int(n) for n in spark_type[len("decimal(") : -1].split(","))
        return pa.decimal128(precision, scale)
    return pa.string()


def _coerce(value: Any, arrow_type: pa.DataType) -> Any:
    """``value`` as Python value Arrow takes for ``arrow_type`` (None where it cannot be one)."""
    if value is None:
        return None
    try:
        if pa.types.is_integer(arrow_type):
            return int(value)
        if pa.types.is_floating(arrow_type):
            return float(value)
        if pa.types.is_boolean(arrow_type):
            return bool(value)
        if pa.types.is_string(arrow_type):
            if isinstance(value, bytes | bytearray):
                return bytes(value).decode("utf-8", "replace")
            return value if isinstance(value, str) else str(value)
        if pa.types.is_binary(arrow_type):
            return value.encode() if isinstance(value, str) else bytes(value)
        if pa.types.is_decimal(arrow_type):
            number = value if isinstance(value, decimal.Decimal) else decimal.Decimal(str(value))
            quantized = number.quantize(decimal.Decimal(1).scaleb(-arrow_type.scale))
            return quantized if len(quantized.as_tuple().digits) <= arrow_type.precision else None
        if pa.types.is_date(arrow_type):
            return value.date() if isinstance(value, dt.datetime) else value
        if pa.types.is_timestamp(arrow_type):
            if arrow_type.tz is None and isinstance(value, dt.datetime) and value.tzinfo is not None:
                return value.replace(tzinfo=None)
            return value
    except (ArithmeticError, TypeError, ValueError):
        return None
    return value


_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError)


def _exact_array(values: Sequence[Any], spark_type: str) -> pa.Array | None:
    """``values`` as an array of ``spark_type`` when Arrow takes each as it is; else None."""
    try:
        return pa.array(values, type=_arrow_type(spark_type))
    except _CONVERSION_ERRORS:
        return None


def _array(values: Sequence[Any], spark_type: str) -> pa.Array:
    exact = _exact_array(values, spark_type)
    if exact is not None:
        return exact
    arrow_type = _arrow_type(spark_type)
    coerced = [_coerce(v, arrow_type) for v in values]
    try:
        return pa.array(coerced, type=arrow_type)
    except _CONVERSION_ERRORS:
        return pa.array([_one(v, arrow_type) for v in coerced], type=arrow_type)


def _one(value: Any, arrow_type: pa.DataType) -> Any:
    try:
        pa.array([value], type=arrow_type)
    except _CONVERSION_ERRORS:
        return None
    return value


_Make = Callable[[Sequence[Any], str], pa.Array | None]


def _struct(
    images: Sequence[tuple[Any, ...] | None], columns: Sequence[tuple[str, str]], make: _Make
) -> pa.Array | None:
    mask = pa.array([i is None for i in images], type=pa.bool_())
    if not columns:
        return pa.array([None if i is None else {} for i in images], type=pa.struct([]))
    nulls = (None,) * len(columns)
    values = list(zip(*(nulls if i is None else i for i in images), strict=True)) if images else [()] * len(columns)
    children = []
    for child_values, (_, kind) in zip(values, columns, strict=True):
        child = make(child_values, kind)
        if child is None:
            return None
        children.append(child)
    fields = [pa.field(name, child.type) for (name, _), child in zip(columns, children, strict=True)]
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def _batch(records: Sequence[tuple[Any, ...]], columns: Columns, make: _Make) -> pa.RecordBatch | None:
    values = list(zip(*records, strict=True)) if records else [()] * len(columns)
    arrays = []
    for column_values, (_, kind) in zip(values, columns, strict=True):
        array = make(column_values, kind) if isinstance(kind, str) else _struct(column_values, kind, make)
        if array is None:
            return None
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in columns])


def arrow_batch(records: Sequence[tuple[Any, ...]], columns: Columns) -> pa.RecordBatch:
    """``records`` as an Arrow batch: per column a Spark type, or a struct's (name, type) list;
    a value that is not one of its column's type is coerced (None where it cannot be)."""
    batch = _batch(records, columns, _array)
    assert batch is not None
    return batch


def exact_arrow_batch(records: Sequence[tuple[Any, ...]], columns: Columns) -> pa.RecordBatch | None:
    """:func:`arrow_batch` when every value converts to its column's type as it is; else None."""
    return _batch(records, columns, _exact_array)


def _struct_type(columns: Sequence[tuple[str, str]]) -> pa.DataType:
    return pa.struct([pa.field(name, _arrow_type(kind)) for name, kind in columns])


def conform(batch: pa.RecordBatch, columns: Columns) -> pa.RecordBatch:
    """``batch`` (an :func:`exact_arrow_batch` of other types for some columns) as
    :func:`arrow_batch` would have made its records with ``columns``: columns by name, a
    missing one or one NULL throughout as NULLs of its type, and a column of another type
    from its Python values (as they were before the other type took them: the exact
    conversion kept them)."""
    length = batch.num_rows
    names = batch.schema.names
    arrays = [_conform(batch.column(name) if name in names else None, kind, length) for name, kind in columns]
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in columns])


def _conform(array: pa.Array | None, kind: str | Sequence[tuple[str, str]], length: int) -> pa.Array:
    if isinstance(kind, str):
        target = _arrow_type(kind)
        if array is None or array.null_count == length:
            return pa.nulls(length, target)
        return array if array.type == target else _array(array.to_pylist(), kind)
    struct = _struct_type(kind)
    if array is None or array.null_count == length:
        return pa.nulls(length, struct)
    if array.type == struct:
        return array
    mask = array.is_null()
    if not kind:
        return pa.array([None if null else {} for null in mask.to_pylist()], type=struct)
    by_name = dict(zip((f.name for f in array.type), array.flatten(), strict=True))
    children = [_conform(by_name.get(name), child, length) for name, child in kind]
    return pa.StructArray.from_arrays(children, fields=list(struct), mask=mask)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def struct_ddl(types: Mapping[str, str]) -> str:
    return "struct<" + ", ".join(f"{_q(c)}: {t}" for c, t in types.items()) + ">"


def changelog_ddl(types: Mapping[str, str]) -> str:
    image = struct_ddl(types)
    return (
        f"op string, commit_ts bigint, start_ts bigint, seq bigint, before {image}, after {image}, "
        "commit_date date, batch_id bigint"
    )
