"""TiDB's table metadata as the status API serves it, and what sinks see of it.

:class:`TiDBTable` models ``TableInfo`` JSON (``/schema/{db}/{table}``,
``/schema?table_id=``, a DDL job's ``binlog.TableInfo``); :class:`TiDBColumn`
``ColumnInfo`` and :class:`TiDBIndex` ``IndexInfo`` (keys ``is_unique``,
``is_primary``). Parsing is lenient: unknown keys are ignored and kept in
``raw`` so that :meth:`TiDBTable.to_json` writes back what was read.

:meth:`TiDBTable.table_schema` maps a table to :class:`cdcflow.core.data.events.TableSchema`:
public, non-virtual columns in offset order, MySQL type byte as ``type_code``
and the Open Protocol flag bits:

* handle key — the PK-is-handle column; else the columns of the primary key
  index; else of the first unique index whose columns are all NOT NULL;
* primary / unique / multiple key, unsigned — from the column's MySQL flags;
* nullable — no NotNullFlag; binary — charset ``binary``; generated — has an expression;
* origin default — :meth:`TiDBColumn.origin_default_value`, the value of the column in
  rows written before it existed (what the mounter fills in for it, and what a sink
  gives existing rows on ADD COLUMN).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.data.events import ColumnInfo, TableName, TableSchema
from cdcflow.core.data.types import INT_TYPES, TypeCode
from cdcflow.plugins.sources.tikv.tidb.fieldtype import STRING_TYPES, FieldType, Flag

__all__ = ["STATE_PUBLIC", "TiDBColumn", "TiDBDatabase", "TiDBIndex", "TiDBTable", "ci_name"]

STATE_PUBLIC = 5
#: Schema ids with this bit set are in-memory schemas (INFORMATION_SCHEMA …) without rows.
MEMORY_SCHEMA_FLAG = 1 << 62


def ci_name(value: Any) -> str:
    """The original form ``O`` of a CIStr (TiDB also accepts a bare string)."""
    if isinstance(value, Mapping):
        return str(value.get("O") or value.get("L") or "")
    return str(value or "")


def to_ci(name: str) -> dict[str, str]:
    return {"O": name, "L": name.lower()}


@dataclass(frozen=True, slots=True)
class TiDBColumn:
    """One ``ColumnInfo``. ``id`` is what row values are keyed by."""

    id: int
    name: str
    offset: int
    type: FieldType
    state: int = STATE_PUBLIC
    origin_default: Any = None
    origin_default_bit: bytes | None = None
    default: Any = None
    generated_expr: str = ""
    generated_stored: bool = False
    hidden: bool = False
    version: int = 2
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TiDBColumn:
        bit = data.get("origin_default_bit")
        return cls(
            id=int(data["id"]),
            name=ci_name(data.get("name")),
            offset=int(data.get("offset", 0)),
            type=FieldType.from_json(data.get("type") or {}),
            state=int(data.get("state", STATE_PUBLIC)),
            origin_default=data.get("origin_default"),
            origin_default_bit=base64.b64decode(bit) if bit else None,
            default=data.get("default"),
            generated_expr=str(data.get("generated_expr_string") or ""),
            generated_stored=bool(data.get("generated_stored")),
            hidden=bool(data.get("hidden")),
            version=int(data.get("version", 0)),
            raw=dict(data),
        )

    def to_json(self) -> dict[str, Any]:
        out = dict(self.raw)
        out.update(
            id=self.id,
            name=to_ci(self.name),
            offset=self.offset,
            type=self.type.to_json(),
            state=self.state,
            origin_default=self.origin_default,
            origin_default_bit=base64.b64encode(self.origin_default_bit).decode() if self.origin_default_bit else None,
            default=self.default,
            generated_expr_string=self.generated_expr,
            generated_stored=self.generated_stored,
            hidden=self.hidden,
            version=self.version,
        )
        out.setdefault("comment", "")
        out.setdefault("dependences", None)
        out.setdefault("default_bit", None)
        out.setdefault("change_state_info", None)
        return out

    @property
    def is_public(self) -> bool:
        return self.state == STATE_PUBLIC

    @property
    def is_virtual(self) -> bool:
        """A VIRTUAL generated column: never stored in a row."""
        return bool(self.generated_expr) and not self.generated_stored

    def origin_default_value(self) -> Any:
        """The value of this column in a row written before it existed.

        ``origin_default`` if set (BIT: ``origin_default_bit``); else NULL if
        nullable; else the type's zero value (first ENUM member), as TiDB and
        TiCDC fill it. Raises ValueError if the default text does not parse.
        """
        ft = self.type
        if ft.tp == TypeCode.BIT and self.origin_default_bit is not None:
            return int.from_bytes(self.origin_default_bit, "big")
        if self.origin_default is not None:
            return parse_default(ft, self.origin_default)
        if not ft.not_null:
            return None
        return zero_value(ft)


def parse_default(ft: FieldType, text: Any) -> Any:
    """A default value as the status API writes it (usually text) → the decoded Python value."""
    tp = ft.tp
    s = str(text)
    if tp in INT_TYPES:
        return int(decimal.Decimal(s))
    if tp in (TypeCode.FLOAT, TypeCode.DOUBLE):
        return float(s)
    if tp == TypeCode.NEWDECIMAL:
        return decimal.Decimal(s)
    if tp in STRING_TYPES:
        return s.encode("utf-8") if ft.is_binary else s
    if tp in (TypeCode.DATE, TypeCode.NEWDATE):
        return s if s.startswith("0000") else dt.date.fromisoformat(s[:10])
    if tp in (TypeCode.DATETIME, TypeCode.TIMESTAMP):
        if s.startswith("0000"):
            return s
        value = dt.datetime.fromisoformat(s)
        return value.replace(tzinfo=dt.UTC) if tp == TypeCode.TIMESTAMP else value
    if tp == TypeCode.DURATION:
        return _parse_duration(s)
    if tp == TypeCode.ENUM:
        return ft.elems.index(s) + 1 if s in ft.elems else int(s)
    if tp == TypeCode.SET:
        return sum(1 << ft.elems.index(m) for m in s.split(",") if m) if s else 0
    if tp == TypeCode.BIT:
        return int.from_bytes(s.encode("latin-1"), "big")
    if tp == TypeCode.JSON:
        return s
    raise ValueError(f"no default for column type {tp}")


def _parse_duration(s: str) -> dt.timedelta:
    negative = s.startswith("-")
    hours, minutes, seconds = [*s.lstrip("-").split(":"), "0", "0"][:3]
    delta = dt.timedelta(hours=int(hours), minutes=int(minutes), seconds=float(seconds))
    return -delta if negative else delta


def zero_value(ft: FieldType) -> Any:
    tp = ft.tp
    zeros: dict[int, Any] = {
        TypeCode.FLOAT: 0.0,
        TypeCode.DOUBLE: 0.0,
        TypeCode.NEWDECIMAL: decimal.Decimal(0),
        TypeCode.DATE: "0000-00-00",
        TypeCode.NEWDATE: "0000-00-00",
        TypeCode.DATETIME: "0000-00-00 00:00:00",
        TypeCode.TIMESTAMP: "0000-00-00 00:00:00",
        TypeCode.DURATION: dt.timedelta(0),
        TypeCode.ENUM: 1,
        TypeCode.SET: 0,
        TypeCode.BIT: 0,
        TypeCode.JSON: "null",
    }
    if tp in INT_TYPES:
        return 0
    if tp in STRING_TYPES:
        return b"" if ft.is_binary else ""
    return zeros.get(tp)


@dataclass(frozen=True, slots=True)
class TiDBIndex:
    """One ``IndexInfo``; ``columns`` are (column name, offset in ``cols``)."""

    id: int
    name: str
    columns: tuple[tuple[str, int], ...]
    unique: bool = False
    primary: bool = False
    state: int = STATE_PUBLIC

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TiDBIndex:
        return cls(
            id=int(data["id"]),
            name=ci_name(data.get("idx_name")),
            columns=tuple((ci_name(c.get("name")), int(c.get("offset", 0))) for c in data.get("idx_cols") or ()),
            unique=bool(data.get("is_unique")),
            primary=bool(data.get("is_primary")),
            state=int(data.get("state", STATE_PUBLIC)),
        )

    def to_json(self, table_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "idx_name": to_ci(self.name),
            "tbl_name": to_ci(table_name),
            "idx_cols": [{"name": to_ci(n), "offset": o, "length": -1} for n, o in self.columns],
            "state": self.state,
            "backfill_state": 0,
            "comment": "",
            "index_type": 1,
            "is_unique": self.unique,
            "is_primary": self.primary,
            "is_invisible": False,
            "is_global": False,
            "mv_index": False,
        }


@dataclass(frozen=True, slots=True)
class TiDBDatabase:
    """One ``DBInfo``."""

    id: int
    name: str
    state: int = STATE_PUBLIC

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TiDBDatabase:
        return cls(int(data["id"]), ci_name(data.get("db_name")), int(data.get("state", STATE_PUBLIC)))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "db_name": to_ci(self.name),
            "charset": "utf8mb4",
            "collate": "utf8mb4_bin",
            "state": self.state,
            "policy_ref_info": None,
        }

    @property
    def is_memory_schema(self) -> bool:
        return bool(self.id & MEMORY_SCHEMA_FLAG)


@dataclass(frozen=True, slots=True)
class TiDBTable:
    """One ``TableInfo``: a logical table and the physical ids that hold its rows."""

    id: int
    name: str
    columns: tuple[TiDBColumn, ...]
    indices: tuple[TiDBIndex, ...] = ()
    pk_is_handle: bool = False
    is_common_handle: bool = False
    partition_ids: tuple[int, ...] = ()
    is_view: bool = False
    is_sequence: bool = False
    update_timestamp: int = 0
    state: int = STATE_PUBLIC
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TiDBTable:
        partition = data.get("partition") or {}
        parts: tuple[int, ...] = ()
        if partition and partition.get("enable"):
            defs = list(partition.get("definitions") or []) + list(partition.get("adding_definitions") or [])
            parts = tuple(dict.fromkeys(int(d["id"]) for d in defs))
        return cls(
            id=int(data["id"]),
            name=ci_name(data.get("name")),
            columns=tuple(TiDBColumn.from_json(c) for c in data.get("cols") or ()),
            indices=tuple(TiDBIndex.from_json(i) for i in data.get("index_info") or ()),
            pk_is_handle=bool(data.get("pk_is_handle")),
            is_common_handle=bool(data.get("is_common_handle")),
            partition_ids=parts,
            is_view=data.get("view") is not None,
            is_sequence=data.get("sequence") is not None,
            update_timestamp=int(data.get("update_timestamp") or 0),
            state=int(data.get("state", STATE_PUBLIC)),
            raw=dict(data),
        )

    def to_json(self) -> dict[str, Any]:
        """TableInfo JSON shaped like TiDB's (keys the status API serves)."""
        out: dict[str, Any] = {
            "charset": "utf8mb4",
            "collate": "utf8mb4_bin",
            "constraint_info": None,
            "fk_info": None,
            "comment": "",
            "auto_inc_id": 0,
            "max_col_id": max((c.id for c in self.columns), default=0),
            "max_idx_id": max((i.id for i in self.indices), default=0),
            "ShardRowIDBits": 0,
            "partition": None,
            "view": None,
            "sequence": None,
            "Lock": None,
            "version": 5,
            "tiflash_replica": None,
            "temp_table_type": 0,
            "cache_table_status": 0,
        }
        out.update(self.raw)
        out.update(
            id=self.id,
            name=to_ci(self.name),
            cols=[c.to_json() for c in self.columns],
            index_info=[i.to_json(self.name) for i in self.indices],
            pk_is_handle=self.pk_is_handle,
            is_common_handle=self.is_common_handle,
            update_timestamp=self.update_timestamp,
            state=self.state,
        )
        return out

    # ------------------------------------------------------------------ what rows need

    @property
    def has_rows(self) -> bool:
        return not (self.is_view or self.is_sequence)

    def physical_ids(self) -> tuple[int, ...]:
        """The ids whose key ranges hold this table's rows (partitions, or the table id)."""
        if not self.has_rows:
            return ()
        return self.partition_ids or (self.id,)

    def public_columns(self) -> list[TiDBColumn]:
        """Columns sinks see: public, not hidden, in offset order (virtual ones included)."""
        return sorted((c for c in self.columns if c.is_public and not c.hidden), key=lambda c: c.offset)

    def column_by_id(self) -> dict[int, TiDBColumn]:
        return {c.id: c for c in self.columns}

    def pk_handle_column(self) -> TiDBColumn | None:
        """The int primary-key column stored as the row key (PK-is-handle), if any."""
        if not self.pk_is_handle:
            return None
        return next((c for c in self.columns if c.type.flag & Flag.PRI_KEY), None)

    def primary_index(self) -> TiDBIndex | None:
        return next((i for i in self.indices if i.primary), None)

    def handle_key_names(self) -> tuple[str, ...]:
        """Columns that identify a row: PK-is-handle, PK, or first all-NOT-NULL unique key."""
        pk = self.pk_handle_column()
        if pk is not None:
            return (pk.name,)
        by_offset = {c.offset: c for c in self.columns}
        primary = self.primary_index()
        if primary is not None:
            return tuple(n for n, _ in primary.columns)
        for index in self.indices:
            if not index.unique or index.state != STATE_PUBLIC:
                continue
            cols = [by_offset.get(o) for _, o in index.columns]
            if all(c is not None and c.type.not_null for c in cols):
                return tuple(n for n, _ in index.columns)
        return ()

    def table_schema(self, db_name: str, physical_id: int | None = None, version: int = 0) -> TableSchema:
        """The core schema sinks use, for the physical table ``physical_id``."""
        handle_keys = set(self.handle_key_names())
        columns = tuple(_column_info(c, c.name in handle_keys) for c in self.public_columns() if not c.is_virtual)
        partition = physical_id if physical_id is not None and physical_id != self.id else None
        return TableSchema(TableName(db_name, self.name, self.id, partition), columns, version)


def _column_info(col: TiDBColumn, handle_key: bool) -> ColumnInfo:
    ft = col.type
    flags = 0
    checks: Sequence[tuple[bool, int]] = (
        (ft.is_binary, ColumnInfo.BINARY),
        (handle_key, ColumnInfo.HANDLE_KEY),
        (bool(col.generated_expr), ColumnInfo.GENERATED),
        (bool(ft.flag & Flag.PRI_KEY), ColumnInfo.PRIMARY_KEY),
        (bool(ft.flag & Flag.UNIQUE_KEY), ColumnInfo.UNIQUE_KEY),
        (bool(ft.flag & Flag.MULTIPLE_KEY), ColumnInfo.MULTIPLE_KEY),
        (not ft.not_null, ColumnInfo.NULLABLE),
        (ft.unsigned, ColumnInfo.UNSIGNED),
    )
    for present, bit in checks:
        if present:
            flags |= bit
    try:
        origin_default = col.origin_default_value()
    except (ValueError, ArithmeticError):  # decimal.InvalidOperation is an ArithmeticError
        origin_default = None  # unparsable text: unknown (mounting a row that needs it fails loudly)
    return ColumnInfo(col.name, ft.tp, flags, ft.sql_type(), not ft.not_null, origin_default)
