"""Where each event goes: topic expressions and partition dispatchers (TiCDC's rules).

Partition rules, with ``H`` the position hash below:

``table`` (and ``default``)
    ``H(schema‖table) mod n`` — every row of a table in one partition.
``index-value``
    ``(H(schema‖table) ⊕ H(col‖value) for each handle-key column) mod n`` —
    every version of one row in one partition.
``columns``
    like index-value over the listed ``columns`` (which must exist).
``ts``
    ``commit_ts mod n`` — spreads load; rows of one key may land in
    different partitions, so a consumer must order by commit ts across
    partitions (the Open Protocol recipe applies rows at resolved ts).

``H`` is TiCDC's ``PositionInertia`` hash: each ``write(a, b, …)`` computes
CRC32-IEEE over the concatenated arguments and XORs it into an accumulator
that starts at 0, so the order of columns does not matter. Values are hashed
as TiCDC's ``ColumnValueString`` prints them.
"""

from __future__ import annotations

import abc
import datetime as dt
import decimal
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cdcflow.core.data.events import ColumnInfo, RowChange, TableName
from cdcflow.core.data.filter import FilterRuleError, TableFilter
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin.base import kebab
from cdcflow.plugins.codecs.columns import format_date_value, fsp_of, handle_key_names, schema_column
from cdcflow.plugins.codecs.gojson import go_float_plain

__all__ = [
    "DispatchRule",
    "Dispatcher",
    "EventRouter",
    "PositionHash",
    "TopicExpression",
    "column_value_string",
    "make_dispatcher",
]


class PositionHash:
    """TiCDC's partition hash: XOR of CRC32-IEEE sums, one per :meth:`write`."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def write(self, *parts: bytes) -> PositionHash:
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        self.value ^= crc
        return self

    def sum32(self) -> int:
        return self.value


def column_value_string(value: Any, column: ColumnInfo | None = None) -> bytes:
    """A row value as TiCDC's ``ColumnValueString`` prints it, for hashing.

    ``column`` (when the schema is known) gives FLOAT its float32 digits and
    dates and times their fractional-second precision, as TiDB prints them.
    """
    if value is None:
        return b"null"
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, float):
        bits = 32 if column is not None and column.type_code == TypeCode.FLOAT else 64
        return go_float_plain(value, bits).encode()
    if isinstance(value, decimal.Decimal):
        return format(value, "f").encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dt.date | dt.time | dt.timedelta):
        fsp = fsp_of(column) if column is not None else None
        return format_date_value(0, value, fsp).encode()
    return str(value).encode("utf-8")


class Dispatcher(abc.ABC):
    """Chooses the partition of a row change."""

    @abc.abstractmethod
    def partition(self, row: RowChange, partitions: int) -> int: ...

    def key_columns(self, row: RowChange) -> tuple[str, ...] | None:
        """Columns whose change moves a row to another partition (None: none can)."""
        return None

    def table_partition(self, table: TableName, partitions: int) -> int | None:
        """The partition of every row of ``table``, when it does not depend on the row (None)."""
        return None


def _table_hash(table: TableName) -> PositionHash:
    return PositionHash().write(table.schema.encode(), table.table.encode())


class TableDispatcher(Dispatcher):
    def __init__(self) -> None:
        self._hashes: dict[tuple[str, str], int] = {}

    def partition(self, row: RowChange, partitions: int) -> int:
        return self.table_partition(row.table, partitions)

    def table_partition(self, table: TableName, partitions: int) -> int:
        name = (table.schema, table.table)
        hashed = self._hashes.get(name)
        if hashed is None:
            hashed = self._hashes[name] = _table_hash(table).sum32()
        return hashed % partitions


class TsDispatcher(Dispatcher):
    def partition(self, row: RowChange, partitions: int) -> int:
        return row.commit_ts % partitions


class IndexValueDispatcher(Dispatcher):
    """Hash of the handle-key columns; a row without known handle key falls back to its table."""

    def key_columns(self, row: RowChange) -> tuple[str, ...]:
        return handle_key_names(row)

    def partition(self, row: RowChange, partitions: int) -> int:
        hasher = _table_hash(row.table)
        image = row.after if row.after is not None else row.before or {}
        for name in self.key_columns(row):
            if name in image:
                hasher.write(name.encode(), column_value_string(image[name], schema_column(row, name)))
        return hasher.sum32() % partitions


class ColumnsDispatcher(Dispatcher):
    """Hash of user-chosen columns (names compared case-insensitively)."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = tuple(columns)

    def key_columns(self, row: RowChange) -> tuple[str, ...]:
        image = row.after if row.after is not None else row.before or {}
        by_lower = {name.lower(): name for name in image}
        return tuple(by_lower.get(c.lower(), c) for c in self.columns)

    def partition(self, row: RowChange, partitions: int) -> int:
        image = row.after if row.after is not None else row.before or {}
        by_lower = {name.lower(): name for name in image}
        hasher = _table_hash(row.table)
        for column in self.columns:
            actual = by_lower.get(column.lower())
            if actual is None:
                raise ConfigInvalidError(
                    f"partition rule 'columns' names column {column!r}, which table {row.table} does not have",
                    detail={"table": str(row.table), "column": column},
                )
            hasher.write(column.encode(), column_value_string(image[actual], schema_column(row, actual)))
        return hasher.sum32() % partitions


PARTITION_RULES = ("default", "table", "index-value", "rowid", "ts", "columns")


