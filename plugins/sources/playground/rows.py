"""Rows of playground tables ↔ TiKV keys and values, with the TiDB codec.

Keys are record keys with the int handle (``pk_is_handle``); values are
rowcodec v2 rows keyed by column id without the primary key, NULLs listed
as null columns — what TiDB writes. Decoding fills columns absent from a
value with their origin default (rows older than an ADD COLUMN).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdcflow.core.data.types import INT_TYPES
from cdcflow.plugins.sources.playground.catalog import Column, TableDef
from cdcflow.plugins.sources.tikv.tidb.keys import decode_record_key, record_key
from cdcflow.plugins.sources.tikv.tidb.rowcodec import decode_column, decode_row, encode_row

__all__ = ["decode_row_value", "encode_row_value", "row_key"]


def row_key(table: TableDef, handle: int) -> bytes:
    """The record key of ``handle``: under its partition's id when the table is partitioned."""
    return record_key(table.physical_id(handle), handle)


def encode_row_value(table: TableDef, row: Mapping[str, Any]) -> bytes:
    """The v2 value of ``row`` (column name → value; missing names are NULL)."""
    return encode_row({c.id: (c.ft, row.get(c.name)) for c in table.columns[1:]})


def _origin_default(column: Column) -> Any:
    value = column.origin_default
    if value is None:
        return None
    return int(value) if column.ft.tp in INT_TYPES else value


def decode_row_value(table: TableDef, key: bytes, value: bytes) -> dict[str, Any]:
    """Column name → value of the row stored under ``key`` (schema ``table``)."""
    handle = decode_record_key(key).handle
    raw = decode_row(value)
    row: dict[str, Any] = {table.pk.name: handle}
    for column in table.columns[1:]:
        if column.id in raw:
            row[column.name] = decode_column(column.ft, raw[column.id])
        else:
            row[column.name] = _origin_default(column)
    return row
