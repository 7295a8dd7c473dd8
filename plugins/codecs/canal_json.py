"""The ``canal-json`` codec: Canal's JSON format as TiCDC writes it.

One message per event, no key. Fields in TiCDC's order: ``id`` (0),
``database``, ``table``, ``pkNames``, ``isDdl``, ``type``
(INSERT/UPDATE/DELETE, CREATE/ALTER/ERASE/TRUNCATE/RENAME/CINDEX/DINDEX/QUERY
for DDL), ``es`` (commit time, ms), ``ts`` (encode time, ms), ``sql``,
``sqlType`` (Java SQL type codes), ``mysqlType`` (base type names, no
parameters), ``data`` and ``old`` (lists of one row; every value a string or
null; binary values as ISO-8859-1 text). ``old`` holds the whole old row for
updates and is null for inserts and deletes (the deleted row is in ``data``).

With ``enable-tidb-extension`` DML and DDL carry ``"_tidb": {"commitTs": …}``
(``"onlyHandleKey": true`` when a large row was cut to its handle key) and
resolved timestamps become ``TIDB_WATERMARK`` events with
``"_tidb": {"watermarkTs": …}``; without it there are no resolved events.
ENUM and SET values are written as member names when the column's
``sql_type`` lists them (``enum('a','b')``), else as their index / bit set.
"""

from __future__ import annotations

import decimal
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from cdcflow.core.data.codec import Codec, EncodedMessage
from cdcflow.core.data.events import ColumnInfo, DDLEvent, OpType, RowChange, tso_physical_ms
from cdcflow.core.data.types import BLOB_TYPES, CHAR_TYPES, INT_TYPES, UINT_TYPES, TypeCode
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.plugins.codecs.columns import column_of, columns_of, elements_of, format_date_value, fsp_of
from cdcflow.plugins.codecs.gojson import go_float_plain, go_json
from cdcflow.plugins.codecs.open_protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_RECORD_OVERHEAD,
    MessageTooLargeError,
    row_key_text,
)

__all__ = ["CanalJsonCodec", "CanalJsonConfig", "java_sql_type", "mysql_type_name"]

_OPS = {OpType.INSERT: "INSERT", OpType.UPDATE: "UPDATE", OpType.DELETE: "DELETE"}
#: Canal event type of a TiDB DDL action type (others are QUERY).
_DDL_TYPES = {3: "CREATE", 4: "ERASE", 11: "TRUNCATE", 14: "RENAME", 7: "CINDEX", 9: "CINDEX", 32: "CINDEX"}
_DDL_TYPES.update({8: "DINDEX", 10: "DINDEX", 33: "DINDEX"})
_DDL_TYPES.update(dict.fromkeys((5, 6, 12, 13, 15, 17, 18, 19, 20, 22, 23), "ALTER"))

_NAMES: dict[int, str] = {
    TypeCode.TINY: "tinyint", TypeCode.SHORT: "smallint", TypeCode.LONG: "int", TypeCode.INT24: "mediumint",
    TypeCode.LONGLONG: "bigint", TypeCode.FLOAT: "float", TypeCode.DOUBLE: "double", TypeCode.DECIMAL: "decimal",
    TypeCode.NEWDECIMAL: "decimal", TypeCode.TIMESTAMP: "timestamp", TypeCode.DATE: "date",
    TypeCode.NEWDATE: "date", TypeCode.DURATION: "time", TypeCode.DATETIME: "datetime", TypeCode.YEAR: "year",
    TypeCode.BIT: "bit", TypeCode.JSON: "json", TypeCode.ENUM: "enum", TypeCode.SET: "set",
    TypeCode.GEOMETRY: "geometry", TypeCode.VECTOR_FLOAT32: "vector", TypeCode.NULL: "null",
}  # fmt: skip
_INTEGER_NAMES = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"})
_BLOB_NAMES: dict[int, str] = {
    TypeCode.TINY_BLOB: "tiny",
    TypeCode.MEDIUM_BLOB: "medium",
    TypeCode.LONG_BLOB: "long",
    TypeCode.BLOB: "",
}
_JAVA: dict[int, int] = {
    TypeCode.TINY: -6, TypeCode.SHORT: 5, TypeCode.INT24: 4, TypeCode.LONG: 4, TypeCode.LONGLONG: -5,
    TypeCode.FLOAT: 7, TypeCode.DOUBLE: 8, TypeCode.DECIMAL: 3, TypeCode.NEWDECIMAL: 3, TypeCode.DATE: 91,
    TypeCode.NEWDATE: 91, TypeCode.DATETIME: 93, TypeCode.TIMESTAMP: 93, TypeCode.DURATION: 92, TypeCode.YEAR: 12,
    TypeCode.ENUM: 4, TypeCode.SET: -7, TypeCode.BIT: -7, TypeCode.JSON: 12, TypeCode.VARCHAR: 12,
    TypeCode.VAR_STRING: 12, TypeCode.STRING: 1, TypeCode.NULL: 12,
}  # fmt: skip
#: Unsigned integers that outgrow their signed Java type move one type up (TiCDC's table).
_UNSIGNED_UP: dict[int, tuple[int, int]] = {
    TypeCode.TINY: (127, 5),
    TypeCode.SHORT: (32767, 4),
    TypeCode.LONG: (2**31 - 1, -5),
    TypeCode.LONGLONG: (2**63 - 1, 3),
}

