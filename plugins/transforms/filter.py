"""``filter``: keep the rows that match a Spark SQL predicate.

The predicate sees the row's columns (the new image; the old image of a
delete), ``_op`` (``'insert'``, ``'update'``, ``'delete'``), ``_commit_ts``,
and ``_before.<column>`` (the old image of an update or a delete, NULL for an
insert). A row is kept when the predicate is TRUE (not NULL).

An update is judged twice, as TiCDC's expression filter and CockroachDB's CDC
queries would have a replica see it: on its new image and on its old one
(the old image's columns, ``_before`` the old image too). Matched on both, it
stays an update; on the new image only, it *enters* the filter and becomes an
insert downstream; on the old image only, it *leaves* it and becomes a delete;
on neither, it is dropped. A source that gives no old image for an update has
it judged on the new image alone: kept as an update, or else a delete of its
key (a no-op downstream when the row was never there).

See :mod:`cdcflow.core.data.expr` for the expression subset.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import Field

from cdcflow.core.data.events import OpType, RowChange, TableSchema
from cdcflow.core.data.expr import Compiled, ExpressionError, compile_expression, parse
from cdcflow.core.data.transform import Transform, TransformConfig
from cdcflow.core.plugin.base import PluginConfig
from cdcflow.core.plugin.hookspec import hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.plugin.registry import Registrar
from cdcflow.plugins.transforms._common import check_expression, expression_error, per_schema

__all__ = ["FilterConfig", "FilterTransform"]


class FilterConfig(TransformConfig):
    where: str = Field(
        "",
        description="Spark SQL predicate over the row's columns, _op, _commit_ts and _before.<column>; "
        "rows for which it is TRUE are kept (required).",
    )


class FilterTransform(Transform[FilterConfig]):
    """Keep the rows matching a Spark SQL predicate; updates crossing it become inserts or deletes."""

    type_name = "filter"
    Config = FilterConfig

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, FilterConfig)
        if not config.where.strip():
            return [("where", 'give the predicate rows must match, e.g. where: "amount > 100"')]
        return check_expression(config.where, "where")

    def _predicate(self, schema: TableSchema | None) -> Compiled:
        def build(s: TableSchema | None) -> Compiled:
            try:
                return compile_expression(parse(self.config.where), None if s is None else [c.name for c in s.columns])
            except ExpressionError as exc:
                raise expression_error("where", self.config.where, exc) from None

        return per_schema(self, schema, build)

    def schema(self, schema: TableSchema) -> TableSchema:
        self._predicate(schema)  # an unknown column is an error here
        return schema

    def apply(self, rows: list[RowChange]) -> list[RowChange]:
        out: list[RowChange] = []
        schema: Any = object()
        predicate: Compiled | None = None
        for row in rows:
            if row.schema is not schema or predicate is None:
                schema = row.schema
                predicate = self._predicate(schema)
            op = row.op
            if op is OpType.INSERT:
                if predicate((row.after or {}, None, "insert", row.commit_ts)) is True:
                    out.append(row)
            elif op is OpType.DELETE:
                image = row.before or {}
                if predicate((image, row.before, "delete", row.commit_ts)) is True:
                    out.append(row)
            else:
                after = row.after or {}
                now = predicate((after, row.before, "update", row.commit_ts)) is True
                if row.before is None:
                    out.append(row if now else dataclasses.replace(row, op=OpType.DELETE, before=after, after=None))
                    continue
                was = predicate((row.before, row.before, "update", row.commit_ts)) is True
                if now and was:
                    out.append(row)
                elif now:
                    out.append(dataclasses.replace(row, op=OpType.INSERT, before=None))
                elif was:
                    out.append(dataclasses.replace(row, op=OpType.DELETE, after=None))
        return out


@hookimpl
def cdcflow_register_transforms(registry: Registrar[Transform[Any]]) -> None:
    registry.add(FilterTransform)
