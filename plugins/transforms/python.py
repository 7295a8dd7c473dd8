"""``python``: a function of yours over Arrow record batches.

``function: "package.module:name"`` names a function that takes a
:class:`pyarrow.RecordBatch` and returns one. The batch holds the images of
consecutive rows of one table (at one schema version): a column per table
column, and

* ``_op`` (string: insert, update, delete), ``_commit_ts`` (int64),
  ``_table`` (string, ``schema.table``),
* ``_row`` (int64) and ``_image`` (string: ``after``, or ``before`` for the
  old image of an update or a delete) — which row and image each record is.

Return a batch with ``_row`` and ``_image`` and the columns the rows should
have: leave records out to drop rows (a row whose ``after`` record is left
out is dropped), change values, add or drop columns; the other ``_``
columns are ignored. The function is also called once per table schema with
an empty batch: the columns it returns then are the schema sinks see (DDL
included), so it must handle zero rows. Each column's Arrow type becomes its
SQL type (int64 → bigint, float64 → double, string → text, bool → tinyint,
date32 → date, timestamp → datetime, decimal128(p, s) → decimal(p,s), binary
→ blob). The module must be importable where Spark tasks run (installed in
the same environment: on local[*], the capture's).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import importlib
from collections.abc import Callable
from typing import Any, cast

import pyarrow as pa
from pydantic import Field

from cdcflow.core.data.events import ColumnInfo, OpType, RowChange, TableSchema
from cdcflow.core.data.transform import Transform, TransformConfig
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin.base import PluginConfig
from cdcflow.core.plugin.hookspec import hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.plugin.registry import Registrar
from cdcflow.plugins.transforms._common import per_schema

__all__ = ["PythonConfig", "PythonTransform", "load_function"]

_META = ("_op", "_commit_ts", "_table", "_row", "_image")


class PythonConfig(TransformConfig):
    function: str = Field("", description="The function, as package.module:name (required).")


def load_function(spec: str) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """The function ``module:name`` names; ConfigInvalidError naming the field otherwise."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ConfigInvalidError(f"function: {spec!r} is not module:function", detail={"field": "function"})
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigInvalidError(
            f"function: cannot import {module_name}: {exc!r}; install the package that provides it",
            detail={"field": "function"},
        ) from exc
    fn: Any = module
    for part in name.split("."):
        fn = getattr(fn, part, None)
    if not callable(fn):
        raise ConfigInvalidError(f"function: {module_name} has no function {name}", detail={"field": "function"})
    return cast("Callable[[pa.RecordBatch], pa.RecordBatch]", fn)


def _arrow_type(column: ColumnInfo) -> pa.DataType:
    code = column.type_code
    if code in (TypeCode.TINY, TypeCode.SHORT, TypeCode.LONG, TypeCode.LONGLONG, TypeCode.INT24, TypeCode.YEAR):
        return pa.int64()
    if code in (TypeCode.FLOAT, TypeCode.DOUBLE):
        return pa.float64()
    if code in (TypeCode.DECIMAL, TypeCode.NEWDECIMAL):
        return pa.decimal128(38, 10)
    if code in (TypeCode.DATE, TypeCode.NEWDATE):
        return pa.date32()
    if code in (TypeCode.DATETIME, TypeCode.TIMESTAMP):
        return pa.timestamp("us")
    if code == TypeCode.DURATION:
        return pa.duration("us")
    if column.flags & ColumnInfo.BINARY:
        return pa.binary()
    return pa.string()


def _sql_type(name: str, arrow: pa.DataType) -> ColumnInfo:
    if pa.types.is_boolean(arrow):
        return ColumnInfo(name, int(TypeCode.TINY), ColumnInfo.NULLABLE, "tinyint(1)")
    if pa.types.is_integer(arrow):
        return ColumnInfo(name, int(TypeCode.LONGLONG), ColumnInfo.NULLABLE, "bigint")
    if pa.types.is_floating(arrow):
        return ColumnInfo(name, int(TypeCode.DOUBLE), ColumnInfo.NULLABLE, "double")
    if pa.types.is_decimal(arrow):
        sql = f"decimal({min(arrow.precision, 65)},{min(arrow.scale, 30)})"
        return ColumnInfo(name, int(TypeCode.NEWDECIMAL), ColumnInfo.NULLABLE, sql)
    if pa.types.is_date(arrow):
        return ColumnInfo(name, int(TypeCode.DATE), ColumnInfo.NULLABLE, "date")
    if pa.types.is_timestamp(arrow):
        return ColumnInfo(name, int(TypeCode.DATETIME), ColumnInfo.NULLABLE, "datetime(6)")
    if pa.types.is_binary(arrow) or pa.types.is_large_binary(arrow):
        return ColumnInfo(name, int(TypeCode.BLOB), ColumnInfo.NULLABLE | ColumnInfo.BINARY, "blob")
    return ColumnInfo(name, int(TypeCode.BLOB), ColumnInfo.NULLABLE, "text")


