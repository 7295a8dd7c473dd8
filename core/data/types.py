"""MySQL column types: :class:`TypeCode` and the groups of codes codecs and sinks test against.

The type byte of :class:`~cdcflow.core.data.events.ColumnInfo` (``type_code``)
is one of these codes; its column flags are ``ColumnInfo``'s own bits. The
groups are module-level sets rather than class attributes of the enum: on
CPython 3.11 an attribute of an enum class costs several times a module
global, and codecs test them for every value they encode.
"""

from __future__ import annotations

import enum

__all__ = [
    "BLOB_TYPES",
    "CHAR_TYPES",
    "DATETIME_TYPES",
    "DATE_TYPES",
    "DECIMAL_TYPES",
    "FLOAT_TYPES",
    "INT_TYPES",
    "UINT_TYPES",
    "TypeCode",
]


class TypeCode(enum.IntEnum):
    """MySQL's column type numbers: the type byte of the MySQL protocol, TiDB's
    ``FieldType.Tp`` and the ``t`` of Open Protocol columns (§2.4).

    0xE1 is TiDB's own (a VECTOR of float32).
    """

    DECIMAL = 0
    TINY = 1
    SHORT = 2
    LONG = 3
    FLOAT = 4
    DOUBLE = 5
    NULL = 6
    TIMESTAMP = 7
    LONGLONG = 8
    INT24 = 9
    DATE = 10
    DURATION = 11
    DATETIME = 12
    YEAR = 13
    NEWDATE = 14
    VARCHAR = 15
    BIT = 16
    VECTOR_FLOAT32 = 0xE1
    JSON = 0xF5
    NEWDECIMAL = 0xF6
    ENUM = 0xF7
    SET = 0xF8
    TINY_BLOB = 0xF9
    MEDIUM_BLOB = 0xFA
    LONG_BLOB = 0xFB
    BLOB = 0xFC
    VAR_STRING = 0xFD
    STRING = 0xFE
    GEOMETRY = 0xFF


#: TINYINT, SMALLINT, MEDIUMINT, INT, BIGINT and YEAR (signed unless the column is UNSIGNED).
INT_TYPES = frozenset({TypeCode.TINY, TypeCode.SHORT, TypeCode.LONG, TypeCode.LONGLONG, TypeCode.INT24, TypeCode.YEAR})
#: Types whose values are unsigned integers: BIT, ENUM (an index) and SET (a bitmask).
UINT_TYPES = frozenset({TypeCode.BIT, TypeCode.ENUM, TypeCode.SET})
FLOAT_TYPES = frozenset({TypeCode.FLOAT, TypeCode.DOUBLE})
DECIMAL_TYPES = frozenset({TypeCode.DECIMAL, TypeCode.NEWDECIMAL})
DATE_TYPES = frozenset({TypeCode.DATE, TypeCode.NEWDATE})
DATETIME_TYPES = frozenset({TypeCode.TIMESTAMP, TypeCode.DATETIME})
#: CHAR and VARCHAR, and BINARY and VARBINARY (the same codes with the binary flag).
CHAR_TYPES = frozenset({TypeCode.VARCHAR, TypeCode.VAR_STRING, TypeCode.STRING})
#: The BLOB and TEXT types.
BLOB_TYPES = frozenset({TypeCode.TINY_BLOB, TypeCode.MEDIUM_BLOB, TypeCode.LONG_BLOB, TypeCode.BLOB})
