"""``project``: keep, drop and rename columns, and add computed ones.

In order: ``columns`` (when given) keeps only the columns named (the table's
key columns are always kept, so sinks can still key and deduplicate rows),
``drop`` drops columns (a key column cannot be dropped), ``computed`` adds
columns whose values are Spark SQL expressions over the row's columns (as the
upstream names them, before any rename; the same subset as ``filter``) and
whose type is a MySQL column type (``bigint``, ``varchar(64)``,
``decimal(10,2)``, ``double``, ``date``, ``text``, …; values are cast to it),
and ``rename`` renames the remaining columns. An update's old image is
projected the same way. Names compare case-insensitively, as MySQL's do.
Names in ``columns``, ``drop`` and ``rename`` that a table does not have are
ignored for it (a transform scoped to several tables, a column dropped
upstream later); an expression naming a column the table does not have is an
error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cdcflow.core.data.events import ColumnInfo, RowChange, TableSchema
from cdcflow.core.data.expr import Compiled, ExpressionError, compile_expression, parse
from cdcflow.core.data.transform import Transform, TransformConfig, column_for_sql_type
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin.base import PluginConfig, kebab
from cdcflow.core.plugin.hookspec import hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.plugin.registry import Registrar
from cdcflow.plugins.transforms._common import check_expression, expression_error, per_schema

__all__ = ["ComputedColumn", "ProjectConfig", "ProjectTransform"]


class ComputedColumn(BaseModel):
    """A column added by ``project``."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=kebab, populate_by_name=True)

    name: str = Field(description="The new column's name.")
    expr: str = Field(description="Spark SQL expression of its value.")
    type: str = Field("text", description="Its MySQL column type (bigint, varchar(64), decimal(10,2), date, ...).")


class ProjectConfig(TransformConfig):
    columns: list[str] = Field(
        default_factory=list, description="Columns to keep (key columns are always kept); empty: every column."
    )
    drop: list[str] = Field(default_factory=list, description="Columns to drop.")
    rename: dict[str, str] = Field(default_factory=dict, description="Columns to rename: old name → new name.")
    computed: list[ComputedColumn] = Field(
        default_factory=list, description="Columns to add: name, expr (Spark SQL) and type (MySQL column type)."
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    schema: TableSchema | None
    #: (source name, output name) of the columns kept, in order.
    kept: tuple[tuple[str, str], ...]
    computed: tuple[tuple[str, Compiled, Callable[[Any], Any]], ...]


class ProjectTransform(Transform[ProjectConfig]):
    """Keep, drop and rename columns; add columns computed with Spark SQL expressions."""

    type_name = "project"
    Config = ProjectConfig

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, ProjectConfig)
        problems: list[tuple[str, str]] = []
        for i, column in enumerate(config.computed):
            problems += check_expression(column.expr, f"computed.{i}.expr")
            try:
                column_for_sql_type(column.name, column.type)
            except ValueError as exc:
                problems.append((f"computed.{i}.type", str(exc)))
        outputs = [config.rename.get(c, c).lower() for c in config.columns] + [c.name.lower() for c in config.computed]
        for name in {n for n in outputs if outputs.count(n) > 1}:
            problems.append(("computed", f"two output columns are named {name!r}"))
        return problems

    def column(self, name: str) -> str | None:
        lower = name.lower()
        if self.config.columns and lower not in {c.lower() for c in self.config.columns}:
            return None  # unless it is a key column: schema() keeps those
        if lower in {c.lower() for c in self.config.drop}:
            return None
        for old, new in self.config.rename.items():
            if old.lower() == lower:
                return new
        return name

    def _plan(self, schema: TableSchema | None) -> _Plan:
        return per_schema(self, schema, self._build)

    def _build(self, schema: TableSchema | None) -> _Plan:
        config = self.config
        names = [c.name for c in schema.columns] if schema is not None else None
        keys = {k.lower() for k in schema.handle_key_columns()} if schema is not None else set()
        if names is not None:
            for name in config.drop:
                if name.lower() in keys:
                    raise ConfigInvalidError(
                        f"drop: '{name}' is a key column; sinks need it to key rows (rename it instead)",
                        detail={"field": "drop"},
                    )
        kept: list[tuple[str, str]] = []
        for name in names or []:
            renamed = self.column(name)
            if renamed is None and name.lower() in keys:
                renamed = name
            if renamed is not None:
                kept.append((name, renamed))
        computed = []
        for i, column in enumerate(config.computed):
            field = f"computed.{i}.expr"
            try:
                fn = compile_expression(parse(column.expr), names)
            except ExpressionError as exc:
                raise expression_error(field, column.expr, exc) from None
            _, fit = column_for_sql_type(column.name, column.type)
            computed.append((column.name, fn, fit))
        return _Plan(schema, tuple(kept), tuple(computed))

    def schema(self, schema: TableSchema) -> TableSchema:
        plan = self._plan(schema)
        by_name = {c.name: c for c in schema.columns}
        columns: list[ColumnInfo] = [dataclasses.replace(by_name[old], name=new) for old, new in plan.kept]
        for column in self.config.computed:
            info, _ = column_for_sql_type(column.name, column.type)
            columns.append(info)
        return dataclasses.replace(schema, columns=tuple(columns))

    def _out_schema(self, schema: TableSchema | None) -> TableSchema | None:
        return None if schema is None else self.schema(schema)

    def apply(self, rows: list[RowChange]) -> list[RowChange]:
        out: list[RowChange] = []
        plan: _Plan | None = None
        new_schema: TableSchema | None = None
        for row in rows:
            if plan is None or row.schema is not plan.schema:
                plan = self._plan(row.schema)
                new_schema = per_schema(self, row.schema, self._out_schema, "_cache_out")
            if row.schema is None:
                out.append(self._apply_unschematized(row, plan))
                continue
            op = row.op.value
            after = before = None
            if row.after is not None:
                after = {new: row.after.get(old) for old, new in plan.kept}
                env = (row.after, row.before, op, row.commit_ts)
                for name, fn, fit in plan.computed:
                    after[name] = fit(fn(env))
            if row.before is not None:
                before = {new: row.before.get(old) for old, new in plan.kept}
                env = (row.before, row.before, op, row.commit_ts)
                for name, fn, fit in plan.computed:
                    before[name] = fit(fn(env))
            out.append(dataclasses.replace(row, after=after, before=before, schema=new_schema))
        return out

    def _apply_unschematized(self, row: RowChange, plan: _Plan) -> RowChange:
        """A row without a schema (a source that gives none): its images' own names."""
        op = row.op.value
        names: dict[str, str | None] = self.__dict__.setdefault("_cache_names", {})

        def project(image: Any) -> dict[str, Any] | None:
            if image is None:
                return None
            out = {}
            for name, value in image.items():
                new = names[name] if name in names else names.setdefault(name, self.column(name))
                if new is not None:
                    out[new] = value
            env = (image, row.before, op, row.commit_ts)
            for column, fn, fit in plan.computed:
                out[column] = fit(fn(env))
            return out

        return dataclasses.replace(row, after=project(row.after), before=project(row.before))


@hookimpl
def cdcflow_register_transforms(registry: Registrar[Transform[Any]]) -> None:
    registry.add(ProjectTransform)