def _empty(schema: TableSchema) -> pa.RecordBatch:
    fields = [pa.field(c.name, _arrow_type(c)) for c in schema.columns]
    fields += [
        pa.field("_op", pa.string()),
        pa.field("_commit_ts", pa.int64()),
        pa.field("_table", pa.string()),
        pa.field("_row", pa.int64()),
        pa.field("_image", pa.string()),
    ]
    return pa.RecordBatch.from_pylist([], schema=pa.schema(fields))


def _column(values: list[Any], column: ColumnInfo | None) -> pa.Array:
    arrow = _arrow_type(column) if column is not None else None
    if arrow is not None and pa.types.is_decimal(arrow):
        arrow = None  # inferred: the values' own precision and scale
    try:
        return pa.array(values, type=arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())


class PythonTransform(Transform[PythonConfig]):
    """Run your function (module:function) over Arrow record batches of the rows."""

    type_name = "python"
    Config = PythonConfig

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, PythonConfig)
        if not config.function:
            return [("function", "name the function, as package.module:name")]
        try:
            load_function(config.function)
        except ConfigInvalidError as exc:
            return [("function", exc.message.removeprefix("function: "))]
        return []

    def _function(self) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
        fn = self.__dict__.get("_cache_fn")
        if fn is None:
            fn = self.__dict__["_cache_fn"] = load_function(self.config.function)
        return fn

    def _call(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        out = self._function()(batch)
        if isinstance(out, pa.Table):
            out = out.combine_chunks().to_batches()[0] if out.num_rows else pa.RecordBatch.from_pylist([], out.schema)
        if not isinstance(out, pa.RecordBatch) or "_row" not in out.schema.names or "_image" not in out.schema.names:
            raise ConfigInvalidError(
                f"function: {self.config.function} must return a pyarrow.RecordBatch with the _row and _image "
                "columns of its input",
                detail={"field": "function"},
            )
        return out

    def schema(self, schema: TableSchema) -> TableSchema:
        def build(s: TableSchema | None) -> TableSchema:
            assert s is not None
            out = self._call(_empty(s))
            by_name = {c.name: c for c in s.columns}
            columns = []
            for f in out.schema:
                if f.name in _META:
                    continue
                known = by_name.get(f.name)
                columns.append(
                    known if known is not None and f.type == _arrow_type(known) else _sql_type(f.name, f.type)
                )
            return dataclasses.replace(s, columns=tuple(columns))

        return per_schema(self, schema, build, "_cache_schema")

    def column(self, name: str) -> str | None:
        return name  # a column the function drops is found in schema(); DDL text is kept

    def apply(self, rows: list[RowChange]) -> list[RowChange]:
        out: list[RowChange] = []
        start = 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or rows[i].schema is not rows[start].schema or rows[i].table != rows[start].table:
                out.extend(self._run(rows[start:i]))
                start = i
        return out

    def _run(self, rows: list[RowChange]) -> list[RowChange]:
        first = rows[0]
        schema = first.schema
        names = [c.name for c in schema.columns] if schema is not None else list(first.image())
        infos = {c.name: c for c in schema.columns} if schema is not None else {}
        records: list[tuple[int, str, Any]] = []
        for index, row in enumerate(rows):
            if row.after is not None:
                records.append((index, "after", row.after))
            if row.before is not None:
                records.append((index, "before", row.before))
        arrays = [_column([image.get(n) for _, _, image in records], infos.get(n)) for n in names]
        arrays += [
            pa.array([rows[i].op.value for i, _, _ in records], pa.string()),
            pa.array([rows[i].commit_ts for i, _, _ in records], pa.int64()),
            pa.array([str(rows[i].table) for i, _, _ in records], pa.string()),
            pa.array([i for i, _, _ in records], pa.int64()),
            pa.array([which for _, which, _ in records], pa.string()),
        ]
        batch = pa.RecordBatch.from_arrays(arrays, names=[*names, *_META])
        result = self._call(batch)
        new_schema = self.schema(schema) if schema is not None else None
        columns = [n for n in result.schema.names if n not in _META]
        data = {n: result.column(n).to_pylist() for n in columns}
        images: dict[tuple[int, str], dict[str, Any]] = {}
        for j, (row_index, which) in enumerate(
            zip(result.column("_row").to_pylist(), result.column("_image").to_pylist(), strict=True)
        ):
            images[(int(row_index), str(which))] = {n: _python(data[n][j]) for n in columns}
        out: list[RowChange] = []
        for index, row in enumerate(rows):
            after = images.get((index, "after"))
            before = images.get((index, "before"))
            if row.op is OpType.DELETE:
                if before is None:
                    continue
            elif after is None:
                continue
            out.append(dataclasses.replace(row, after=after, before=before, schema=new_schema))
        return out


def _python(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.replace(tzinfo=None)
    if isinstance(value, decimal.Decimal):
        return value
    return value


@hookimpl
def cdcflow_register_transforms(registry: Registrar[Transform[Any]]) -> None:
    registry.add(PythonTransform)
