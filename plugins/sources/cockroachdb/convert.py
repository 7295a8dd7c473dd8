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
from cdcflow.core.errors import CdcflowError, UnsupportedProtocolError
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


class _Malformed(Exception):
    """What is wrong with a feed row (becomes an UnsupportedProtocolError naming table and key)."""


def _json(data: bytes | str) -> Any:
    try:
        return json.loads(data, parse_float=Decimal)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError; nesting past the stack
        raise _Malformed(f"the value is not JSON: {e}") from None


def _hlc(envelope: Mapping[str, Any], *fields: str) -> HLC:
    for name in fields:
        raw = envelope.get(name)
        if raw:
            if not isinstance(raw, str | Decimal):
                raise _Malformed(f"{name!r} is a {type(raw).__name__}, not an HLC timestamp")
            try:
                return HLC.parse(raw)
            except ValueError as e:
                raise _Malformed(f"{name!r}: {e}") from None
    raise _Malformed(f"the envelope has no {' or '.join(repr(f) for f in fields)} timestamp")


#: What a JSON value its column's kind cannot hold raises while being converted.
_VALUE_ERRORS = (ValueError, TypeError, ArithmeticError, RecursionError)


def _image(raw: Any, schema: TableSchema, part: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _Malformed(f"{part!r} is a JSON {type(raw).__name__}, not an object of columns")
    # A column the row lacks (written before an ADD COLUMN the catalog already shows) reads NULL;
    # a field the catalog lacks (a column dropped since) is left out.
    image = {}
    for col in schema.columns:
        value = raw.get(col.name)
        kind = kind_of(col)
        try:
            image[col.name] = decode_value(value, kind)
        except _VALUE_ERRORS as e:
            raise _Malformed(f"column {col.name!r} of {part!r}: {value!r:.60} is not a {kind} value ({e})") from None
    return image


def convert_row(row: FeedRow, schemas: Mapping[str, TableSchema]) -> RowChange | Resolved:
    """One feed row as a :class:`RowChange` (typed by ``schemas[row.table]``) or :class:`Resolved`.

    A row that is not what a changefeed writes (not JSON, not an object, no
    timestamp, a value its column's type cannot hold) raises
    :class:`UnsupportedProtocolError` (6001) naming the table, the key (hex)
    and what is wrong.
    """
    try:
        return _convert(row, schemas)
    except _Malformed as e:
        table = row.table if row.table is not None else "(resolved)"
        schema = schemas.get(row.table) if row.table is not None else None
        name = f"{schema.table.schema}.{schema.table.table}" if schema is not None else table
        key = (row.key or b"").hex()
        raise UnsupportedProtocolError(
            f"cockroachdb source: cannot decode a feed row of {name} at key {key}: {e}; "
            "the changefeed stops here (check the CockroachDB version and the changefeed's options)",
            detail={"table": name, "key": key, "cause": str(e)},
        ) from None


def _convert(row: FeedRow, schemas: Mapping[str, TableSchema]) -> RowChange | Resolved:
    envelope = _json(row.value)
    if not isinstance(envelope, dict):
        raise _Malformed(f"the value is a JSON {type(envelope).__name__}, not an object")
    if row.table is None:
        return Resolved(_hlc(envelope, "resolved"))
    schema = schemas.get(row.table)
    if schema is None:
        raise CdcflowError(f"cockroachdb source: a feed row of table {row.table!r}, which has no schema")
    ts = _hlc(envelope, "mvcc_timestamp", "updated")
    after = _image(envelope.get("after"), schema, "after")
    before = _image(envelope.get("before"), schema, "before")
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
