"""Row changes as Spark rows: column types, changelog records and change records.

Column types come from the upstream schema when a row carries one, else
from the Python values of the batch (the first non-NULL value of a column
decides; a column that is NULL throughout is a string). A later batch may
widen a table with new columns; the snapshot job then aligns by name.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping, Sequence
from typing import Any

from cdcflow.core.data.events import ColumnInfo, OpType, RowChange, tso_physical_ms
from cdcflow.core.data.types import BLOB_TYPES, CHAR_TYPES, DECIMAL_TYPES, TypeCode

__all__ = [
    "CHANGE_META",
    "add_image_columns",
    "change_records",
    "changelog_records",
    "column_type",
    "decimal_ints",
    "delta_records",
    "image_columns",
    "merge_image_columns",
    "spark_type_of",
]

#: Columns the sink adds to a change record (the snapshot job's input).
CHANGE_META = ("_deleted", "_commit_ts", "_seq")

# MySQL type bytes → Spark SQL type names.
_BY_TYPE_CODE: dict[int, str] = {
    code: spark
    for spark, codes in (
        ("int", (TypeCode.TINY, TypeCode.SHORT, TypeCode.INT24, TypeCode.YEAR)),
        ("bigint", (TypeCode.LONG, TypeCode.LONGLONG)),
        ("float", (TypeCode.FLOAT,)),
        ("double", (TypeCode.DOUBLE,)),
        ("decimal(38,10)", DECIMAL_TYPES),
        ("date", (TypeCode.DATE,)),
        ("timestamp", (TypeCode.TIMESTAMP,)),
        ("timestamp_ntz", (TypeCode.DATETIME,)),
        ("string", (*CHAR_TYPES, TypeCode.DURATION, TypeCode.JSON, TypeCode.ENUM, TypeCode.SET)),
        ("binary", (*BLOB_TYPES, TypeCode.BIT)),
    )
    for code in codes
}


def spark_type_of(value: Any) -> str:
    """A Spark SQL type name for a Python value of a row image."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        exponent = value.as_tuple().exponent
        scale = min(max(-exponent, 0), 18) if isinstance(exponent, int) else 10
        return f"decimal(38,{max(scale, 10)})"
    if isinstance(value, bytes | bytearray):
        return "binary"
    if isinstance(value, dt.datetime):
        return "timestamp" if value.tzinfo is not None else "timestamp_ntz"
    if isinstance(value, dt.date):
        return "date"
    return "string"


def _from_schema(column: ColumnInfo) -> str | None:
    name = _BY_TYPE_CODE.get(column.type_code)
    if name in ("int", "bigint") and column.flags & ColumnInfo.UNSIGNED:
        # Only BIGINT UNSIGNED outgrows Spark's bigint; INT UNSIGNED (LONG) fits in it.
        return "decimal(20,0)" if column.type_code == TypeCode.LONGLONG else "bigint"
    return name


def column_type(column: ColumnInfo) -> str:
    """The Spark type of an upstream column (from its origin default's value when the type is unknown)."""
    known = _from_schema(column)
    if known is not None:
        return known
    return spark_type_of(column.origin_default) if column.origin_default is not None else "string"


def image_columns(rows: Sequence[RowChange]) -> dict[str, str]:
    """Column name → Spark type over every image of ``rows``, in first-seen order."""
    types: dict[str, str | None] = {}
    for row in rows:
        add_image_columns(types, row)
    return {name: kind or "string" for name, kind in types.items()}


def add_image_columns(types: dict[str, str | None], row: RowChange) -> None:
    """Add the columns of ``row``'s images to ``types`` (None: no type known yet), as
    :func:`image_columns` does row by row."""
    known: dict[str, str | None] | None = None
    for image in (row.before, row.after):
        for name, value in (image or {}).items():
            if types.get(name) is None:
                if known is None:
                    known = {c.name: _from_schema(c) for c in row.schema.columns} if row.schema else {}
                types[name] = known.get(name) or (spark_type_of(value) if value is not None else None)


def merge_image_columns(types: dict[str, str | None], more: Mapping[str, str | None]) -> None:
    """Add the columns ``more`` found in later rows to ``types``, as :func:`add_image_columns` would."""
    for name, kind in more.items():
        if types.get(name) is None:
            types[name] = kind


