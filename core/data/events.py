"""The data-plane model: spans, row changes, DDL, resolved timestamps, micro-batches.

Timestamps are upstream TSOs (TiKV: ``physical_ms << 18 | logical``; HLC for
rangefeeds mapped to the same 64-bit space). Ordering inside a changefeed is
by ``(commit_ts, start_ts, key)``, the event store's order (ARCHITECTURE.md,
"Log service").
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from cdcflow.core.data.frozen import frozen_maker
from cdcflow.core.data.types import TypeCode

__all__ = [
    "ColumnInfo",
    "DDLEvent",
    "InsertRun",
    "MicroBatch",
    "OpType",
    "RawKVEvent",
    "ResolvedEvent",
    "RowChange",
    "SourceEvent",
    "Span",
    "TableName",
    "TableSchema",
    "TableSetChange",
    "TypeCode",
    "make_raw_event",
    "make_row_change",
    "tso_from_ms",
    "tso_physical_ms",
    "tso_utc_text",
    "utc_text",
]

#: Bits of the logical part of a TSO.
TSO_LOGICAL_BITS = 18


def tso_physical_ms(ts: int) -> int:
    """Milliseconds since the epoch encoded in a TSO."""
    return ts >> TSO_LOGICAL_BITS


def utc_text(seconds: float) -> str:
    """``seconds`` since the epoch as ``YYYY-MM-DD HH:MM:SS``, in UTC (logs, REST, the CLI)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


def tso_utc_text(ts: int) -> str:
    """A TSO's physical time as ``YYYY-MM-DD HH:MM:SS``, in UTC."""
    return utc_text(tso_physical_ms(ts) / 1000)


