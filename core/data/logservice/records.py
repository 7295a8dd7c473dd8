"""Events as flat records: the event store's in-memory form and its on-disk (Arrow) form.

A record is a tuple in :data:`FIELDS` order. Its first three fields are
``(commit_ts, start_ts, key)``, the event store's sort order. The same fields
are the columns of spill runs and resolved chunks (Arrow IPC files) and of the
rows the ``cdcflow`` Spark data source yields, so an event crosses from the
capture to Spark and back without a second encoding.

Row images of :class:`RowChange` are pickled (they hold Python values such as
Decimal and datetime that no columnar type keeps exactly; see :func:`dumps_image`);
raw key-value events keep their bytes. Table schemas are not repeated per row: a record
holds a ``schema_id`` into the changefeed's :class:`SchemaRegistry`.
"""

from __future__ import annotations

import datetime as dt
import io
import operator
import os
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.core.data.events import OpType, RawKVEvent, RowChange, Span, TableName, TableSchema, make_raw_event

__all__ = [
    "ARROW_SCHEMA",
    "FIELDS",
    "KIND_RAW",
    "KIND_ROW",
    "SPARK_SCHEMA_DDL",
    "Record",
    "SchemaIds",
    "SchemaRegistry",
    "SchemasById",
    "batch_to_records",
    "dumps_image",
    "event_from_record",
    "load_pickled",
    "loads_image",
    "loads_pickled",
    "raw_events",
    "raw_puts_batch",
    "read_record_batches",
    "record_batch_rows",
    "record_from_event",
    "record_size",
    "record_tables",
    "records_to_batch",
    "sort_key",
    "write_records",
]

#: A flat event; fields in :data:`FIELDS` order.
Record = tuple[Any, ...]

KIND_RAW = 0
KIND_ROW = 1

#: Column names and Arrow types of a record. Keep in step with SPARK_SCHEMA_DDL.
FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("commit_ts", pa.int64()),
    ("start_ts", pa.int64()),
    ("key", pa.binary()),
    ("kind", pa.int32()),
    ("span_id", pa.int32()),
    ("table_id", pa.int64()),
    ("partition_id", pa.int64()),
    ("schema_name", pa.string()),
    ("table_name", pa.string()),
    ("op", pa.string()),
    ("value", pa.binary()),
    ("old_value", pa.binary()),
    ("schema_id", pa.int32()),
)

ARROW_SCHEMA = pa.schema([pa.field(name, typ) for name, typ in FIELDS])

#: The same columns as a Spark DDL schema string (the data source's schema()).
SPARK_SCHEMA_DDL = (
    "commit_ts BIGINT, start_ts BIGINT, key BINARY, kind INT, span_id INT, table_id BIGINT, "
    "partition_id BIGINT, schema_name STRING, table_name STRING, op STRING, value BINARY, "
    "old_value BINARY, schema_id INT"
)

#: Sort records by (commit ts, start ts, key) only: later fields may be None.
sort_key: Callable[[Record], tuple[int, int, bytes]] = operator.itemgetter(0, 1, 2)

# What a record costs in memory beyond its byte strings: the tuple, three ints,
# three bytes headers. Measured with sys.getsizeof on CPython 3.11, rounded up.
_RECORD_OVERHEAD = 320

_PICKLE_PROTOCOL = 5


#: Modules whose classes an event store written by an earlier release pickled
#: under another name (0.1.0 kept the data-plane model in ``cdcflow.core.events``).
_RENAMED_MODULES = {"cdcflow.core.events": "cdcflow.core.data.events"}


