"""The ``open-protocol`` codec: TiCDC Open Protocol, byte for byte.

Framing (docs/reference/open-protocol.md has the full description, and the
layout of open-protocol files written by the file sink)::

    key   = VERSION (8 bytes BE, = 1) + N × (LEN 8 bytes BE + key JSON)
    value =                             N × (LEN 8 bytes BE + value JSON)

Consecutive row changes are packed into one message until ``max-batch-size``
rows or until the next pair would push the message past
``max-message-bytes`` (counting TiCDC's per-record overhead); DDL and
resolved events are always alone in a message, and the value of a resolved
event is one zero length (8 zero bytes). JSON is written as Go's
``json.Marshal`` writes it (see :mod:`cdcflow.plugins.codecs.gojson`).

A single row whose message would exceed ``max-message-bytes`` raises
:class:`MessageTooLargeError` naming the table and the row's key, unless
``large-message-handle-option`` is ``handle-key-only``: then the row is sent
with its handle-key columns only and ``"ohk": true`` in its key.
"""

from __future__ import annotations

import base64
import decimal
import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring
from typing import Any, Literal, cast

from pydantic import Field

from cdcflow.core.data.codec import Codec, EncodedMessage, make_encoded_message
from cdcflow.core.data.events import (
    ColumnInfo,
    DDLEvent,
    InsertRun,
    OpType,
    RowChange,
    TableName,
    TableSchema,
    make_row_change,
)
from cdcflow.core.data.types import (
    BLOB_TYPES,
    CHAR_TYPES,
    DATE_TYPES,
    DATETIME_TYPES,
    DECIMAL_TYPES,
    FLOAT_TYPES,
    INT_TYPES,
    UINT_TYPES,
    TypeCode,
)
from cdcflow.core.errors import ConfigInvalidError, UnsupportedProtocolError
from cdcflow.core.native import native_module
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.plugins.codecs.columns import (
    column_for,
    columns_of,
    format_date_value,
    fsp_of,
    is_binary_string,
)
from cdcflow.plugins.codecs.gojson import GoFloat, GoFloat32, escape_html, go_float_value, go_json, go_quote

__all__ = [
    "BATCH_VERSION",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_RECORD_OVERHEAD",
    "MessageTooLargeError",
    "MessageType",
    "OpenProtocolCodec",
    "OpenProtocolConfig",
    "encode_column_value",
    "row_key_text",
]

#: The only framing version there is (``codec.BatchVersion1``).
BATCH_VERSION = 1
#: TiCDC's default ``max-message-bytes``: 10 MiB.
DEFAULT_MAX_MESSAGE_BYTES = 10 * 1024 * 1024
#: Kafka's worst-case per-record overhead, as TiCDC counts it
#: (5 × max varint32 + max varint64 + 1 attribute byte).
MAX_RECORD_OVERHEAD = 5 * 5 + 10 + 1


class MessageType:
    """The ``t`` field of a key."""

    ROW = 1
    DDL = 2
    RESOLVED = 3


class MessageTooLargeError(ConfigInvalidError):
    """One event does not fit in ``max-message-bytes``.

    Not retryable: raise ``max-message-bytes`` (and the topic's
    ``max.message.bytes``) or set ``large-message-handle-option=handle-key-only``.
    """


class OpenProtocolConfig(PluginConfig):
    """Options of the open-protocol codec (the Kafka sink passes its own values)."""

    max_batch_size: int = Field(16, ge=1, description="Most row changes packed into one message.")
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES, ge=1024, description="Largest message (key + value + overhead), in bytes."
    )
    output_old_value: bool = Field(
        True, description="Write the old image of updates as 'p' ([sink.open] output-old-value)."
    )
    large_message_handle_option: Literal["none", "handle-key-only"] = Field(
        "none", description="What to do with a row too large for one message: fail (none) or send its handle key only."
    )
    only_output_updated_columns: bool = Field(
        False, description="Leave columns an update did not change out of 'p' (handle-key columns stay)."
    )
    delete_only_output_handle_key_columns: bool = Field(
        False, description="Write only the handle-key columns of deleted rows in 'd'."
    )


