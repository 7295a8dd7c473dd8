"""A batch written from its Spark frame (``Sink.write_frame``): Spark tasks decode the rows.

The pipeline hands the sink the batch's mounted records as a DataFrame; no
row reaches the driver. The sink takes them in ``(commit_ts, start_ts, key)``
order (a range sort: partitions in order, each sorted; ``BatchFrame.ordered``
when the runtime gives them so, its records sorted before they were mounted;
not sorted for a one-ts batch, an initial snapshot's, whose order as it comes
is its order), persists them for the batch, and runs:

1. a summary job (:class:`SummaryTask`): per partition and per (table, step)
   — a step being the rows between two DDL of the table, as
   :func:`~.evolve.cut_at_ddl` cuts them — the row count, the image columns
   with their Spark types (as :func:`~.frames.image_columns` finds them) and
   the key of the first row with a schema; a row that does not decode stops
   the batch here, with its CdcflowError, before anything is written;
2. per table, the change log (:class:`ChangelogTask`) and the snapshot's
   change records (:class:`ChangesTask`), each a ``mapInArrow`` over the
   table's rows that turns images into Arrow columns of the table's Spark
   types; ``seq`` counts from the rows of the table in earlier partitions
   (from the summary), so it is the position in the batch, as on the driver.

The frames feed the same writes as rows from the driver (dynamic partition
overwrite of the change log, snapshot versions), so both paths leave the
same tables.
"""

from __future__ import annotations

import bisect
import datetime as dt
import decimal
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cdcflow.core.data.events import ColumnInfo, TableName, TableSchema
from cdcflow.core.data.sink import RowDecoder
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
    "SUMMARY_DDL",
    "ChangelogTask",
    "ChangesTask",
    "Part",
    "SummaryTask",
    "TableRows",
    "arrow_batch",
    "read_summaries",
]

#: What a SummaryTask yields: one row per partition.
SUMMARY_DDL = "partition INT, parts BINARY, error BINARY"
_SUMMARY_SCHEMA = pa.schema([("partition", pa.int32()), ("parts", pa.binary()), ("error", pa.binary())])


def _partition() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def handle_keys(schema: TableSchema | None) -> tuple[str, ...]:
    """The key columns a row's schema names (handle, else primary key), as ``SparkSink.keys_of``."""
    if schema is None:
        return ()
    return schema.handle_key_columns() or tuple(c.name for c in schema.columns if c.flags & ColumnInfo.PRIMARY_KEY)


@dataclass
class _PartInfo:
    """What one partition holds of one (table, step)."""

    table: TableName
    rows: int = 0
    types: dict[str, str | None] = field(default_factory=dict)
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class SummaryTask:
    """``mapInArrow``: per partition, a pickled ``{(schema, table, step): _PartInfo}``, or an error."""

    decoder: RowDecoder
    #: Commit ts of each table's DDL, ascending: a row's step is how many are at or below it.
    ddl_ts: Mapping[tuple[str, str], tuple[int, ...]]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts: dict[tuple[str, str, int], _PartInfo] = {}
        error = b""
        try:
            for batch in batches:
                for row in self.decoder.rows(batch):
                    name = (row.table.schema, row.table.table)
                    step = bisect.bisect_right(self.ddl_ts.get(name, ()), row.commit_ts)
                    info = parts.get((*name, step))
                    if info is None:
                        info = parts[(*name, step)] = _PartInfo(row.table)
                    info.rows += 1
                    if not info.keys and row.schema is not None:
                        info.keys = handle_keys(row.schema)
                    add_image_columns(info.types, row)
        except CdcflowError as exc:
            error = pickle.dumps(exc)
        row_ = {"partition": _partition(), "parts": pickle.dumps(parts), "error": error}
        yield pa.RecordBatch.from_pylist([row_], schema=_SUMMARY_SCHEMA)


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
        return {name: kind or "string" for name, kind in self.raw_types.items()}

    def add(self, partition: int, info: _PartInfo) -> None:
        self.offsets[partition] = self.rows
        self.rows += info.rows
        merge_image_columns(self.raw_types, info.types)
        if not self.keys:
            self.keys = info.keys


@dataclass
class TableRows:
    """The rows of one table in the batch: the whole, and per step."""

    whole: Part
    steps: dict[int, Part] = field(default_factory=dict)