class _StoreUnpickler(pickle.Unpickler):
    """Loads schemas, row images and DDL pickled by this or an earlier release."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(_RENAMED_MODULES.get(module, module), name)


def load_pickled(fh: BinaryIO) -> Any:
    """The next object the event store pickled into ``fh`` (EOFError past the last)."""
    return _StoreUnpickler(fh).load()


def loads_pickled(data: bytes) -> Any:
    """The object the event store pickled into ``data``.

    Row images are unpickled for every row a sink decodes, so the C unpickler goes
    first (about half the cost of a Python ``find_class`` per global); only a pickle
    naming a module an earlier release used goes through :class:`_StoreUnpickler`."""
    try:
        return pickle.loads(data)
    except (ModuleNotFoundError, AttributeError):
        return _StoreUnpickler(io.BytesIO(data)).load()


#: The first byte of a row image in the tagged form (:func:`dumps_image`); a plain pickle starts with 0x80.
_TAGGED_IMAGE = 1
_TAGGED_PREFIX = bytes([_TAGGED_IMAGE])
#: Image values pickled as they are: pickle spells them in a byte or two and builds them without a call.
_PLAIN = frozenset({int, str, bytes, float, bool, type(None)})
#: Tags of the values a tagged image spells as a tuple ``(tag, *fields)``.
_DECIMAL, _DATE, _DATETIME, _DATETIME_UTC, _TIMEDELTA = range(5)


def dumps_image(image: Mapping[str, Any]) -> bytes:
    """A row image as the event store keeps it.

    Pickle builds a Decimal, date or datetime through a global lookup and a call
    per value, which made images the costliest part of decoding a mounted row
    (about 5 µs to load and 6 µs to dump an image of the playground's shop
    tables). The tagged form spells those values as tuples of plain fields
    (Decimal as its exact string, dates as ordinals, datetimes as their fields and
    ``fold``, naive or in UTC, timedeltas as days, seconds and microseconds) and
    pickles ``(image, names of the tagged values)`` after the byte
    ``_TAGGED_IMAGE``. An image holding any other value (a datetime in another
    zone, a subclass, a container) is a plain pickle, as every image was before;
    :func:`loads_image` reads both."""
    out: dict[str, Any] = {}
    tagged: list[str] = []
    for name, value in image.items():
        kind = type(value)
        if kind in _PLAIN:
            out[name] = value
            continue
        if kind is Decimal:
            out[name] = (_DECIMAL, str(value))
        elif kind is dt.datetime:
            tz = value.tzinfo
            if tz is not None and tz is not dt.UTC:
                return pickle.dumps(dict(image), protocol=_PICKLE_PROTOCOL)
            out[name] = (
                _DATETIME if tz is None else _DATETIME_UTC,
                value.year,
                value.month,
                value.day,
                value.hour,
                value.minute,
                value.second,
                value.microsecond,
                value.fold,
            )
        elif kind is dt.date:
            out[name] = (_DATE, value.toordinal())
        elif kind is dt.timedelta:
            out[name] = (_TIMEDELTA, value.days, value.seconds, value.microseconds)
        else:
            return pickle.dumps(dict(image), protocol=_PICKLE_PROTOCOL)
        tagged.append(name)
    return _TAGGED_PREFIX + pickle.dumps((out, tuple(tagged)), protocol=_PICKLE_PROTOCOL)


def loads_image(data: bytes) -> dict[str, Any]:
    """The row image :func:`dumps_image` wrote (or an earlier release pickled)."""
    if data[0] != _TAGGED_IMAGE:
        image: dict[str, Any] = loads_pickled(data)
        return image
    image, tagged = pickle.loads(memoryview(data)[1:])
    for name in tagged:
        value = image[name]
        tag = value[0]
        if tag == _DECIMAL:
            image[name] = Decimal(value[1])
        elif tag == _DATETIME:
            _, year, month, day, hour, minute, second, micro, fold = value
            image[name] = dt.datetime(year, month, day, hour, minute, second, micro, fold=fold)
        elif tag == _DATETIME_UTC:
            _, year, month, day, hour, minute, second, micro, fold = value
            image[name] = dt.datetime(year, month, day, hour, minute, second, micro, dt.UTC, fold=fold)
        elif tag == _DATE:
            image[name] = dt.date.fromordinal(value[1])
        else:
            image[name] = dt.timedelta(value[1], value[2], value[3])
    return image


def record_size(record: Record) -> int:
    """An estimate of the memory a record holds (for the memory quota)."""
    return _RECORD_OVERHEAD + len(record[2]) + len(record[10]) + len(record[11])


class SchemaRegistry:
    """Table schemas by small integer id, appended to a file so that ids survive a restart."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._ids: dict[TableSchema, int] = {}
        self._schemas: list[TableSchema] = []
        if path.exists():
            with path.open("rb") as fh:
                while True:
                    try:
                        schema = load_pickled(fh)
                    except EOFError:
                        break
                    self._ids[schema] = len(self._schemas)
                    self._schemas.append(schema)

    def id_of(self, schema: TableSchema | None) -> int:
        """The id of ``schema`` (-1 for None), registering it on first use."""
        if schema is None:
            return -1
        known = self._ids.get(schema)
        if known is not None:
            return known
        with self._path.open("ab") as fh:
            pickle.dump(schema, fh, protocol=_PICKLE_PROTOCOL)
        self._ids[schema] = len(self._schemas)
        self._schemas.append(schema)
        return len(self._schemas) - 1

    def get(self, schema_id: int) -> TableSchema | None:
        return self._schemas[schema_id] if 0 <= schema_id < len(self._schemas) else None

    def all(self) -> list[TableSchema]:
        """Every schema registered, in id order."""
        return list(self._schemas)