#: An 8-byte big-endian length or version, as the batch framing writes it.
_u64: Callable[[int], bytes] = struct.Struct(">Q").pack


def encode_column_value(column: ColumnInfo, value: Any) -> Any:
    """The ``v`` of a column, per the Open Protocol's value table (§2.3)."""
    code = column.type_code
    if value is None:
        return None
    if code in INT_TYPES or code in UINT_TYPES:
        if isinstance(value, bytes | bytearray):
            return int.from_bytes(value, "big")  # BIT(n) as raw bytes
        if isinstance(value, bool | int):
            return int(value)
        return value  # ENUM/SET given by name: passed through, not an index
    if code in FLOAT_TYPES:
        number = float(value)
        if math.isnan(number) or math.isinf(number):
            return 0
        return GoFloat32(number) if code == TypeCode.FLOAT else GoFloat(number)
    if code in DECIMAL_TYPES:
        return format(value, "f") if isinstance(value, decimal.Decimal) else str(value)
    if code in DATE_TYPES or code in DATETIME_TYPES or code == TypeCode.DURATION:
        return format_date_value(code, value, fsp_of(column))
    return _encode_text_value(column, value)


def _encode_text_value(column: ColumnInfo, value: Any) -> Any:
    code = column.type_code
    if code == TypeCode.JSON:
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if code in BLOB_TYPES:
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return base64.b64encode(data).decode("ascii")
    if code in CHAR_TYPES:
        if isinstance(value, str):
            return value
        data = bytes(value)
        return go_quote(data) if is_binary_string(column) else data.decode("utf-8", errors="replace")
    if code == TypeCode.GEOMETRY:
        raise UnsupportedProtocolError(
            f"column {column.name!r}: GEOMETRY values are not supported by the Open Protocol"
        )
    return value if isinstance(value, str | int) else str(value)


def _column_head(column: ColumnInfo) -> str:
    """``"name":{"t":…,"h":true,"f":…,"v":`` (Go field order; ``h`` only for handle-key columns)."""
    head = '{"t":%d,"h":true,"f":%d,"v":' if column.flags & ColumnInfo.HANDLE_KEY else '{"t":%d,"f":%d,"v":'
    return encode_basestring(column.name) + ":" + head % (column.type_code, column.flags)


