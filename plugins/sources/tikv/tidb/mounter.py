"""TiDBMounter: TiKV key-value changes → row changes and DDL events.

For a write under a record key ``t{id}_r{handle}`` committed at ``commit_ts``:

* the schema is the :class:`.schema_store.SchemaStore` version valid at
  ``commit_ts − 1``; an id without a schema then (unknown, dropped, a view)
  or a table the ``replicate`` predicate refuses yields None;
* PUT without old value → INSERT; PUT with old value → UPDATE; DELETE (or an
  empty value) → DELETE whose before image is the old value, or — without
  old value — just the handle columns rebuilt from the key;
* each image holds the public, non-virtual columns: the value's column if
  present, the handle column(s) rebuilt from the key (PK-is-handle; common
  handle columns not stored in the value), else the column's origin default.

Writes to TiDB's DDL job tables (:mod:`.ddl_job`) become :class:`DDLEvent`\\ s
stamped with the write's commit ts (the exact DDL barrier) and are applied to
the schema store, so rows after them decode with the new schema. Index keys,
meta keys and other non-row keys yield None.

A value that cannot be decoded raises :class:`RowDecodeError` (or
:class:`UnsupportedColumnTypeError`) naming table, key (hex) and commit ts —
never a crash of the caller's loop, never a silently dropped row.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from cdcflow.core.data.events import (
    DDLEvent,
    InsertRun,
    OpType,
    RawKVEvent,
    RowChange,
    Span,
    TableName,
    TableSchema,
    make_row_change,
)
from cdcflow.core.data.source import BatchMounter, Mounter
from cdcflow.core.errors import CdcflowError, ErrorCode, Retryable, Severity
from cdcflow.core.native import native_module
from cdcflow.plugins.sources.tikv.tidb import ddl_job, keydatum, keys, rowcodec, values
from cdcflow.plugins.sources.tikv.tidb.keydatum import Datum
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBColumn, TiDBTable
from cdcflow.plugins.sources.tikv.tidb.schema_store import DROP_ACTIONS, SchemaStore, TableVersion

__all__ = ["RowDecodeError", "TiDBBatchMounter", "TiDBMounter", "UnsupportedColumnTypeError"]

_DECODE_ERRORS = (ValueError, json.JSONDecodeError, keys.KeyFormatError)
_MISSING = object()

#: Anything the batch path cannot take (a malformed value, a type error in a decoder, …):
#: the event is then mounted again by :meth:`TiDBMounter.mount_row`, which raises the coded error.
_FAST_PATH_ERRORS = (ValueError, LookupError, TypeError, ArithmeticError, struct.error)
#: An int-handle record key: ``t`` + comparable table id + ``_r`` + comparable handle.
_INT_RECORD_KEY = struct.Struct(">Q2sQ")
_SIGN = 1 << 63
_U64 = (1 << 64) - 1
_COUNTS = struct.Struct("<HH")
#: Column-id headers remembered per plan (distinct NULL/absent patterns; bounded).
_MAX_LAYOUTS = 512


#: The C decoder of layouts (see :func:`_layout`), None to decode them in Python (not built,
#: or turned off with ``CDCFLOW_PURE_PYTHON=1``).
NATIVE: Any = native_module("cdcflow.plugins.sources.tikv.tidb._rowfast")


class RowDecodeError(CdcflowError):
    """A TiKV value (row or DDL job) that cannot be decoded with the table's schema.

    The changefeed should go to Warning: the value is in a format cdcflow
    cannot read, and retrying the same bytes will not help until the schema
    or the build changes.
    """

    code = ErrorCode.ErrUnsupportedProtocol
    default_severity = Severity.WARN
    default_retryable = Retryable.LATER


class UnsupportedColumnTypeError(RowDecodeError):
    """A column of a type cdcflow does not decode (GEOMETRY, VECTOR, …)."""


#: Decodes the image of one v2 value whose header is the layout's: ``(value, handle) -> image``.
#: Raises ValueError (or struct.error) when the value's offsets or data do not fit.
_Layout = Callable[[bytes, int], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class _Column:
    """One column of a plan: its id, name and a value decoder bound to its type."""

    id: int
    name: str
    decode: Callable[[bytes], Any]
    column: TiDBColumn


@dataclass(frozen=True, slots=True)
class _Plan:
    """What decoding rows of one physical table at one schema version needs, computed once."""

    table: TiDBTable
    schema: TableSchema
    replicated: bool
    #: The public, non-virtual columns in offset order.
    columns: tuple[_Column, ...]
    #: The PK-is-handle column (its value is the int handle of the key), if any.
    pk_handle: TiDBColumn | None
    pk_unsigned: bool
    #: Batch decoding: the decoder of each column-id header seen (``value[2:ids_end]``), see :func:`_layout`.
    layouts: dict[bytes, _Layout | None] = field(default_factory=dict)


def _strictly_ascending(ids: bytes) -> bool:
    return all(map(int.__lt__, ids, ids[1:]))


def _layout(plan: _Plan, header: bytes, n_not_null: int) -> _Layout | None:
    """The decoder of values with ``header`` (counts + one-byte ids of a small v2 value),
    None when the header is malformed.

    Rows of one table at one schema version mostly share their header (the
    same columns stored, NULL and absent), so this is compiled once per
    header: one function that unpacks the end offsets, checks them (non-
    decreasing, the data ending where the value does, or a checksum after
    it) and returns the image as one dict display in the plan's column
    order — each stored column's decoder on its slice, None for NULLs, the
    origin default for absent columns, the key's handle for the PK-is-handle
    column. Names, decoders and defaults are the function's globals, never
    part of its source.
    """
    not_null, nulls = header[4 : 4 + n_not_null], header[4 + n_not_null :]
    if not (_strictly_ascending(not_null) and _strictly_ascending(nulls)) or set(not_null) & set(nulls):
        return None
    position = {cid: i for i, cid in enumerate(not_null)}
    null_ids = set(nulls)
    ends_at = 2 + len(header)
    if NATIVE is not None:
        return _native_layout(NATIVE, plan, ends_at, n_not_null, position, null_ids)
    base = ends_at + 2 * n_not_null  # where the data starts
    ends = [f"e{i}" for i in range(n_not_null)]
    namespace: dict[str, Any] = {
        "ValueError": ValueError,
        "len": len,
        "check_tail": rowcodec.check_tail,
        "unpack": struct.Struct(f"<{n_not_null}H").unpack_from,
    }
    items = []
    pk = plan.pk_handle
    for j, col in enumerate(plan.columns):
        namespace[f"n{j}"] = col.name
        if pk is not None and col.name == pk.name:
            # The key's handle, also when the value holds the column (TiDB does not
            # write it there; a value that does is not what TiDB reads back).
            items.append(f"n{j}: handle")
        elif col.id in position:
            i = position[col.id]
            namespace[f"d{j}"] = col.decode
            start = f"{base} + e{i - 1}" if i else f"{base}"
            items.append(f"n{j}: d{j}(value[{start} : {base} + e{i}])")
        elif col.id in null_ids:
            items.append(f"n{j}: None")
        else:
            namespace[f"k{j}"] = col.column.origin_default_value()
            items.append(f"n{j}: k{j}")
    end = f"{base} + {ends[-1]}" if ends else f"{base}"
    lines = ["def decode(value, handle):"]
    if ends:
        lines.append(f"    {', '.join(ends)}, = unpack(value, {ends_at})")
    if len(ends) > 1:
        lines.append(f"    if not {' <= '.join(ends)}:")
        lines.append('        raise ValueError("v2 row offsets out of order")')
    lines += [
        "    if value[1]:",
        f"        if {end} > len(value):",
        '            raise ValueError("v2 row offsets past the data")',
        f"        check_tail(value[1], value[{end}:])",
        f"    elif {end} != len(value):",
        '        raise ValueError("v2 row data length does not match its offsets")',
        "    return {" + ", ".join(items) + "}",
    ]
    exec(compile("\n".join(lines) + "\n", "<v2 row layout>", "exec"), namespace)
    decode: _Layout = namespace["decode"]
    return decode


def _native_layout(
    native: Any, plan: _Plan, ends_at: int, stored: int, position: dict[int, int], null_ids: set[int]
) -> _Layout:
    """:func:`_layout`'s decoder in C: the same image, each column from the same place.

    The C decoder takes the common types itself (integers, strings, DOUBLE,
    DECIMAL, JSON, dates and times) and calls the column's Python decoder for
    the others. Whatever it does not decode as Python would (a zero date, a
    JSON document with opaque values, …) raises ValueError, and the row is
    mounted by :meth:`TiDBMounter.mount_row` instead, as any row the fast path
    refuses.
    """
    items: list[tuple[str, int, int, Any]] = []
    pk = plan.pk_handle
    for col in plan.columns:
        if pk is not None and col.name == pk.name:
            items.append((col.name, native.HANDLE, 0, None))
        elif col.id in position:
            kind, arg = values.native_kind(col.column.type)
            items.append((col.name, getattr(native, kind), position[col.id], col.decode if kind == "CALL" else arg))
        elif col.id in null_ids:
            items.append((col.name, native.CONST, 0, None))
        else:
            items.append((col.name, native.CONST, 0, col.column.origin_default_value()))
    decode: _Layout = native.Layout(ends_at, stored, rowcodec.check_tail, tuple(items)).decode
    return decode


def _new_layout(plan: _Plan, header: bytes, n_not_null: int) -> _Layout | None:
    """:func:`_layout` of a header not in ``plan.layouts``, kept there (which holds at most
    ``_MAX_LAYOUTS``: a table whose rows have many NULL patterns starts it again)."""
    layouts = plan.layouts
    if len(layouts) >= _MAX_LAYOUTS:
        layouts.clear()
    layout = layouts[header] = _layout(plan, header, n_not_null)
    return layout


def _images(
    keys_: Sequence[bytes],
    values_: Sequence[bytes],
    prefix: bytes,
    unsigned: bool,
    layouts: dict[bytes, _Layout | None],
    make: Callable[[bytes, int], _Layout | None],
    errors: tuple[type[BaseException], ...],
) -> list[dict[str, Any]] | None:
    """The images of a run of puts of one table's int-handle record keys (``prefix``: b"t",
    the table id, b"_r"), each value a small v2 row decoded by its header's layout
    (``make`` compiles one missing from ``layouts``); None as soon as one pair is anything
    else, or a layout raises one of ``errors``. Where the C decoder is built,
    ``_rowfast.images`` does the same with no Python per pair (the fuzz tests compare them)."""
    if len(keys_) != len(values_):
        return None
    length = len(prefix) + 8
    out: list[dict[str, Any]] = []
    append = out.append
    try:
        for key, value in zip(keys_, values_, strict=True):
            if len(key) != length or not key.startswith(prefix) or len(value) < 6:
                return None
            if value[0] != rowcodec.CODEC_VERSION or value[1] & ~rowcodec.FLAG_CHECKSUM:
                return None
            n_not_null, n_null = _COUNTS.unpack_from(value, 2)
            header = value[2 : 6 + n_not_null + n_null]
            layout = layouts.get(header, _MISSING)
            if layout is _MISSING:
                layout = make(header, n_not_null)
            if layout is None:
                return None
            raw = int.from_bytes(key[-8:], "big") ^ _SIGN  # the key's sign-flipped int64
            append(cast(_Layout, layout)(value, raw if unsigned or not raw & _SIGN else raw - (1 << 64)))
    except errors:
        return None
    return out


def _int_record_key(key: bytes) -> tuple[int, int] | None:
    """The table id and the raw (sign-flipped) handle of an int-handle record key, None for any other key."""
    if len(key) != keys.RECORD_ROW_KEY_LEN or key[0] != 0x74:  # b"t"
        return None
    raw_id, sep, raw_handle = _INT_RECORD_KEY.unpack_from(key, 1)
    if sep != b"_r":
        return None
    return (raw_id ^ _SIGN) - (1 << 64) if not raw_id & _SIGN else raw_id ^ _SIGN, raw_handle


class TiDBMounter(Mounter):
    """Decodes TiDB rows with the schema store's schema at ``commit_ts − 1``."""

    def __init__(self, schemas: SchemaStore, *, replicate: Callable[[TableName], bool] | None = None) -> None:
        self.schemas = schemas
        self._replicate = replicate
        self._plans: dict[tuple[int, int], tuple[TableVersion, _Plan]] = {}

    def _plan(self, version: TableVersion, physical_id: int) -> _Plan:
        key = (id(version), physical_id)
        cached = self._plans.get(key)
        if cached is not None and cached[0] is version:
            return cached[1]
        table = version.table
        assert table is not None
        schema = table.table_schema(version.db_name, physical_id, version.schema_version)
        replicated = self._replicate is None or self._replicate(schema.table)
        columns = tuple(
            _Column(c.id, c.name, values.value_decoder(c.type), c) for c in table.public_columns() if not c.is_virtual
        )
        pk = table.pk_handle_column()
        plan = _Plan(table, schema, replicated, columns, pk, pk is not None and pk.type.unsigned)
        if len(self._plans) > 4096:
            self._plans.clear()  # versions come and go with DDL; keep the cache bounded
        self._plans[key] = (version, plan)
        return plan

    async def mount(self, event: RawKVEvent) -> RowChange | None:
        """The row change of ``event``; DDL job writes are applied to the store and yield None here."""
        result = await self.mount_event(event)
        return result if isinstance(result, RowChange) else None

    async def mount_event(self, event: RawKVEvent) -> RowChange | DDLEvent | None:
        """A row change, a DDL event (job-table writes), or None for anything else."""
        if ddl_job.is_ddl_key(event.key):
            return self._mount_ddl(event)
        return self.mount_row(event)

    async def for_batch(self, start_ts: int, end_ts: int) -> TiDBBatchMounter:
        """A picklable mounter of the rows committed in ``(start_ts, end_ts]``, holding
        the schema versions valid in that range (the store must know them already:
        the caller waits until every DDL below ``end_ts`` is applied)."""
        return TiDBBatchMounter(self.schemas.snapshot(start_ts, end_ts))

    def mount_many(self, events: Sequence[RawKVEvent]) -> list[RowChange | None]:
        """:meth:`mount_row` of each event, in order, decoding rows of one table and
        schema version with layouts compiled once (see :func:`_layout`).

        The rows are the same as :meth:`mount_row` gives; an event this path does
        not take (common handles, v1 or large values, deletes without old value)
        or cannot decode goes through :meth:`mount_row`, which raises the same
        coded error it always did.
        """
        out: list[RowChange | None] = []
        append = out.append
        # The schema store takes no DDL during the call: each table's plan is looked up again
        # only when a row's ts leaves the range the last lookup holds for.
        found: dict[int, tuple[int, int, _Plan | None]] = {}
        for event in events:
            try:
                row = self._mount_fast(event, found)
            except _FAST_PATH_ERRORS:
                row = _MISSING
            append(self.mount_row(event) if row is _MISSING else cast(RowChange | None, row))
        return out

    def _mount_fast(self, event: RawKVEvent, found: dict[int, tuple[int, int, _Plan | None]]) -> object:
        """The row of ``event`` (None when not replicated), or ``_MISSING`` to leave it to :meth:`mount_row`;
        ``found``: by table id, the ts range ``[low, high)`` an earlier row of the run looked its
        table up for, and the plan of the version valid there (None: no rows to give)."""
        key = event.key
        ids = _int_record_key(key)
        if ids is None:
            return _MISSING
        table_id, raw_handle = ids
        ts = event.commit_ts - 1  # the version that decodes a row is the one before its commit
        hit = found.get(table_id)
        if hit is None or not hit[0] <= ts < hit[1]:
            hit = found[table_id] = self._plan_between(table_id, ts)
        plan = hit[2]
        if plan is None:
            return None
        handle = (raw_handle ^ _SIGN) - (1 << 64) if not raw_handle & _SIGN else raw_handle ^ _SIGN
        if plan.pk_unsigned:
            handle &= _U64
        old = event.old_value
        before = self._fast_image(plan, old, handle) if old else None
        if event.delete or not event.value:
            if before is None:
                return _MISSING  # the before image is rebuilt from the key alone
            op, after = OpType.DELETE, None
        else:
            after = self._fast_image(plan, event.value, handle)
            op = OpType.UPDATE if before is not None else OpType.INSERT
        schema = plan.schema
        return make_row_change(schema.table, op, event.commit_ts, event.start_ts, after, before, schema, key)

    def mount_inserts(
        self, keys_: Sequence[bytes], values_: Sequence[bytes], commit_ts: int, start_ts: int
    ) -> InsertRun | None:
        """:meth:`BatchMounter.mount_inserts`: puts of int-handle record keys of one
        replicated table, every value a small v2 row, decoded with one plan and the C
        layouts, the whole run in one C call where it is built (``_rowfast.images``,
        else :func:`_images`); None as soon as one pair is anything else (the caller's
        :meth:`mount_many` then mounts them all, or raises the row's coded error)."""
        if not keys_:
            return None
        first = keys_[0]
        ids = _int_record_key(first)
        if ids is None:
            return None
        plan = self._plan_between(ids[0], commit_ts - 1)[2]
        if plan is None:
            return None
        prefix = first[:11]  # b"t", the table id, b"_r"
        images = NATIVE.images if NATIVE is not None else _images
        made = images(
            keys_,
            values_,
            prefix,
            plan.pk_unsigned,
            plan.layouts,
            functools.partial(_new_layout, plan),
            _FAST_PATH_ERRORS,
        )
        if made is None:
            return None
        schema = plan.schema
        return InsertRun(schema.table, schema, commit_ts, start_ts, keys_, made)

    def _plan_between(self, table_id: int, ts: int) -> tuple[int, int, _Plan | None]:
        """The ts range around ``ts`` with one version of the table (:meth:`SchemaStore.table_between`)
        and that version's plan, None when its rows are not given (no such table, a table
        without rows, one not replicated)."""
        version, low, high = self.schemas.table_between(table_id, ts)
        if version is None or version.table is None or not version.table.has_rows:
            return low, high, None
        plan = self._plan(version, table_id)
        return low, high, plan if plan.replicated else None

    @staticmethod
    def _fast_image(plan: _Plan, value: bytes, handle: int) -> dict[str, Any]:
        """The image of a small v2 value (raises a ``_FAST_PATH_ERRORS`` error for anything else)."""
        if value[0] != rowcodec.CODEC_VERSION or value[1] & ~rowcodec.FLAG_CHECKSUM:
            raise ValueError("not a small v2 row value")
        n_not_null, n_null = _COUNTS.unpack_from(value, 2)
        header = value[2 : 6 + n_not_null + n_null]
        layout = plan.layouts.get(header, _MISSING)
        if layout is _MISSING:
            layout = _new_layout(plan, header, n_not_null)
        if layout is None:
            raise ValueError("malformed v2 row header")
        return cast(_Layout, layout)(value, handle)

    def mount_row(self, event: RawKVEvent) -> RowChange | None:
        """The row change of a record key's event (None for other keys and unknown tables)."""
        if not keys.is_record_key(event.key):
            return None
        try:
            record = keys.decode_record_key(event.key)
        except keys.KeyFormatError as e:
            raise self._error(RowDecodeError, "malformed record key", event, None, e) from e
        version = self.schemas.table_for_row(record.table_id, event.commit_ts)
        if version is None or version.table is None or not version.table.has_rows:
            return None
        plan = self._plan(version, record.table_id)
        if not plan.replicated:
            return None
        schema = plan.schema
        before = self._image(event, version, plan, record, event.old_value) if event.old_value else None
        if event.delete or not event.value:
            op, after = OpType.DELETE, None
            if before is None:
                before = self._handle_image(event, version, record)
        else:
            after = self._image(event, version, plan, record, event.value)
            op = OpType.UPDATE if before is not None else OpType.INSERT
        return make_row_change(schema.table, op, event.commit_ts, event.start_ts, after, before, schema, event.key)

    # ------------------------------------------------------------------ rows

    def _image(
        self, event: RawKVEvent, version: TableVersion, plan: _Plan, record: keys.RecordKey, value: bytes
    ) -> dict[str, Any]:
        try:
            row = rowcodec.decode_row(value)
        except rowcodec.RowFormatError as e:
            raise self._error(RowDecodeError, "malformed row value", event, version, e) from e
        from_key: dict[str, Any] | None = None  # only built when a column is not in the value
        image: dict[str, Any] = {}
        # The PK-is-handle column is the key's handle, whatever the value holds for it
        # (TiDB does not write it there; TiDB and TiCDC read it from the key).
        pk_name = plan.pk_handle.name if plan.pk_handle is not None and isinstance(record.handle, int) else None
        col = None
        try:
            for col in plan.columns:
                raw = _MISSING if col.name == pk_name else row.get(col.id, _MISSING)
                if raw is None:
                    image[col.name] = None
                elif raw is _MISSING:
                    if from_key is None:
                        from_key = self._handle_values(event, version, plan, record)
                    name = col.name
                    image[name] = from_key[name] if name in from_key else col.column.origin_default_value()
                elif isinstance(raw, Datum):
                    image[col.name] = rowcodec.value_from_datum(col.column.type, raw)
                else:
                    image[col.name] = col.decode(cast(bytes, raw))  # neither None, absent nor a Datum
        except values.UnsupportedColumnType as e:
            assert col is not None
            raise self._error(UnsupportedColumnTypeError, f"column {col.name!r}", event, version, e) from e
        except _DECODE_ERRORS as e:
            assert col is not None
            raise self._error(RowDecodeError, f"column {col.name!r}", event, version, e) from e
        return image

    def _handle_image(self, event: RawKVEvent, version: TableVersion, record: keys.RecordKey) -> dict[str, Any]:
        return dict(self._handle_values(event, version, self._plan(version, record.table_id), record))

    def _handle_values(
        self, event: RawKVEvent, version: TableVersion, plan: _Plan, record: keys.RecordKey
    ) -> dict[str, Any]:
        """Column values the key carries: the PK-is-handle column, or common-handle columns."""
        if isinstance(record.handle, int):
            pk = plan.pk_handle
            if pk is None:
                return {}
            handle = record.handle & 0xFFFFFFFFFFFFFFFF if plan.pk_unsigned else record.handle
            return {pk.name: handle}
        return self._common_handle_values(event, version, plan.table, record.handle)

    def _common_handle_values(
        self, event: RawKVEvent, version: TableVersion, table: TiDBTable, handle: bytes
    ) -> dict[str, Any]:
        primary = table.primary_index()
        if not table.is_common_handle or primary is None:
            return {}
        by_offset = {c.offset: c for c in table.columns}
        try:
            datums = keydatum.decode_datums(handle)
            if len(datums) != len(primary.columns):
                raise ValueError(f"common handle has {len(datums)} values, primary key {len(primary.columns)}")
            out: dict[str, Any] = {}
            for (name, offset), datum in zip(primary.columns, datums, strict=True):
                col = by_offset.get(offset)
                if col is not None:
                    out[name] = rowcodec.value_from_datum(col.type, datum)
            return out
        except _DECODE_ERRORS as e:
            raise self._error(RowDecodeError, "malformed common handle", event, version, e) from e

    # ------------------------------------------------------------------ DDL

    def _mount_ddl(self, event: RawKVEvent) -> DDLEvent | None:
        if event.delete or not event.value:
            return None  # the job leaving the queue; the DDL was taken when it was done
        try:
            job = ddl_job.decode_job_write(event.key, event.value, start_ts=event.start_ts, commit_ts=event.commit_ts)
        except _DECODE_ERRORS as e:
            raise self._error(RowDecodeError, "malformed DDL job", event, None, e) from e
        if job is None or not self.schemas.apply_job(job, event.commit_ts):
            return None
        table_info = job.table_info or (job.multiple_table_infos[-1] if job.multiple_table_infos else None)
        db_name = self.schemas.database_name(job.schema_id) or job.schema_name
        table_name = TableName(db_name, table_info.name if table_info else job.table_name, job.table_id)
        schema_after = None
        if table_info is not None and job.type not in DROP_ACTIONS:
            schema_after = table_info.table_schema(db_name, version=job.schema_version)
        no_table = job.table_id == 0 and table_info is None
        renamed_from = self._name_before(table_name, event.commit_ts) if schema_after is not None else None
        return DDLEvent(
            event.commit_ts, job.query, None if no_table else table_name, job.type, schema_after, renamed_from
        )

    def _name_before(self, table: TableName, commit_ts: int) -> TableName | None:
        """The name ``table`` had just before a DDL at ``commit_ts``, when the DDL renamed it."""
        before = self.schemas.logical_at(table.table_id, commit_ts - 1)
        if before is None or before.table is None:
            return None
        old = TableName(before.db_name, before.table.name, table.table_id)
        return old if (old.schema, old.table) != (table.schema, table.table) else None

    # ------------------------------------------------------------------ errors

    @staticmethod
    def _error(
        kind: type[RowDecodeError], what: str, event: RawKVEvent, version: TableVersion | None, cause: Exception
    ) -> RowDecodeError:
        table = "?"
        if version is not None and version.table is not None:
            table = f"{version.db_name}.{version.table.name}"
        elif keys.is_record_key(event.key) or keys.is_index_key(event.key):
            table = f"table id {keys.decode_table_id(event.key)}"
        message = (
            f"cannot decode {what} of {table} at key {event.key.hex()} commit ts {event.commit_ts}: {cause}; "
            "the row is not replicated until this is resolved (check the table schema, or report the value)"
        )
        detail = {
            "table": table,
            "key": event.key.hex(),
            "commit_ts": event.commit_ts,
            "start_ts": event.start_ts,
            "cause": str(cause),
        }
        return kind(message, detail=detail)