def tso_from_ms(ms: int, logical: int = 0) -> int:
    """A TSO from milliseconds since the epoch and a logical counter."""
    return (ms << TSO_LOGICAL_BITS) | logical


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """A half-open key range ``[start, end)`` of raw (not memcomparable) keys.

    ``table_id`` names the table the span belongs to (0 for non-table spans,
    e.g. raw key-value mode). An empty ``end`` means "to the end of the key space".
    """

    table_id: int
    start: bytes
    end: bytes

    def contains(self, key: bytes) -> bool:
        return key >= self.start and (not self.end or key < self.end)

    def __str__(self) -> str:
        return f"span(table={self.table_id}, [{self.start.hex()}, {self.end.hex() or '+inf'}))"


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    """A table as users name it, plus the ids the upstream knows it by."""

    schema: str
    table: str
    table_id: int = 0
    #: Physical partition id for partitioned tables, else None.
    partition_id: int | None = None

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column as sinks see it.

    ``type_code`` is the MySQL type byte, a :class:`TypeCode` value (plain
    ints compare equal to its members), and ``flags`` the Open Protocol column
    flag bits (§2.5) below, so codecs and sinks need no other schema.

    ``origin_default`` is the value a row written before the column existed
    reads (TiDB's ``origin_default``, fixed at ADD COLUMN time; a NOT NULL
    column without one reads its type's zero value), as a Python value of the
    same type as the column's values in :class:`RowChange` images. It is not
    the ``DEFAULT`` new inserts get: the upstream writes that into the row.
    None when the column reads NULL there, or when the source does not know.
    """

    name: str
    type_code: int
    flags: int = 0
    #: Free-form type text for DDL-aware sinks, e.g. ``varchar(64)``.
    sql_type: str = ""
    nullable: bool = True
    origin_default: Any = None

    BINARY = 0x01
    HANDLE_KEY = 0x02
    GENERATED = 0x04
    PRIMARY_KEY = 0x08
    UNIQUE_KEY = 0x10
    MULTIPLE_KEY = 0x20
    NULLABLE = 0x40
    UNSIGNED = 0x80

    @property
    def is_handle_key(self) -> bool:
        return bool(self.flags & self.HANDLE_KEY)

    # The event store pickles schemas (schemas.pkl, ddl.pkl). A store written
    # before a field was added holds fewer values; those columns take the
    # field's default, so such a store still loads. New fields go last.
    def __getstate__(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]

    def __setstate__(self, state: Sequence[Any]) -> None:
        known = fields(self)
        if len(state) > len(known):
            raise ValueError(f"ColumnInfo state has {len(state)} values, more than its {len(known)} fields")
        for i, f in enumerate(known):
            object.__setattr__(self, f.name, state[i] if i < len(state) else f.default)


@dataclass(frozen=True, slots=True)
class TableSchema:
    """The columns of a table at one schema version."""

    table: TableName
    columns: tuple[ColumnInfo, ...]
    version: int = 0

    def handle_key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.is_handle_key)


class OpType(enum.Enum):
    """The kind of a row change."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class RowChange:
    """One decoded row change of one upstream transaction.

    ``after`` is the new image (None for deletes), ``before`` the old image
    (None for inserts). Column values are Python values: int, float,
    :class:`decimal.Decimal`, str, bytes, :class:`datetime.date` /
    :class:`datetime.datetime`, :class:`datetime.timedelta`, or None.
    """

    table: TableName
    op: OpType
    commit_ts: int
    start_ts: int
    after: Mapping[str, Any] | None
    before: Mapping[str, Any] | None = None
    schema: TableSchema | None = None
    #: The upstream key, for ordering and dispatch (empty when unknown).
    key: bytes = b""

    def sort_key(self) -> tuple[int, int, bytes]:
        return (self.commit_ts, self.start_ts, self.key)

    def image(self) -> Mapping[str, Any]:
        """The row as it is after the change, or as it was before a delete."""
        image = self.after if self.after is not None else self.before
        return image if image is not None else {}


@dataclass(frozen=True, slots=True)
class RawKVEvent:
    """A committed key-value change as the upstream delivers it, before mounting.

    ``value`` is empty for deletes; ``old_value`` is the previous value when
    the upstream was asked for old values.
    """

    span: Span
    key: bytes
    value: bytes
    old_value: bytes
    start_ts: int
    commit_ts: int
    delete: bool = False

    def sort_key(self) -> tuple[int, int, bytes]:
        return (self.commit_ts, self.start_ts, self.key)


#: ``RowChange(...)`` and ``RawKVEvent(...)``, made about twice as fast (see
#: :mod:`cdcflow.core.data.frozen`): for paths that make one or more per row.
make_row_change = frozen_maker(RowChange)
make_raw_event = frozen_maker(RawKVEvent)


@dataclass(frozen=True, slots=True)
class InsertRun:
    """Inserts of one table, with one schema, all committed at one ts: rows as an initial
    snapshot's batch holds them (``keys[i]`` the upstream key of the row whose new image
    is ``afters[i]``, in the order read), mounted together without a :class:`RowChange`
    per row. A sink that writes such rows faster together takes the run whole
    (:meth:`~cdcflow.core.data.sink.PartitionWriter.write_inserts`); any other reads
    :meth:`rows`, the same rows a mounter gives one by one."""

    table: TableName
    schema: TableSchema
    commit_ts: int
    start_ts: int
    keys: Sequence[bytes]
    afters: Sequence[Mapping[str, Any]]

    def __len__(self) -> int:
        return len(self.afters)

    def rows(self) -> list[RowChange]:
        """The run's rows, each an insert."""
        table, schema, commit_ts, start_ts, insert = (
            self.table,
            self.schema,
            self.commit_ts,
            self.start_ts,
            OpType.INSERT,
        )
        return [
            make_row_change(table, insert, commit_ts, start_ts, after, None, schema, key)
            for key, after in zip(self.keys, self.afters, strict=True)
        ]

    def slice(self, start: int, stop: int) -> InsertRun:
        """Rows ``start`` up to ``stop`` (excluded) of the run."""
        return InsertRun(
            self.table, self.schema, self.commit_ts, self.start_ts, self.keys[start:stop], self.afters[start:stop]
        )


@dataclass(frozen=True, slots=True)
class DDLEvent:
    """A schema change committed at ``commit_ts``.

    Sinks apply it only after every row with a smaller commit ts is flushed;
    rows at or above it wait for it (the DDL barrier).
    """

    commit_ts: int
    query: str
    table: TableName | None = None
    #: TiDB ActionType (Open Protocol §2.6), 0 when unknown.
    action_type: int = 0
    schema_after: TableSchema | None = None
    #: For a DDL that renamed ``table`` (RENAME TABLE, ALTER TABLE … RENAME TO): its name
    #: just before, so sinks can move what they keep under it; None for any other DDL.
    renamed_from: TableName | None = None

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        # Events pickled before a field was added (an event store written by an
        # earlier version) lack its value: it takes its default.
        names = [f.name for f in fields(self)]
        values = dict(zip(names, state, strict=False))
        for f in fields(self):
            object.__setattr__(self, f.name, values.get(f.name, f.default))


@dataclass(frozen=True, slots=True)
class ResolvedEvent:
    """A promise: no change with commit ts ≤ ``ts`` will arrive for ``span`` any more."""

    span: Span
    ts: int


#: What a source feed yields.
SourceEvent = RawKVEvent | RowChange | DDLEvent | ResolvedEvent


@dataclass(frozen=True, slots=True)
class TableSetChange:
    """A DDL committed at ``commit_ts`` that changes which tables exist (CREATE,
    DROP, TRUNCATE, RENAME TABLE, …), as :meth:`Source.table_changes
    <cdcflow.core.data.source.Source.table_changes>` reports it.

    ``dropped``: tables whose rows end at ``commit_ts`` (TRUNCATE drops the
    old table id, RENAME the old name); ``created``: tables whose rows begin
    after it (TRUNCATE creates a new table id, RENAME the new name). A table
    whose physical layout changed (partitions) is in both, under one name.
    """

    commit_ts: int
    dropped: tuple[TableName, ...] = ()
    created: tuple[TableName, ...] = ()
    #: The DDL text, for logs.
    query: str = ""


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """What sinks receive: all changes of a changefeed in ``(start_ts, end_ts]``.

    ``rows`` are in ``(commit_ts, start_ts, key)`` order. ``ddl`` holds the
    schema changes committed at ``end_ts``; a batch ends at a DDL barrier, and
    sinks apply its DDL after its rows are flushed. ``batch_id`` increases by
    one per batch of a changefeed; a batch may be delivered again with the same
    id after a crash, and sinks must treat the replay as idempotent.

    A sink that sets ``Sink.accepts_partial_batches`` may receive one batch as
    several *parts*: the same ``batch_id``, ``start_ts`` and ``end_ts``,
    ``part`` counting from 0, rows continuing the batch's order, ``ddl`` only
    on the part with ``last_part`` set. Every other sink receives whole
    batches (``part == 0``, ``last_part`` true).
    """

    changefeed_id: str
    batch_id: int
    start_ts: int
    end_ts: int
    rows: Sequence[RowChange] = field(default_factory=tuple)
    ddl: Sequence[DDLEvent] = field(default_factory=tuple)
    #: Position of this part within the batch (0 for a whole batch).
    part: int = 0
    #: Whether this is the batch's last (or only) part; the batch is complete after it.
    last_part: bool = True

    @property
    def resolved_ts(self) -> int:
        """Everything at or below this ts is in this batch or an earlier one."""
        return self.end_ts

    def __iter__(self) -> Iterator[RowChange]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)
