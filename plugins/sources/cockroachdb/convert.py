"""Sinkless changefeed rows into the core's events: a pure function.

A sinkless changefeed streams rows ``(table, key, value)``: ``table`` the
table's name, ``key`` the JSON array of the primary key, ``value`` the wrapped
envelope ``{"after": …, "before": …, "updated": "<hlc>", "mvcc_timestamp":
"<hlc>"}``; resolved rows have a NULL table and key and value
``{"resolved": "<hlc>"}`` (../reference facts §2). :func:`convert_rows`
depends only on its arguments — the rows and the catalog schemas — so that a
Spark task can run it as well as the capture.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cdcflow.core.data.events import OpType, RowChange, TableSchema
from cdcflow.core.errors import CdcflowError
from cdcflow.plugins.sources.cockroachdb.hlc import HLC
from cdcflow.plugins.sources.cockroachdb.types import decode_value, kind_of

__all__ = ["FeedRow", "Resolved", "convert_row", "convert_rows"]


@dataclass(frozen=True, slots=True)
class FeedRow:
    """One row of a sinkless changefeed as the SQL client receives it."""

    table: str | None
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class Resolved:
    """A resolved row: no row at or below ``hlc`` follows on this feed."""

    hlc: HLC


def _json(data: bytes | str) -> Any:
    return json.loads(data, parse_float=Decimal)


def _image(raw: Mapping[str, Any] | None, schema: TableSchema) -> dict[str, Any] | None:
    if raw is None:
        return None
    # A column the row lacks (written before an ADD COLUMN the catalog already shows) reads NULL;
    # a field the catalog lacks (a column dropped since) is left out.
    return {col.name: decode_value(raw.get(col.name), kind_of(col)) for col in schema.columns}


def convert_row(row: FeedRow, schemas: Mapping[str, TableSchema]) -> RowChange | Resolved:
    """One feed row as a :class:`RowChange` (typed by ``schemas[row.table]``) or :class:`Resolved`."""
    envelope = _json(row.value)
    if row.table is None:
        return Resolved(HLC.parse(envelope["resolved"]))
    schema = schemas.get(row.table)
    if schema is None:
        raise CdcflowError(f"cockroachdb source: a feed row of table {row.table!r}, which has no schema")
    ts = HLC.parse(envelope.get("mvcc_timestamp") or envelope["updated"])
    after = _image(envelope.get("after"), schema)
    before = _image(envelope.get("before"), schema)
    if after is None:
        op = OpType.DELETE
    elif before is None:
        op = OpType.INSERT
    else:
        op = OpType.UPDATE
    return RowChange(
        table=schema.table,
        op=op,
        commit_ts=ts.commit_ts,
        start_ts=ts.start_ts,
        after=after,
        before=before,
        schema=schema,
        key=row.key or b"",
    )


def convert_rows(rows: Iterable[FeedRow], schemas: Mapping[str, TableSchema]) -> Sequence[RowChange | Resolved]:
    """Every feed row converted, in feed order (see :func:`convert_row`)."""
    return [convert_row(row, schemas) for row in rows]
