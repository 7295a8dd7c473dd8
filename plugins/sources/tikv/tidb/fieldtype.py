"""TiDB's FieldType: the MySQL type byte, flag bits, length, scale, charset.

Type bytes are core's :class:`~cdcflow.core.data.types.TypeCode`; flags are
wire facts of TiDB's ``parser/mysql/type.go``; the JSON keys (``Tp``,
``Flag``, ``Flen``, ``Decimal``, ``Charset``, ``Collate``, ``Elems``) are
those the status API serves.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.data.types import BLOB_TYPES, CHAR_TYPES, DATE_TYPES, DATETIME_TYPES, INT_TYPES, UINT_TYPES, TypeCode

__all__ = ["FieldType", "Flag"]


class Flag(enum.IntFlag):
    """MySQL column flag bits (FieldType.Flag)."""

    NOT_NULL = 1
    PRI_KEY = 2
    UNIQUE_KEY = 4
    MULTIPLE_KEY = 8
    BLOB = 16
    UNSIGNED = 32
    ZEROFILL = 64
    BINARY = 128
    ENUM = 256
    AUTO_INCREMENT = 512
    TIMESTAMP = 1024
    SET = 2048
    NO_DEFAULT_VALUE = 4096
    ON_UPDATE_NOW = 8192


#: Types whose row values are stored as their bytes (text in the column's charset).
STRING_TYPES = CHAR_TYPES | BLOB_TYPES
#: Types whose row values are TiDB's packed date-time integers.
TIME_TYPES = DATE_TYPES | DATETIME_TYPES
#: Every type a row value of which cdcflow decodes.
SUPPORTED_TYPES = (
    INT_TYPES
    | STRING_TYPES
    | TIME_TYPES
    | UINT_TYPES
    | {TypeCode.FLOAT, TypeCode.DOUBLE, TypeCode.NEWDECIMAL, TypeCode.DURATION, TypeCode.JSON}
)

_SQL_NAMES = {
    TypeCode.TINY: "tinyint",
    TypeCode.SHORT: "smallint",
    TypeCode.LONG: "int",
    TypeCode.LONGLONG: "bigint",
    TypeCode.INT24: "mediumint",
    TypeCode.YEAR: "year",
    TypeCode.FLOAT: "float",
    TypeCode.DOUBLE: "double",
    TypeCode.NEWDECIMAL: "decimal",
    TypeCode.DATE: "date",
    TypeCode.NEWDATE: "date",
    TypeCode.DATETIME: "datetime",
    TypeCode.TIMESTAMP: "timestamp",
    TypeCode.DURATION: "time",
    TypeCode.VARCHAR: "varchar",
    TypeCode.VAR_STRING: "varchar",
    TypeCode.STRING: "char",
    TypeCode.TINY_BLOB: "tinyblob",
    TypeCode.BLOB: "blob",
    TypeCode.MEDIUM_BLOB: "mediumblob",
    TypeCode.LONG_BLOB: "longblob",
    TypeCode.BIT: "bit",
    TypeCode.ENUM: "enum",
    TypeCode.SET: "set",
    TypeCode.JSON: "json",
}


@dataclass(frozen=True, slots=True)
class FieldType:
    """A column's type as TiDB describes it."""

    tp: int
    flag: int = 0
    flen: int = -1
    decimal: int = -1
    charset: str = "utf8mb4"
    collate: str = "utf8mb4_bin"
    elems: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FieldType:
        return cls(
            tp=int(data.get("Tp", 0)),
            flag=int(data.get("Flag", 0)),
            flen=int(data.get("Flen", -1)),
            decimal=int(data.get("Decimal", -1)),
            charset=str(data.get("Charset") or ""),
            collate=str(data.get("Collate") or ""),
            elems=tuple(data.get("Elems") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "Tp": self.tp,
            "Flag": self.flag,
            "Flen": self.flen,
            "Decimal": self.decimal,
            "Charset": self.charset,
            "Collate": self.collate,
            "Elems": list(self.elems) if self.elems else None,
            "ElemsIsBinaryLit": None,
            "Array": False,
        }

    @property
    def unsigned(self) -> bool:
        return bool(self.flag & Flag.UNSIGNED)

    @property
    def not_null(self) -> bool:
        return bool(self.flag & Flag.NOT_NULL)

    @property
    def is_binary(self) -> bool:
        """Whether string values are bytes rather than text (charset ``binary``)."""
        return self.charset == "binary" or (self.tp in STRING_TYPES and self.collate == "binary")

    def sql_type(self) -> str:
        """Type text such as ``varchar(64)`` or ``decimal(10,2) unsigned``, for DDL-aware sinks."""
        name = _SQL_NAMES.get(TypeCode(self.tp), f"type{self.tp}") if self.tp in TypeCode._value2member_map_ else ""
        if self.tp in (TypeCode.ENUM, TypeCode.SET):
            name += "(" + ",".join("'" + e.replace("'", "''") + "'" for e in self.elems) + ")"
        elif self.tp == TypeCode.NEWDECIMAL and self.flen > 0:
            name += f"({self.flen},{max(self.decimal, 0)})"
        elif self.tp in (TypeCode.VARCHAR, TypeCode.VAR_STRING, TypeCode.STRING, TypeCode.BIT) and self.flen > 0:
            name += f"({self.flen})"
        elif self.tp in (TypeCode.DATETIME, TypeCode.TIMESTAMP, TypeCode.DURATION) and self.decimal > 0:
            name += f"({self.decimal})"
        if self.is_binary and self.tp in (TypeCode.VARCHAR, TypeCode.VAR_STRING, TypeCode.STRING):
            name = name.replace("varchar", "varbinary").replace("char", "binary")
        if self.unsigned:
            name += " unsigned"
        return name or f"type{self.tp}"