def read_summaries(rows: Sequence[Any]) -> dict[tuple[str, str], TableRows]:
    """The tables of the batch from the SummaryTask rows (raises the first partition's error)."""
    summaries = sorted((r["partition"], r["parts"], r["error"]) for r in rows)
    for _, _, error in summaries:
        if error:
            raise pickle.loads(error)
    tables: dict[tuple[str, str], TableRows] = {}
    for partition, blob, _ in summaries:
        parts: dict[tuple[str, str, int], _PartInfo] = pickle.loads(blob)
        for (schema, table, step), info in sorted(parts.items(), key=lambda item: item[0][2]):
            entry = tables.get((schema, table))
            if entry is None:
                entry = tables[(schema, table)] = TableRows(Part(info.table))
            if partition not in entry.whole.offsets:
                entry.whole.offsets[partition] = entry.whole.rows
            entry.whole.rows += info.rows
            merge_image_columns(entry.whole.raw_types, info.types)
            entry.whole.keys = entry.whole.keys or info.keys
            entry.steps.setdefault(step, Part(info.table)).add(partition, info)
    return tables


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


def _array(values: list[Any], spark_type: str) -> pa.Array:
    arrow_type = _arrow_type(spark_type)
    try:
        return pa.array(values, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        coerced = [_coerce(v, arrow_type) for v in values]
        try:
            return pa.array(coerced, type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            return pa.array([_one(v, arrow_type) for v in coerced], type=arrow_type)


def _one(value: Any, arrow_type: pa.DataType) -> Any:
    try:
        pa.array([value], type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return None
    return value


def _struct(images: list[tuple[Any, ...] | None], columns: Sequence[tuple[str, str]]) -> pa.Array:
    children = [_array([None if i is None else i[n] for i in images], t) for n, (_, t) in enumerate(columns)]
    fields = [pa.field(name, child.type) for (name, _), child in zip(columns, children, strict=True)]
    mask = pa.array([i is None for i in images], type=pa.bool_())
    if not fields:
        return pa.array([None if i is None else {} for i in images], type=pa.struct([]))
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def arrow_batch(
    records: list[tuple[Any, ...]], columns: Sequence[tuple[str, str | Sequence[tuple[str, str]]]]
) -> pa.RecordBatch:
    """``records`` as an Arrow batch: per column a Spark type, or a struct's (name, type) list."""
    arrays = []
    for n, (_, kind) in enumerate(columns):
        values = [r[n] for r in records]
        arrays.append(_array(values, kind) if isinstance(kind, str) else _struct(values, kind))
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in columns])


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


# -- the tasks that write ------------------------------------------------------------------------


@dataclass(frozen=True)
class ChangelogTask:
    """``mapInArrow`` over one table's rows: change log records (see :func:`.frames.changelog_records`)."""

    decoder: RowDecoder
    types: Mapping[str, str]
    batch_id: int
    offsets: Mapping[int, int]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        image = list(self.types.items())
        columns: list[tuple[str, str | Sequence[tuple[str, str]]]] = [
            ("op", "string"),
            ("commit_ts", "bigint"),
            ("start_ts", "bigint"),
            ("seq", "bigint"),
            ("before", image),
            ("after", image),
            ("commit_date", "date"),
            ("batch_id", "bigint"),
        ]
        seq = self.offsets.get(_partition(), 0)
        for batch in batches:
            rows = decimal_ints(self.decoder.rows(batch), self.types)
            if rows:
                yield arrow_batch(changelog_records(rows, list(self.types), self.batch_id, seq), columns)
                seq += len(rows)


@dataclass(frozen=True)
class ChangesTask:
    """``mapInArrow`` over one step of one table's rows: the snapshot's change records
    (with ``keys``) or, for a table without a key, its delta records."""

    decoder: RowDecoder
    types: Mapping[str, str]
    keys: tuple[str, ...]
    offsets: Mapping[int, int]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        names = list(self.types)
        meta = (
            [("_deleted", "boolean"), ("_commit_ts", "bigint"), ("_seq", "bigint")]
            if self.keys
            else [("_delta", "bigint")]
        )
        columns: list[tuple[str, str | Sequence[tuple[str, str]]]] = [*self.types.items(), *meta]
        seq = self.offsets.get(_partition(), 0)
        for batch in batches:
            rows = decimal_ints(self.decoder.rows(batch), self.types)
            if not rows:
                continue
            records = change_records(rows, names, self.keys, seq) if self.keys else delta_records(rows, names)
            seq += len(rows)
            if records:
                yield arrow_batch(records, columns)