def _value_json(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return encode_basestring(value)
    if isinstance(value, float):
        return go_float_value(value)
    return str(int(value)) if isinstance(value, int) else encode_basestring(str(value))


#: Writes a non-null value of one column as JSON text.
ValueWriter = Callable[[Any], str]
#: A schema's columns by name, each with its encoded JSON head and value writer.
KnownColumns = Mapping[str, tuple[ColumnInfo, str, ValueWriter]]


def _value_writer(column: ColumnInfo) -> ValueWriter:
    """A writer specialised for the column's common Python type, the general path otherwise.

    Rows of a schema are encoded by the million: skipping the type dispatch of
    :func:`encode_column_value` for plain ints, text and decimals pays. The
    bytes are the same either way.
    """
    code = column.type_code

    def general(value: Any) -> str:
        return _value_json(encode_column_value(column, value))

    if code in INT_TYPES or code in UINT_TYPES:
        return lambda v: int.__repr__(v) if type(v) is int else general(v)
    if (code in CHAR_TYPES and not is_binary_string(column)) or code == TypeCode.JSON:
        return lambda v: encode_basestring(v) if type(v) is str else general(v)
    if code in DECIMAL_TYPES:
        return lambda v: '"' + format(v, "f") + '"' if type(v) is decimal.Decimal else general(v)
    if code in DATE_TYPES or code in DATETIME_TYPES or code == TypeCode.DURATION:
        fsp = fsp_of(column)  # read from the column's SQL type once, not per value
        return lambda v: encode_basestring(format_date_value(code, v, fsp))
    return general


def _known(column: ColumnInfo) -> tuple[ColumnInfo, str, ValueWriter]:
    return column, _column_head(column), _value_writer(column)


#: The C writer of full row images (see :func:`_native_columns`), None to write them in Python
#: (not built, or turned off with ``CDCFLOW_PURE_PYTHON=1``).
NATIVE: Any = native_module("cdcflow.plugins.codecs._opfast")

#: The slot descriptors ``_opfast.parts`` makes each part's fields with, in its order.
_PART_FIELDS = tuple(EncodedMessage.__dict__[name] for name in ("key", "value", "table", "row_count", "ts"))


def _native_kind(column: ColumnInfo) -> tuple[int, Any]:
    """How the C writer takes the column's values, and what it needs for that (see
    :mod:`._opfast`): the types the Python writer of the column takes a fast path for,
    and float64, temporal and decimal values; others through the writer."""
    code = column.type_code
    if code in INT_TYPES or code in UINT_TYPES:
        return NATIVE.K_INT, None
    if (code in CHAR_TYPES and not is_binary_string(column)) or code == TypeCode.JSON:
        return NATIVE.K_STR, None
    if code in DECIMAL_TYPES:
        return NATIVE.K_DECIMAL, decimal.Decimal
    if code in DATE_TYPES or code in DATETIME_TYPES or code == TypeCode.DURATION:
        fsp = fsp_of(column)
        return NATIVE.K_TEMPORAL, -1 if fsp is None else fsp
    if code == TypeCode.DOUBLE:
        return NATIVE.K_DOUBLE, None
    return NATIVE.K_CALL, None


#: A schema's columns for :func:`._opfast.image`: (name, head bytes, kind, its argument,
#: writer), sorted by name.
NativeColumns = tuple[tuple[str, bytes, int, Any, ValueWriter], ...]


def _native_columns(known: KnownColumns, ordered: OrderedColumns) -> NativeColumns:
    """``ordered`` as the C writer takes it: each head with the ``{`` or ``},`` before it,
    HTML-escaped and in UTF-8, as the Python path's text is before it is encoded."""
    return tuple(
        (name, escape_html(("{" if i == 0 else "},") + head).encode("utf-8"), *_native_kind(known[name][0]), writer)
        for i, (name, head, writer) in enumerate(ordered)
    )


#: A schema's columns sorted by name, each with its JSON head and value writer.
OrderedColumns = tuple[tuple[str, str, ValueWriter], ...]


def _full_image_json(image: Mapping[str, Any] | None, ordered: OrderedColumns) -> str | None:
    """:func:`_image_json` of an image holding exactly the schema's columns (the usual
    case), walking the columns already sorted; None for any other image."""
    if not image:
        return None
    return _image_writer(ordered)(image)


#: Writes an image holding exactly a schema's columns (None for any other image).
ImageWriter = Callable[[Mapping[str, Any]], "str | None"]

_IMAGE_WRITERS: dict[int, tuple[OrderedColumns, ImageWriter]] = {}


def _image_writer(ordered: OrderedColumns) -> ImageWriter:
    hit = _IMAGE_WRITERS.get(id(ordered))
    if hit is None or hit[0] is not ordered:
        if len(_IMAGE_WRITERS) > 4096:
            _IMAGE_WRITERS.clear()
        hit = _IMAGE_WRITERS[id(ordered)] = (ordered, _compile_image_writer(ordered))
    return hit[1]


def _compile_image_writer(ordered: OrderedColumns) -> ImageWriter:
    """One function per schema writing ``{"a":{…,"v":…},"b":…}`` in a single f-string.

    Column names, heads and writers are bound as the function's globals
    (``n0``, ``h0``, ``w0`` …), never spelled into its source, so no column
    name can change the code; the text is what the loop over ``ordered``
    writes: the heads in order, ``null`` or the writer's text, ``}`` after each.
    """
    count = len(ordered)
    if not count:
        return lambda image: None
    namespace: dict[str, Any] = {"KeyError": KeyError, "len": len, "tail": "}}"}
    values, reads, pieces = [], [], []
    for i, (name, head, writer) in enumerate(ordered):
        namespace[f"n{i}"] = name
        namespace[f"h{i}"] = ("{" if i == 0 else "},") + head
        namespace[f"w{i}"] = writer
        values.append(f"v{i}")
        reads.append(f"image[n{i}]")
        pieces.append(f"{{h{i}}}{{'null' if v{i} is None else w{i}(v{i})}}")
    source = (
        "def write(image):\n"
        f"    if len(image) != {count}:\n"
        "        return None\n"
        "    try:\n"
        f"        {', '.join(values)}, = {', '.join(reads)},\n"
        "    except KeyError:\n"
        "        return None\n"
        f'    return f"{"".join(pieces)}{{tail}}"\n'
    )
    exec(compile(source, "<open-protocol image writer>", "exec"), namespace)
    compiled: ImageWriter = namespace["write"]
    return compiled


def _image_json(
    image: Mapping[str, Any] | None,
    known: KnownColumns,
    handle_key_only: bool,
    unchanged_from: Mapping[str, Any] | None = None,
    ordered: OrderedColumns = (),
) -> str:
    """A row image as a Go map of columns, sorted by name.

    ``unchanged_from``: leave out columns whose value equals the one there
    (``only-output-updated-columns``), handle-key columns excepted.
    ``ordered``: the schema's columns sorted by name, for the usual case.
    """
    if ordered and not handle_key_only and unchanged_from is None:
        text = _full_image_json(image, ordered)
        if text is not None:
            return text
    parts = []
    for name in sorted(image or {}):
        value = image[name]  # type: ignore[index]
        column, head, writer = known.get(name) or _known(column_for(name, value))
        is_key = column.flags & ColumnInfo.HANDLE_KEY
        if handle_key_only and not is_key:
            continue
        if unchanged_from is not None and not is_key and name in unchanged_from and unchanged_from[name] == value:
            continue
        parts.append(head + ("null" if value is None else writer(value)) + "}")
    return "{" + ",".join(parts) + "}"


def row_key_text(row: RowChange) -> str:
    """The row's identity for error messages: handle-key values, else the raw key."""
    columns = columns_of(row)
    image = row.image()
    handle = {name: image.get(name) for name, col in columns.items() if col.is_handle_key}
    if handle:
        return ", ".join(f"{k}={v!r}" for k, v in sorted(handle.items()))
    return f"key 0x{row.key.hex()}" if row.key else "(no handle key known)"


def _native_row_value(row: RowChange, columns: NativeColumns, with_old: bool) -> bytes | None:
    """The row's value JSON (``u``, ``p`` with ``with_old``, ``d``) written by the C image
    writer from the schema's ``columns``; None when the writer does not take an image."""
    image: Callable[[Any, NativeColumns], bytes | None] = NATIVE.image
    if row.op is OpType.DELETE:
        before = image(row.before, columns)
        return None if before is None else b'{"d":' + before + b"}"
    after = image(row.after, columns)
    if after is None:
        return None
    if row.op is not OpType.UPDATE or row.before is None or not with_old:
        return b'{"u":' + after + b"}"
    before = image(row.before, columns)
    return None if before is None else b'{"u":' + after + b',"p":' + before + b"}"


class OpenProtocolCodec(Codec[OpenProtocolConfig]):
    """TiCDC Open Protocol: batched binary framing of JSON row, DDL and resolved events."""

    type_name = "open-protocol"
    Config = OpenProtocolConfig
    file_extension = "op"

    def __init__(self, config: OpenProtocolConfig) -> None:
        super().__init__(config)
        self._schemas: dict[int, tuple[tuple[ColumnInfo, ...], KnownColumns, OrderedColumns, NativeColumns]] = {}
        self._key_tails: dict[tuple[str, str, int | None], tuple[str, str]] = {}

    # -- single events -------------------------------------------------------------

    def row_pair(self, row: RowChange, *, handle_key_only: bool = False) -> tuple[bytes, bytes]:
        """Key JSON and value JSON of one row change.

        Written by hand rather than through :func:`go_json`: this is the per-row
        hot path, and the bytes are the same.
        """
        key = '{"ts":' + str(row.commit_ts) + self._key_tail(row.table, handle_key_only)
        known, ordered = self._schema_columns(row)
        config = self.config
        if NATIVE is not None and ordered and not handle_key_only:
            native = self._native_value(row)
            if native is not None:
                return key.encode("utf-8"), native
        if row.op is OpType.DELETE:
            keys_only = handle_key_only or config.delete_only_output_handle_key_columns
            value = '{"d":' + _image_json(row.before, known, keys_only, None, ordered) + "}"
        else:
            value = '{"u":' + _image_json(row.after, known, handle_key_only, None, ordered)
            if row.op is OpType.UPDATE and row.before is not None and config.output_old_value:
                unchanged_from = row.after if config.only_output_updated_columns else None
                value += ',"p":' + _image_json(row.before, known, handle_key_only, unchanged_from, ordered)
            value += "}"
        return key.encode("utf-8"), escape_html(value).encode("utf-8")

    def _native_value(self, row: RowChange) -> bytes | None:
        """The row's value JSON written by the C image writer; None when it does not take
        the row (an image that is not exactly the schema's columns, an option that leaves
        columns out), for :meth:`row_pair`'s Python path. The bytes are the same."""
        schema = row.schema
        assert schema is not None
        config = self.config
        if row.op is OpType.DELETE and config.delete_only_output_handle_key_columns:
            return None
        only_updated = config.only_output_updated_columns and config.output_old_value
        if only_updated and row.op is OpType.UPDATE and row.before is not None:
            return None
        return _native_row_value(row, self._schemas[id(schema.columns)][3], config.output_old_value)

    def _key_tail(self, table: TableName, handle_key_only: bool) -> str:
        """What follows ``"ts":…`` in a row's key, HTML-escaped; cached per table name
        (by value: rows decoded from records carry a name object each)."""
        name = (table.schema, table.table, table.partition_id)
        tails = self._key_tails.get(name)
        if tails is None:
            tail = ""
            if table.schema:
                tail += ',"scm":' + encode_basestring(table.schema)
            if table.table:
                tail += ',"tbl":' + encode_basestring(table.table)
            if table.partition_id is not None:
                tail += ',"ptn":' + str(table.partition_id)
            if len(self._key_tails) > 4096:
                self._key_tails.clear()
            tails = self._key_tails[name] = (escape_html(tail + ',"t":1}'), escape_html(tail + ',"t":1,"ohk":true}'))
        return tails[1] if handle_key_only else tails[0]

    def _schema_columns(self, row: RowChange) -> tuple[KnownColumns, OrderedColumns]:
        """The row's schema columns by name with their JSON heads, and the same sorted by
        name; cached per column tuple."""
        return self._columns_of(row.schema)

    def _columns_of(self, schema: TableSchema | None) -> tuple[KnownColumns, OrderedColumns]:
        """:meth:`_schema_columns` of a schema."""
        if schema is None:
            return {}, ()
        columns = schema.columns
        hit = self._schemas.get(id(columns))
        if hit is None or hit[0] is not columns:
            if len(self._schemas) > 4096:
                self._schemas.clear()
            known = {c.name: _known(c) for c in columns}
            ordered = tuple((name, head, writer) for name, (_, head, writer) in sorted(known.items()))
            native = _native_columns(known, ordered) if NATIVE is not None else ()
            hit = self._schemas[id(columns)] = (columns, known, ordered, native)
        return hit[1], hit[2]

    def _fitting_pair(self, row: RowChange) -> tuple[bytes, bytes]:
        key, value = self.row_pair(row)
        if self._fits_alone(key, value):
            return key, value
        if self.config.large_message_handle_option == "handle-key-only":
            if not any(c.is_handle_key for c in columns_of(row).values()):
                raise self._too_large(row, len(key) + len(value), "and it has no handle-key columns to send instead")
            key, value = self.row_pair(row, handle_key_only=True)
            if self._fits_alone(key, value):
                return key, value
            raise self._too_large(row, len(key) + len(value), "even with its handle-key columns only")
        raise self._too_large(row, len(key) + len(value), "; set large-message-handle-option=handle-key-only")

    def _fits_alone(self, key: bytes, value: bytes) -> bool:
        return len(key) + len(value) + MAX_RECORD_OVERHEAD + 16 + 8 <= self.config.max_message_bytes

    def _too_large(self, row: RowChange, size: int, hint: str) -> MessageTooLargeError:
        return MessageTooLargeError(
            f"row of {row.table} ({row_key_text(row)}) at commit ts {row.commit_ts} encodes to {size} bytes, "
            f"over max-message-bytes={self.config.max_message_bytes} {hint}".replace(" ;", ";"),
            detail={"table": str(row.table), "row": row_key_text(row), "commit_ts": row.commit_ts, "bytes": size},
        )

    # -- Codec ---------------------------------------------------------------------

    def encode_rows(self, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        """Rows packed into messages in order (TiCDC's batching rule)."""
        return self.assemble("", self.encode_row_parts("", rows))

    def encode_row_parts(self, topic: str, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        """Each row's key and value (without the batch's version header and lengths)."""
        config = self.config
        if NATIVE is None or config.delete_only_output_handle_key_columns or config.only_output_updated_columns:
            return [make_encoded_message(*self._fitting_pair(row), row.table, 1, row.commit_ts) for row in rows]
        return self._native_parts(rows)

    def _native_parts(self, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        """:meth:`encode_row_parts` with the C image writer (no option leaves columns out),
        in one loop: a row's table and schema are looked up again only when they differ from
        the last row's, and a row the loop does not take (an image the writer leaves to
        Python, a message over the size limit) goes through :meth:`_fitting_pair`, which
        writes the same bytes for the rest."""
        config = self.config
        with_old = config.output_old_value
        fits = config.max_message_bytes - MAX_RECORD_OVERHEAD - 16 - 8  # as _fits_alone
        out: list[EncodedMessage] = []
        append = out.append
        table: TableName | None = None
        tail = b""
        schema: Any = None
        columns: NativeColumns | None = None
        for row in rows:
            if row.schema is not schema:
                schema = row.schema
                ordered = self._schema_columns(row)[1]
                columns = self._schemas[id(schema.columns)][3] if ordered else None
            if row.table is not table:
                table = row.table
                tail = self._key_tail(table, False).encode("utf-8")
            value = _native_row_value(row, columns, with_old) if columns is not None else None
            if value is not None:
                key = b'{"ts":%d%b' % (row.commit_ts, tail)
                if len(key) + len(value) <= fits:
                    append(make_encoded_message(key, value, table, 1, row.commit_ts))
                    continue
            append(make_encoded_message(*self._fitting_pair(row), row.table, 1, row.commit_ts))
        return out

    def encode_insert_parts(self, topic: str, run: InsertRun) -> list[EncodedMessage]:
        """:meth:`encode_row_parts` of the run's rows, the key written once for the run
        (one table and ts) and the parts in one C call (``_opfast.parts``: each value by
        the C image writer straight from its image, each part made in C): no Python per
        row but for an image the writer leaves to Python or a message over the size limit
        (:meth:`_fitting_pair`, as :meth:`_native_parts` does)."""
        config = self.config
        ordered = self._columns_of(run.schema)[1]
        if NATIVE is None or config.delete_only_output_handle_key_columns or config.only_output_updated_columns:
            ordered = ()
        if not ordered:
            return super().encode_insert_parts(topic, run)
        columns = self._schemas[id(run.schema.columns)][3]
        table, ts = run.table, run.commit_ts
        key = b'{"ts":%d%b' % (ts, self._key_tail(table, False).encode("utf-8"))
        fits = config.max_message_bytes - MAX_RECORD_OVERHEAD - 16 - 8 - len(key)  # as _fits_alone
        out, holes = NATIVE.parts(run.afters, columns, key, fits, table, ts, EncodedMessage, _PART_FIELDS)
        for i in holes:  # written in Python: an image the C writer leaves, a message over the limit
            row = make_row_change(table, OpType.INSERT, ts, run.start_ts, run.afters[i], None, run.schema, run.keys[i])
            out[i] = make_encoded_message(*self._fitting_pair(row), table, 1, ts)
        return cast(list[EncodedMessage], out)

    def assemble(self, topic: str, parts: Sequence[EncodedMessage]) -> list[EncodedMessage]:
        """Row parts packed into messages in order: at most ``max-batch-size`` rows and
        ``max-message-bytes`` bytes per message (a part over the size alone gets a message
        of its own)."""
        out: list[EncodedMessage] = []
        max_rows, max_bytes = max(1, self.config.max_batch_size), self.config.max_message_bytes
        version = _u64(BATCH_VERSION)
        packed = NATIVE.pack(parts, max_rows, max_bytes, version, MAX_RECORD_OVERHEAD) if NATIVE is not None else None
        if packed is not None:  # the same messages, packed in C
            at = 0
            for key, value, count, ts in packed:
                out.append(EncodedMessage(key, value, parts[at].table, count, ts))
                at += count
            return out
        i, n = 0, len(parts)
        while i < n:
            first = parts[i]
            keys: list[bytes] = [version]
            values: list[bytes] = []
            put_key, put_value = keys.append, values.append
            size = 8 + MAX_RECORD_OVERHEAD  # key + value bytes of the message, plus the record overhead
            ts, count = first.ts, 0
            while i < n and count < max_rows:
                part = parts[i]
                key, value = part.key or b"", part.value
                grow = 16 + len(key) + len(value)
                if count and size + grow > max_bytes:
                    break
                put_key(_u64(len(key)))
                put_key(key)
                put_value(_u64(len(value)))
                put_value(value)
                size += grow
                count += 1
                i += 1
                ts = max(ts, part.ts)
            out.append(EncodedMessage(b"".join(keys), b"".join(values), first.table, count, ts))
        return out

    def encode_ddl(self, ddl: DDLEvent) -> EncodedMessage:
        key: dict[str, Any] = {"ts": ddl.commit_ts}
        if ddl.table is not None and ddl.table.schema:
            key["scm"] = ddl.table.schema
        if ddl.table is not None and ddl.table.table:
            key["tbl"] = ddl.table.table
        key["t"] = MessageType.DDL
        key_json = go_json(key)
        value_json = go_json({"q": ddl.query, "t": ddl.action_type})
        return EncodedMessage(
            _u64(BATCH_VERSION) + _u64(len(key_json)) + key_json,
            _u64(len(value_json)) + value_json,
            ddl.table,
            0,
            ddl.commit_ts,
        )

    def encode_resolved(self, ts: int) -> EncodedMessage:
        key_json = go_json({"ts": ts, "t": MessageType.RESOLVED})
        return EncodedMessage(_u64(BATCH_VERSION) + _u64(len(key_json)) + key_json, _u64(0), None, 0, ts)

    def file_bytes(self, messages: Sequence[EncodedMessage]) -> bytes:
        """Files hold records of ``LEN + key`` then ``LEN + value`` (8-byte big-endian lengths)."""
        out = bytearray()
        for message in messages:
            key = message.key or b""
            out += _u64(len(key)) + key + _u64(len(message.value)) + message.value
        return bytes(out)


@hookimpl
def cdcflow_register_codecs(registry: Registrar[Codec[Any]]) -> None:
    registry.add(OpenProtocolCodec)