#: ENUM and SET: canal-json writes their int values as member names.
_NAMED_TYPES = frozenset({TypeCode.ENUM, TypeCode.SET})


def mysql_type_name(column: ColumnInfo) -> str:
    """The base MySQL type name of ``column`` (``int unsigned``, ``varbinary``, ``text`` …)."""
    if column.sql_type:
        text = column.sql_type.lower()
        base = text.split("(")[0].split(" ")[0].strip()
        return base + " unsigned" if "unsigned" in text and base in _INTEGER_NAMES else base
    code, binary = column.type_code, bool(column.flags & ColumnInfo.BINARY)
    if code in _BLOB_NAMES:
        return _BLOB_NAMES[code] + ("blob" if binary else "text")
    if code in (TypeCode.VARCHAR, TypeCode.VAR_STRING):
        return "varbinary" if binary else "varchar"
    if code == TypeCode.STRING:
        return "binary" if binary else "char"
    name = _NAMES.get(code, "unknown")
    if column.flags & ColumnInfo.UNSIGNED and code in INT_TYPES:
        name += " unsigned"
    return name


def java_sql_type(column: ColumnInfo, value: Any) -> int:
    """The JDBC type code of ``column`` (unsigned integers depend on the value)."""
    code, binary = column.type_code, bool(column.flags & ColumnInfo.BINARY)
    if code in BLOB_TYPES:
        return 2004 if binary else 2005
    if code in CHAR_TYPES and binary:
        return 2004
    if column.flags & ColumnInfo.UNSIGNED and code in _UNSIGNED_UP and isinstance(value, int):
        limit, wider = _UNSIGNED_UP[code]
        if value > limit:
            return wider
    return _JAVA.get(code, 12)


def canal_value(column: ColumnInfo, value: Any) -> str | None:
    """A row value as canal-json text."""
    code = column.type_code
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        if code in UINT_TYPES or code in INT_TYPES:
            return str(int.from_bytes(data, "big"))
        binary = column.flags & ColumnInfo.BINARY
        return data.decode("latin-1") if binary else data.decode("utf-8", errors="replace")
    if isinstance(value, bool):
        return "1" if value else "0"
    if code in _NAMED_TYPES and isinstance(value, int):
        return _member_names(column, value)
    if isinstance(value, float):
        return "0" if math.isnan(value) or math.isinf(value) else go_float_plain(value)
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if not isinstance(value, str) and code == TypeCode.JSON:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if isinstance(value, int | str):
        return str(value)
    return format_date_value(code, value, fsp_of(column))


def _member_names(column: ColumnInfo, value: int) -> str:
    """ENUM index / SET bitmask as member names (canal-json writes names), or the number when unknown."""
    members = elements_of(column)
    if not members:
        return str(value)
    if column.type_code == TypeCode.ENUM:
        return members[value - 1] if 1 <= value <= len(members) else ""
    return ",".join(m for i, m in enumerate(members) if value >> i & 1)


class CanalJsonConfig(PluginConfig):
    """Options of the canal-json codec (the Kafka sink passes its own values)."""

    enable_tidb_extension: bool = Field(False, description="Add the _tidb field and send WATERMARK events.")
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES, ge=1024, description="Largest message (value + overhead), in bytes."
    )
    large_message_handle_option: Literal["none", "handle-key-only"] = Field(
        "none", description="A row too large for one message fails (none) or is sent with its handle key only."
    )