def decimal_ints(rows: Sequence[RowChange], types: Mapping[str, str]) -> list[RowChange]:
    """``rows`` with integer values of decimal-typed columns as ``Decimal``.

    Unsigned BIGINT is ``decimal(20,0)`` in Spark but an ``int`` in the row image; Spark
    (without schema verification) would store such an ``int`` as NULL.
    """
    decimals = tuple(name for name, kind in types.items() if kind.startswith("decimal"))
    if not decimals:
        return list(rows)
    out = []
    for row in rows:
        before, after = _decimal_image(row.before, decimals), _decimal_image(row.after, decimals)
        if before is row.before and after is row.after:
            out.append(row)  # no int in a decimal column: the row as it is
        else:
            out.append(RowChange(row.table, row.op, row.commit_ts, row.start_ts, after, before, row.schema, row.key))
    return out


def _decimal_image(values: Mapping[str, Any] | None, decimals: Sequence[str]) -> Mapping[str, Any] | None:
    """``values`` with the ints of ``decimals`` as ``Decimal`` (``values`` itself if none is)."""
    if values is None:
        return None
    ints = [name for name in decimals if type(values.get(name)) is int]
    if not ints:
        return values
    image = dict(values)
    for name in ints:
        image[name] = decimal.Decimal(image[name])
    return image


def _cell(value: Any) -> Any:
    if isinstance(value, dt.timedelta):
        return str(value)  # TIME values: Parquet has no interval type Spark reads back everywhere
    if isinstance(value, decimal.Decimal | bytearray):
        return bytes(value) if isinstance(value, bytearray) else value
    return value


#: The value types :func:`_cell` changes (exact types, as mounters give them); values of
#: any other type are kept as they are.
_CONVERTED = frozenset({dt.timedelta, bytearray})


def _cells(image: Mapping[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    """``image``'s values of ``columns`` as cells: looked up and checked by C loops, and
    converted one by one only when one of them has a type :func:`_cell` changes."""
    values = tuple(map(image.get, columns))
    if _CONVERTED.isdisjoint(map(type, values)):
        return values
    return tuple(map(_cell, values))


def _image(image: Mapping[str, Any] | None, columns: Sequence[str]) -> tuple[Any, ...] | None:
    return None if image is None else _cells(image, columns)


def _flat(image: Mapping[str, Any] | None, columns: Sequence[str]) -> tuple[Any, ...]:
    return _cells(image or {}, columns)


def changelog_records(
    rows: Sequence[RowChange], columns: Sequence[str], batch_id: int, first_seq: int = 0
) -> list[tuple[Any, ...]]:
    """(op, commit_ts, start_ts, seq, before, after, commit_date, batch_id) per change
    (``seq`` counting from ``first_seq``)."""
    records = []
    for seq, row in enumerate(rows, first_seq):
        day = dt.datetime.fromtimestamp(tso_physical_ms(row.commit_ts) / 1000, dt.UTC).date()
        records.append(
            (
                row.op.value,
                row.commit_ts,
                row.start_ts,
                seq,
                _image(row.before, columns),
                _image(row.after, columns),
                day,
                batch_id,
            )
        )
    return records


def change_records(
    rows: Sequence[RowChange], columns: Sequence[str], keys: Sequence[str], first_seq: int = 0
) -> list[tuple[Any, ...]]:
    """Per change: the row (after image, or the key of a deleted row) + (_deleted, _commit_ts, _seq).

    An update that moves the key also deletes the old key, ordered just before it.
    ``first_seq``: the position of the first of ``rows`` among the changes of its table.
    """
    records = []
    for seq, row in enumerate(rows, first_seq):
        moved = row.op is OpType.UPDATE and row.before is not None and row.after is not None
        if moved and any((row.before or {}).get(k) != (row.after or {}).get(k) for k in keys):
            records.append((*_flat(row.before, columns), True, row.commit_ts, 2 * seq))
        if row.op is OpType.DELETE:
            records.append((*_flat(row.before, columns), True, row.commit_ts, 2 * seq + 1))
        else:
            records.append((*_flat(row.after, columns), False, row.commit_ts, 2 * seq + 1))
    return records


def delta_records(rows: Sequence[RowChange], columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """For a table without a key: each image with +1 (after) or -1 (before)."""
    records = []
    for row in rows:
        if row.before is not None:
            records.append((*_flat(row.before, columns), -1))
        if row.after is not None:
            records.append((*_flat(row.after, columns), 1))
    return records
