"""The ``shop`` schema of the playground and deterministic values for its columns.

Three tables with the common column types (ints, unsigned, varchar, decimal,
double, datetime, timestamp, time, enum, json) and nullable columns; each has
a clustered BIGINT primary key (``pk_is_handle``: the key carries it, the row
value does not). Values come from a ``random.Random`` so a seed fixes them.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
from collections.abc import Callable
from typing import Any

from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.sources.playground.catalog import Column
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, Flag

__all__ = ["SHOP_DB", "SHOP_TABLES", "random_value"]

SHOP_DB = "shop"

_NN = int(Flag.NOT_NULL)
_PK = int(Flag.NOT_NULL | Flag.PRI_KEY)
_BIN = {"charset": "binary", "collate": "binary"}


def _ft(tp: TypeCode, flag: int = 0, flen: int = -1, dec: int = -1, **kw: Any) -> FieldType:
    if tp in (TypeCode.VARCHAR, TypeCode.STRING, TypeCode.ENUM):
        kw.setdefault("charset", "utf8mb4")
        kw.setdefault("collate", "utf8mb4_bin")
    else:
        kw.setdefault("charset", "binary")
        kw.setdefault("collate", "binary")
    return FieldType(tp=int(tp), flag=flag, flen=flen, decimal=dec, **kw)


#: table name -> columns (ids 1.. in order; the first is the primary key).
SHOP_TABLES: dict[str, tuple[tuple[str, FieldType], ...]] = {
    "customers": (
        ("id", _ft(TypeCode.LONGLONG, _PK, 20)),
        ("name", _ft(TypeCode.VARCHAR, _NN, 64)),
        ("email", _ft(TypeCode.VARCHAR, 0, 128)),
        ("balance", _ft(TypeCode.NEWDECIMAL, _NN, 12, 2)),
        ("vip", _ft(TypeCode.TINY, _NN, 4)),
        ("created_at", _ft(TypeCode.DATETIME, _NN, 19, 0)),
        ("profile", _ft(TypeCode.JSON, 0, -1)),
    ),
    "products": (
        ("id", _ft(TypeCode.LONGLONG, _PK, 20)),
        ("sku", _ft(TypeCode.VARCHAR, _NN, 32)),
        ("price", _ft(TypeCode.NEWDECIMAL, _NN, 10, 2)),
        ("stock", _ft(TypeCode.LONG, _NN | int(Flag.UNSIGNED), 10)),
        ("weight", _ft(TypeCode.DOUBLE, 0, 22)),
        ("updated_at", _ft(TypeCode.TIMESTAMP, _NN, 26, 6)),
    ),
    "orders": (
        ("id", _ft(TypeCode.LONGLONG, _PK, 20)),
        ("customer_id", _ft(TypeCode.LONGLONG, _NN, 20)),
        ("product_id", _ft(TypeCode.LONGLONG, _NN, 20)),
        ("quantity", _ft(TypeCode.LONG, _NN, 11)),
        ("amount", _ft(TypeCode.NEWDECIMAL, _NN, 12, 2)),
        ("status", _ft(TypeCode.ENUM, _NN, 9, elems=("new", "paid", "shipped", "cancelled"))),
        ("note", _ft(TypeCode.VARCHAR, 0, 255)),
        ("ship_window", _ft(TypeCode.DURATION, 0, 10, 0)),
    ),
}

_EPOCH = dt.datetime(2024, 1, 1)


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))


def _decimal(rng: random.Random, ft: FieldType) -> decimal.Decimal:
    whole = rng.randrange(10 ** min(ft.flen - ft.decimal, 6))
    return decimal.Decimal(f"{whole}.{rng.randrange(10**ft.decimal):0{ft.decimal}d}")


_GENERATORS: dict[int, Callable[[random.Random, FieldType], Any]] = {
    TypeCode.LONGLONG: lambda r, ft: r.randrange(1, 10**6),
    TypeCode.LONG: lambda r, ft: r.randrange(0, 10**5),
    TypeCode.TINY: lambda r, ft: r.randrange(0, 2),
    TypeCode.VARCHAR: lambda r, ft: _text(r, r.randrange(1, min(ft.flen, 24))),
    TypeCode.NEWDECIMAL: _decimal,
    TypeCode.DOUBLE: lambda r, ft: round(r.uniform(0, 100), 3),
    TypeCode.DATETIME: lambda r, ft: _EPOCH + dt.timedelta(seconds=r.randrange(10**8)),
    TypeCode.TIMESTAMP: lambda r, ft: (_EPOCH + dt.timedelta(microseconds=r.randrange(10**14))).replace(tzinfo=dt.UTC),
    TypeCode.DURATION: lambda r, ft: dt.timedelta(seconds=r.randrange(0, 86400)),
    TypeCode.ENUM: lambda r, ft: r.choice(ft.elems),
    TypeCode.JSON: lambda r, ft: {"level": r.randrange(5), "tags": [_text(r, 3) for _ in range(r.randrange(3))]},
}


def random_value(rng: random.Random, column: Column) -> Any:
    """A value for ``column``; nullable columns are NULL one time in five."""
    ft = column.ft
    if not ft.not_null and rng.random() < 0.2:
        return None
    return _GENERATORS[ft.tp](rng, ft)