class SchemaIds(Protocol):
    """Where a record finds the id of its row's table schema."""

    def id_of(self, schema: TableSchema | None) -> int: ...


class SchemasById(Protocol):
    """Where a record's schema id leads back to the schema."""

    def get(self, schema_id: int) -> TableSchema | None: ...


def record_from_event(event: RawKVEvent | RowChange, span_id: int, schemas: SchemaIds) -> Record:
    """The record of a raw key-value event or a row change."""
    if isinstance(event, RawKVEvent):
        return (
            event.commit_ts,
            event.start_ts,
            event.key,
            KIND_RAW,
            span_id,
            event.span.table_id,
            None,
            "",
            "",
            "delete" if event.delete else "put",
            event.value,
            event.old_value,
            -1,
        )
    table = event.table
    return (
        event.commit_ts,
        event.start_ts,
        event.key,
        KIND_ROW,
        span_id,
        table.table_id,
        table.partition_id,
        table.schema,
        table.table,
        event.op.value,
        b"" if event.after is None else dumps_image(event.after),
        b"" if event.before is None else dumps_image(event.before),
        schemas.id_of(event.schema),
    )


#: ``OpType(value)`` goes through Enum's ``__new__`` (a Python call per row); a dict does not.
_OP_TYPES: dict[str, OpType] = {op.value: op for op in OpType}


def event_from_record(
    record: Sequence[Any], span_of: Callable[[int], Span], schemas: SchemasById
) -> RawKVEvent | RowChange:
    """The event a record (or a Spark row with the record's columns) holds."""
    commit_ts, start_ts, key, kind, span_id, table_id, partition_id, schema_name, table_name, op, value, old, sid = (
        record
    )
    if kind == KIND_RAW:
        return RawKVEvent(
            span_of(span_id), bytes(key), bytes(value), bytes(old), start_ts, commit_ts, delete=op == "delete"
        )
    return RowChange(
        TableName(schema_name, table_name, table_id, partition_id),
        _OP_TYPES.get(op) or OpType(op),
        commit_ts,
        start_ts,
        loads_image(value) if value else None,
        loads_image(old) if old else None,
        schemas.get(sid),
        bytes(key),
    )


def raw_events(batch: pa.RecordBatch, span_of: Callable[[int], Span]) -> list[RawKVEvent]:
    """:func:`event_from_record` of each record of ``batch``, every one of them raw (as a
    TiKV source's are), read column by column: only the columns a raw event has."""
    column = batch.column
    spans: dict[int, Span] = {}
    out: list[RawKVEvent] = []
    append = out.append
    for commit_ts, start_ts, key, span_id, op, value, old in zip(
        *(column(i).to_pylist() for i in (0, 1, 2, 4, 9, 10, 11)), strict=True
    ):
        span = spans.get(span_id)
        if span is None:
            span = spans[span_id] = span_of(span_id)
        append(make_raw_event(span, key, value, old, start_ts, commit_ts, op == "delete"))
    return out