class TiDBBatchMounter(BatchMounter):
    """Decodes the TiDB rows of one micro-batch, in a Spark task.

    It holds a :meth:`SchemaStore.snapshot` of the versions valid in the
    batch's ts range and nothing else, so it pickles and decodes anywhere;
    DDL job keys are not rows and give None (the source follows DDL itself).
    """

    def __init__(self, schemas: SchemaStore) -> None:
        self._schemas = schemas
        self._mounter: TiDBMounter | None = None

    def __getstate__(self) -> SchemaStore:
        return self._schemas

    def __setstate__(self, state: SchemaStore) -> None:
        self._schemas, self._mounter = state, None

    def schemas(self) -> list[TableSchema]:
        return [
            version.table.table_schema(version.db_name, physical_id, version.schema_version)
            for physical_id, version in self._schemas.versions()
            if version.table is not None and version.table.has_rows
        ]

    def mount(self, event: RawKVEvent) -> RowChange | None:
        return self._row_mounter().mount_row(event)

    def mount_many(self, events: Sequence[RawKVEvent]) -> list[RowChange | None]:
        return self._row_mounter().mount_many(events)

    def mount_inserts(
        self, span: Span, keys_: Sequence[bytes], values_: Sequence[bytes], commit_ts: int, start_ts: int
    ) -> InsertRun | None:
        return self._row_mounter().mount_inserts(keys_, values_, commit_ts, start_ts)

    def _row_mounter(self) -> TiDBMounter:
        if self._mounter is None:
            self._mounter = TiDBMounter(self._schemas)
        return self._mounter
