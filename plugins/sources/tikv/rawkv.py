"""Raw key-value mode (``kv-api: rawkv`` or ``txnkv``): key spans instead of tables.

Each configured key span is presented as a pseudo-table ``<kv-api>.keys_<i>``
with two binary columns, ``key`` (the handle key) and ``value``. Feeds yield
:class:`RawKVEvent`; :class:`RawKVMounter` turns them into :class:`RowChange`
with those two columns, so every sink can take them without a schema:

* PUT without an old value → INSERT ``{key, value}``;
* PUT with an old value → UPDATE, ``before = {key, old value}``;
* DELETE → DELETE, ``before = {key, old value}``.

An old value is only known when the store returns one (ReadOldValue);
without it a PUT over an existing key is reported as an INSERT.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdcflow.core.data.events import ColumnInfo, OpType, RawKVEvent, RowChange, Span, TableName, TableSchema
from cdcflow.core.data.source import BatchMounter, Mounter
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue

__all__ = ["KeySpace", "RawKVBatchMounter", "RawKVMounter", "parse_key_spans"]

# VARCHAR with the binary flag is VARBINARY. Plain ints, as in the schemas the
# TiDB mounter builds: the event store pickles schemas, and a pickled enum member
# would tie a store to the module TypeCode is defined in.
_VARCHAR = int(TypeCode.VARCHAR)
_BLOB = int(TypeCode.BLOB)


def parse_key_spans(pairs: Sequence[Sequence[str]]) -> list[tuple[bytes, bytes]]:
    """``[[start_hex, end_hex], …]`` → byte ranges; raises ConfigInvalidError naming the bad entry."""
    spans: list[tuple[bytes, bytes]] = []
    issues: list[ConfigIssue] = []
    for i, pair in enumerate(pairs):
        path = f"source.key_spans[{i}]"
        if len(pair) != 2:
            issues.append(ConfigIssue(f"expected [start, end] (hex), got {list(pair)!r}", path=path))
            continue
        try:
            start, end = bytes.fromhex(pair[0]), bytes.fromhex(pair[1])
        except ValueError as exc:
            issues.append(ConfigIssue(f"not hex: {exc}", path=path))
            continue
        if end and start >= end:
            issues.append(ConfigIssue(f"start {pair[0]!r} is not below end {pair[1]!r}", path=path))
            continue
        spans.append((start, end))
    if issues:
        raise ConfigInvalidError("invalid key spans for the tikv source in raw mode", issues)
    return spans


class KeySpace:
    """The pseudo-tables of raw mode: one per key span."""

    def __init__(self, kv_api: str, spans: Sequence[tuple[bytes, bytes]]) -> None:
        self.tables = [TableName(kv_api, f"keys_{i}") for i in range(len(spans))]
        self._spans = {t: Span(0, s, e) for t, (s, e) in zip(self.tables, spans, strict=True)}
        self._by_span = {span: t for t, span in self._spans.items()}

    def span(self, table: TableName) -> Span:
        try:
            return self._spans[TableName(table.schema, table.table)]
        except KeyError:
            raise ConfigInvalidError(f"{table} is not one of the configured key spans") from None

    def table(self, span: Span) -> TableName | None:
        return self._by_span.get(span)

    def schema(self, table: TableName) -> TableSchema:
        self.span(table)
        key_flags = ColumnInfo.BINARY | ColumnInfo.PRIMARY_KEY | ColumnInfo.HANDLE_KEY
        return TableSchema(
            table=table,
            columns=(
                ColumnInfo("key", _VARCHAR, key_flags, sql_type="varbinary(8192)", nullable=False),
                ColumnInfo("value", _BLOB, ColumnInfo.BINARY | ColumnInfo.NULLABLE, sql_type="longblob"),
            ),
        )


class RawKVBatchMounter(BatchMounter):
    """Key/value changes as rows of the two-column pseudo-table of their key span.

    Pure and picklable: it holds only the configured key spans, valid at every ts."""

    def __init__(self, keyspace: KeySpace) -> None:
        self._keyspace = keyspace

    def schemas(self) -> list[TableSchema]:
        return [self._keyspace.schema(table) for table in self._keyspace.tables]

    def mount(self, event: RawKVEvent) -> RowChange | None:
        table = self._keyspace.table(event.span)
        if table is None:
            return None
        before: dict[str, Any] | None = {"key": event.key, "value": event.old_value} if event.old_value else None
        if event.delete:
            op, after = OpType.DELETE, None
            before = before or {"key": event.key, "value": None}
        else:
            op = OpType.UPDATE if before is not None else OpType.INSERT
            after = {"key": event.key, "value": event.value}
        return RowChange(
            table=table,
            op=op,
            commit_ts=event.commit_ts,
            start_ts=event.start_ts,
            after=after,
            before=before,
            schema=self._keyspace.schema(table),
            key=event.key,
        )


class RawKVMounter(Mounter):
    """The raw mode's mounter: :class:`RawKVBatchMounter` on the capture, and for every batch."""

    def __init__(self, keyspace: KeySpace) -> None:
        self._batch = RawKVBatchMounter(keyspace)

    async def for_batch(self, start_ts: int, end_ts: int) -> BatchMounter:
        return self._batch

    async def mount(self, event: RawKVEvent) -> RowChange | None:
        return self._batch.mount(event)