def records_to_batch(records: Sequence[Record]) -> pa.RecordBatch:
    """An Arrow record batch of ``records`` with :data:`ARROW_SCHEMA`."""
    columns = [pa.array([r[i] for r in records], type=typ) for i, (_, typ) in enumerate(FIELDS)]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def raw_puts_batch(
    keys: Sequence[bytes], values: Sequence[bytes], span_id: int, table_id: int, ts: int
) -> pa.RecordBatch:
    """The record batch :func:`records_to_batch` makes of the records of raw puts of
    ``keys`` with ``values`` (no old value), all of one span and table, with commit and
    start ts ``ts`` (an initial snapshot's pairs read at ``ts``), made column by column:
    no event or record per pair."""
    n = len(keys)

    def same(value: Any, typ: pa.DataType) -> pa.Array:
        return pa.array([value] * n, type=typ)

    ts_column = same(ts, pa.int64())
    columns = [
        ts_column,
        ts_column,
        pa.array(keys, type=pa.binary()),
        same(KIND_RAW, pa.int32()),
        same(span_id, pa.int32()),
        same(table_id, pa.int64()),
        pa.nulls(n, type=pa.int64()),
        same("", pa.string()),
        same("", pa.string()),
        same("put", pa.string()),
        pa.array(values, type=pa.binary()),
        same(b"", pa.binary()),
        same(-1, pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def batch_to_records(batch: pa.RecordBatch) -> Iterator[Record]:
    """The records of an Arrow record batch, in order."""
    return zip(*(column.to_pylist() for column in batch.columns), strict=True)


def write_records(path: Path, records: Iterable[Record], batch_rows: int, *, fsync: bool = True) -> int:
    """Write ``records`` to an Arrow IPC file at ``path`` (temp file + rename); return the bytes written."""
    tmp = path.with_name(path.name + ".tmp")
    pending: list[Record] = []
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, ARROW_SCHEMA) as writer:
        for record in records:
            pending.append(record)
            if len(pending) >= batch_rows:
                writer.write_batch(records_to_batch(pending))
                pending = []
        if pending:
            writer.write_batch(records_to_batch(pending))
    if fsync:
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
    tmp.replace(path)
    return path.stat().st_size


def record_batch_rows(path: str | Path) -> list[int]:
    """The row count of each record batch :func:`read_record_batches` reads of ``path``
    (row groups of a ``*.parquet`` file), from the file's metadata: no column is read."""
    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq

        metadata = pq.ParquetFile(str(path)).metadata
        return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    # Memory-mapped, a batch's buffers are only referenced, never read.
    with pa.memory_map(str(path), "r") as source:
        reader = pa.ipc.open_file(source)
        return [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]


def record_tables(path: str | Path) -> set[TableName] | None:
    """The tables of the rows an event store chunk ``path`` holds, read from their records'
    columns (memory-mapped: only those columns are read); None when it holds raw events,
    whose table is known only once they are mounted."""
    names: set[TableName] = set()
    with pa.memory_map(str(path), "r") as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            if not batch.num_rows:
                continue
            if pc.any(pc.equal(batch.column("kind"), KIND_RAW)).as_py():
                return None
            columns = ("schema_name", "table_name", "table_id", "partition_id")
            tables = pa.Table.from_batches([batch.select(columns)]).group_by(list(columns)).aggregate([])
            names.update(TableName(*row) for row in zip(*(tables.column(c).to_pylist() for c in columns), strict=True))
    return names


def read_record_batches(path: str | Path, first: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
    """The record batches of an Arrow IPC file (those numbered ``first`` up to ``stop``,
    excluded; all by default), read one at a time (not memory-mapped, so that reading a
    large file does not grow the reader's resident memory). A ``*.parquet`` file (an
    initial snapshot's part) is read the same way, by row group."""
    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(str(path))
        end = parquet.num_row_groups if stop is None else min(stop, parquet.num_row_groups)
        for i in range(first, end):
            yield from parquet.read_row_group(i).to_batches()
        return
    with pa.OSFile(str(path), "rb") as source:
        reader = pa.ipc.open_file(source)
        end = reader.num_record_batches if stop is None else min(stop, reader.num_record_batches)
        for i in range(first, end):
            yield reader.get_batch(i)