def make_dispatcher(rule: str, columns: Sequence[str] = ()) -> Dispatcher:
    """The dispatcher of a partition rule name."""
    if rule in ("default", "table", ""):
        return TableDispatcher()
    if rule in ("index-value", "rowid"):
        return IndexValueDispatcher()
    if rule == "ts":
        return TsDispatcher()
    if rule == "columns":
        if not columns:
            raise ConfigInvalidError("partition rule 'columns' needs a non-empty 'columns' list")
        return ColumnsDispatcher(columns)
    raise ConfigInvalidError(f"unknown partition rule {rule!r}; known: {', '.join(PARTITION_RULES)}")


# -- topics -------------------------------------------------------------------------

_TOPIC_CHARS = r"[A-Za-z0-9._-]"
_EXPRESSION = re.compile(rf"^{_TOPIC_CHARS}*\{{schema\}}({_TOPIC_CHARS}*\{{table\}})?{_TOPIC_CHARS}*$")
_HARD_CODED = re.compile(rf"^{_TOPIC_CHARS}+$")
_NOT_TOPIC_CHAR = re.compile(r"[^A-Za-z0-9._-]")
#: Kafka's limit on topic name length.
MAX_TOPIC_LENGTH = 249


class TopicExpression:
    """``[prefix]{schema}[middle][{table}][suffix]``, or a plain topic name.

    Characters outside ``[A-Za-z0-9._-]`` in schema and table names are
    replaced by ``_`` when the expression is filled in (as TiCDC does).
    """

    def __init__(self, text: str) -> None:
        if not (_EXPRESSION.match(text) or _HARD_CODED.match(text)):
            raise ConfigInvalidError(
                f"topic expression {text!r} is invalid: use [prefix]{{schema}}[middle][{{table}}][suffix] "
                "or a plain name, with characters A-Z a-z 0-9 . _ - and lower-case placeholders"
            )
        if len(text.replace("{schema}", "").replace("{table}", "")) > MAX_TOPIC_LENGTH:
            raise ConfigInvalidError(f"topic expression {text!r} is longer than {MAX_TOPIC_LENGTH} characters")
        self.text = text

    def topic(self, schema: str, table: str) -> str:
        name = self.text.replace("{schema}", _NOT_TOPIC_CHAR.sub("_", schema)).replace(
            "{table}", _NOT_TOPIC_CHAR.sub("_", table)
        )
        if len(name) > MAX_TOPIC_LENGTH:
            raise ConfigInvalidError(
                f"topic {name!r} for {schema}.{table} is longer than {MAX_TOPIC_LENGTH} characters"
            )
        return name


class DispatchRule(BaseModel):
    """One ``dispatchers`` entry: tables it matches, their topic and partition rule."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=kebab, populate_by_name=True)

    matcher: list[str] = Field(default_factory=lambda: ["*.*"], description="Table filter rules, e.g. ['shop.*'].")
    topic: str = Field("", description="Topic expression for matched tables; empty keeps the sink's topic.")
    partition: str = Field("default", description="Partition rule: default, table, index-value, ts or columns.")
    dispatcher: str = Field("", description="Older name of 'partition'; give one of the two.")
    columns: list[str] = Field(default_factory=list, description="Columns hashed by the 'columns' rule.")


class EventRouter:
    """Maps a table to its topic and partition dispatcher: the first matching rule wins."""

    def __init__(self, default_topic: str, rules: Sequence[DispatchRule]) -> None:
        self.default_topic = default_topic
        self._rules: list[tuple[TableFilter, TopicExpression | None, Dispatcher]] = []
        for n, rule in enumerate(rules):
            if rule.dispatcher and rule.partition != "default":
                raise ConfigInvalidError(f"dispatchers[{n}] gives both 'partition' and 'dispatcher'; give one")
            try:
                matcher = TableFilter(rule.matcher)
            except FilterRuleError as exc:
                raise ConfigInvalidError(f"dispatchers[{n}].matcher: {exc}") from exc
            topic = TopicExpression(rule.topic) if rule.topic else None
            self._rules.append((matcher, topic, make_dispatcher(rule.dispatcher or rule.partition, rule.columns)))
        self._cache: dict[tuple[str, str], tuple[str, Dispatcher]] = {}

    def route(self, table: TableName) -> tuple[str, Dispatcher]:
        """The topic and dispatcher of ``table``'s rows and DDL."""
        key = (table.schema, table.table)
        hit = self._cache.get(key)
        if hit is None:
            hit = (self.default_topic, TableDispatcher())
            for matcher, topic, dispatcher in self._rules:
                if matcher.matches(table.schema, table.table):
                    name = topic.topic(table.schema, table.table) if topic else self.default_topic
                    hit = (name, dispatcher)
                    break
            self._cache[key] = hit
        return hit

    def dispatches_by_table(self) -> bool:
        """Whether some table's rows all go to one partition (the ``table`` rule, or no
        rule matching every table, which leaves the rest to the default table rule)."""
        catch_all = any(m.matches_every_table() for m, _, _ in self._rules)
        return not catch_all or any(isinstance(d, TableDispatcher) for _, _, d in self._rules)

    def topic_of(self, table: TableName | None) -> str:
        """Topic of a DDL: its table's topic, the default topic for schema-level DDL."""
        if table is None or not table.table:
            return self.default_topic
        return self.route(table)[0]


def key_changed(dispatcher: Dispatcher, row: RowChange) -> bool:
    """Whether an update changes the columns its partition depends on."""
    columns = dispatcher.key_columns(row)
    if not columns or row.before is None or row.after is None:
        return False
    before: Mapping[str, Any] = row.before
    after: Mapping[str, Any] = row.after
    return any(before.get(c) != after.get(c) for c in columns)