class CanalJsonCodec(Codec[CanalJsonConfig]):
    """Canal-JSON as TiCDC writes it, one event per message (TiDB extension optional)."""

    type_name = "canal-json"
    Config = CanalJsonConfig
    file_extension = "json"

    #: Milliseconds now, for the ``ts`` field (replaceable in tests).
    clock: Callable[[], int] = staticmethod(lambda: int(time.time() * 1000))

    def _envelope(self, database: str, table: str, kind: str, commit_ts: int) -> dict[str, Any]:
        return {
            "id": 0,
            "database": database,
            "table": table,
            "pkNames": None,
            "isDdl": False,
            "type": kind,
            "es": tso_physical_ms(commit_ts),
            "ts": self.clock(),
            "sql": "",
            "sqlType": None,
            "mysqlType": None,
            "data": None,
            "old": None,
        }

    def row_document(self, row: RowChange, *, handle_key_only: bool = False) -> dict[str, Any]:
        """The JSON document of one row change."""
        doc = self._envelope(row.table.schema, row.table.table, _OPS[row.op], row.commit_ts)
        columns = columns_of(row)
        keep = [n for n, c in columns.items() if not handle_key_only or c.is_handle_key]
        pk = [n for n in keep if columns[n].flags & ColumnInfo.PRIMARY_KEY]
        doc["pkNames"] = pk or None
        image = row.image()
        doc["sqlType"] = {n: java_sql_type(columns[n], image.get(n)) for n in keep}
        doc["mysqlType"] = {n: mysql_type_name(columns[n]) for n in keep}
        doc["data"] = [self._values(row, row.image(), keep)]
        if row.op is OpType.UPDATE and row.before is not None:
            doc["old"] = [self._values(row, row.before, keep)]
        if self.config.enable_tidb_extension:
            doc["_tidb"] = {"commitTs": row.commit_ts, **({"onlyHandleKey": True} if handle_key_only else {})}
        return doc

    @staticmethod
    def _values(row: RowChange, image: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
        return {n: canal_value(column_of(row, n, image.get(n)), image.get(n)) for n in names if n in image}

    def encode_rows(self, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        out = []
        for row in rows:
            value = go_json(self.row_document(row))
            if len(value) + MAX_RECORD_OVERHEAD > self.config.max_message_bytes:
                value = self._shrunk(row, len(value))
            out.append(EncodedMessage(None, value, row.table, 1, row.commit_ts))
        return out

    def _shrunk(self, row: RowChange, size: int) -> bytes:
        limit = self.config.max_message_bytes
        if self.config.large_message_handle_option == "handle-key-only":
            value = go_json(self.row_document(row, handle_key_only=True))
            if len(value) + MAX_RECORD_OVERHEAD <= limit and any(c.is_handle_key for c in columns_of(row).values()):
                return value
        raise MessageTooLargeError(
            f"row of {row.table} ({row_key_text(row)}) at commit ts {row.commit_ts} encodes to {size} bytes, "
            f"over max-message-bytes={limit}",
            detail={"table": str(row.table), "row": row_key_text(row), "commit_ts": row.commit_ts, "bytes": size},
        )

    def encode_ddl(self, ddl: DDLEvent) -> EncodedMessage:
        schema = ddl.table.schema if ddl.table else ""
        table = ddl.table.table if ddl.table else ""
        doc = self._envelope(schema, table, _DDL_TYPES.get(ddl.action_type, "QUERY"), ddl.commit_ts)
        doc["isDdl"] = True
        doc["sql"] = ddl.query
        if self.config.enable_tidb_extension:
            doc["_tidb"] = {"commitTs": ddl.commit_ts}
        return EncodedMessage(None, go_json(doc), ddl.table, 0, ddl.commit_ts)

    def encode_resolved(self, ts: int) -> EncodedMessage | None:
        if not self.config.enable_tidb_extension:
            return None
        doc = self._envelope("", "", "TIDB_WATERMARK", ts)
        doc["_tidb"] = {"watermarkTs": ts}
        return EncodedMessage(None, go_json(doc), None, 0, ts)


@hookimpl
def cdcflow_register_codecs(registry: Registrar[Codec[Any]]) -> None:
    registry.add(CanalJsonCodec)
