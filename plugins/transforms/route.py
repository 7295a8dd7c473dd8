"""``route``: send the rows (and the DDL) of source tables to other tables.

Each rule's ``source`` is a regular expression matched against the whole
``schema.table`` name (case-insensitively); the first rule that matches
decides, and its ``target`` names the table, with ``\\1`` (or ``\\g<name>``)
standing for the source's groups: ``shard_(\\d+)\\.users`` → ``all.users``
merges the shards, ``shop\\.(\\w+)`` → ``lake.\\1`` moves a whole schema.
Tables no rule matches keep their name.

``source-column`` adds a ``varchar(255)`` column holding the row's source
``schema.table``; ``source-column-in-key`` makes it part of the primary key,
so that equal keys of different shards stay different rows downstream.
Without it, tables merged into one must have keys unique across them.

DDL of a routed table is routed with it. When a rule merges tables (its
source pattern can match tables its target does not tell apart), the
CREATE TABLE becomes ``CREATE TABLE IF NOT EXISTS``, ADD/DROP COLUMN become
``IF [NOT] EXISTS`` (MariaDB and TiDB syntax), and DROP TABLE, TRUNCATE TABLE
and RENAME TABLE of one source are left out (they would hit every source's
rows). Two tables of different columns routed into one are refused when the
changefeed is validated against the source's schemas and when it starts.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cdcflow.core.data.events import ColumnInfo, RowChange, TableName, TableSchema
from cdcflow.core.data.transform import Transform, TransformConfig
from cdcflow.core.data.types import TypeCode
from cdcflow.core.plugin.base import PluginConfig, kebab
from cdcflow.core.plugin.hookspec import hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.plugin.registry import Registrar
from cdcflow.plugins.transforms._common import per_schema

__all__ = ["RouteConfig", "RouteRule", "RouteTransform"]


class RouteRule(BaseModel):
    """One routing rule."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=kebab, populate_by_name=True)

    source: str = Field(description="Regular expression matching the whole source schema.table.")
    target: str = Field(description="The target schema.table; \\1 … stand for the source's groups.")


class RouteConfig(TransformConfig):
    routes: list[RouteRule] = Field(default_factory=list, description="Rules, first match wins (required).")
    source_column: str = Field("", description="Name of a column to add with the row's source schema.table.")
    source_column_in_key: bool = Field(False, description="Make source-column part of the primary key.")


def _merges(rule: RouteRule) -> bool:
    """Whether ``rule`` can send differently named tables to one target: some part of its
    pattern that is not a literal does not reach the target through a group."""
    pattern = re.compile(rule.source)
    referenced = {int(a or b) for a, b in re.findall(r"\\(\d+)|\\g<(\d+)>", rule.target)}
    referenced |= {pattern.groupindex[n] for n in re.findall(r"\\g<([A-Za-z_]\w*)>", rule.target)}
    text = rule.source
    spans = []
    for index in referenced:
        # The text of each referenced group: find its parenthesis by counting opening ones.
        count = 0
        for i, ch in enumerate(text):
            if ch == "(" and (i == 0 or text[i - 1] != "\\") and not text.startswith("(?:", i):
                count += 1
                if count == index:
                    depth = 0
                    for j in range(i, len(text)):
                        if text[j] == "(" and text[j - 1 : j] != "\\":
                            depth += 1
                        elif text[j] == ")" and text[j - 1 : j] != "\\":
                            depth -= 1
                            if depth == 0:
                                spans.append((i, j + 1))
                                break
                    break
    rest = "".join(ch for i, ch in enumerate(text) if not any(a <= i < b for a, b in spans))
    rest = re.sub(r"\\[.\\_-]", "", rest)
    return bool(re.search(r"[.*+?\[\]|(){}]|\\[dDwWsS]", rest))


class RouteTransform(Transform[RouteConfig]):
    """Send source tables' rows and DDL to other tables (rename, merge shards)."""

    type_name = "route"
    Config = RouteConfig
    routes_tables = True

    def __init__(self, config: RouteConfig) -> None:
        super().__init__(config)
        self._compile()

    def _compile(self) -> None:
        self._cache_rules = [(re.compile(r.source, re.IGNORECASE), r.target, _merges(r)) for r in self.config.routes]
        self._cache_targets: dict[TableName, tuple[TableName, bool]] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._compile()

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, RouteConfig)
        problems: list[tuple[str, str]] = []
        if not config.routes:
            problems.append(("routes", "give at least one rule: {source: 'shard_(\\d+)\\.users', target: all.users}"))
        for i, rule in enumerate(config.routes):
            try:
                pattern = re.compile(rule.source)
            except re.error as exc:
                problems.append((f"routes.{i}.source", f"not a regular expression: {exc}"))
                continue
            if rule.target.count(".") != 1 or rule.target.startswith(".") or rule.target.endswith("."):
                problems.append((f"routes.{i}.target", f"{rule.target!r} is not schema.table"))
            for ref in re.findall(r"\\(\d+)", rule.target):
                if int(ref) > pattern.groups:
                    problems.append(
                        (f"routes.{i}.target", f"\\{ref}: the source pattern has {pattern.groups} group(s)")
                    )
        if config.source_column_in_key and not config.source_column:
            problems.append(("source-column-in-key", "set source-column too"))
        return problems

    def _route(self, table: TableName) -> tuple[TableName, bool]:
        found = self._cache_targets.get(table)
        if found is None:
            found = (table, False)
            name = f"{table.schema}.{table.table}"
            for pattern, target, merges in self._cache_rules:
                m = pattern.fullmatch(name)
                if m is not None:
                    schema, _, rest = m.expand(target).partition(".")
                    if merges:
                        # One table for every source: sinks keep state per TableName (a file per
                        # table and partition, a MySQL table's progress), so the upstream ids of
                        # the sources must not tell their rows apart.
                        found = (TableName(schema, rest), True)
                    else:
                        found = (dataclasses.replace(table, schema=schema, table=rest), False)
                    break
            self._cache_targets[table] = found
        return found

    def table(self, table: TableName) -> TableName:
        return self._route(table)[0]

    def merges(self, table: TableName) -> bool:
        return self._route(table)[1]

    def schema(self, schema: TableSchema) -> TableSchema:
        name = self.config.source_column
        if not name:
            return schema
        flags = ColumnInfo.NULLABLE
        if self.config.source_column_in_key:
            flags = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY
        column = ColumnInfo(name, int(TypeCode.VARCHAR), flags, "varchar(255)", not self.config.source_column_in_key)
        return dataclasses.replace(schema, columns=(*schema.columns, column))

    def _out_schema(self, schema: TableSchema | None) -> TableSchema | None:
        if schema is None:
            return None
        out = self.schema(schema)
        return dataclasses.replace(out, table=self.table(schema.table))

    def apply(self, rows: list[RowChange]) -> list[RowChange]:
        column = self.config.source_column
        out: list[RowChange] = []
        for row in rows:
            target = self._route(row.table)[0]
            schema = per_schema(self, row.schema, self._out_schema, "_cache_out")
            after, before = row.after, row.before
            if column:
                source = f"{row.table.schema}.{row.table.table}"
                after = None if after is None else {**after, column: source}
                before = None if before is None else {**before, column: source}
            out.append(dataclasses.replace(row, table=target, schema=schema, after=after, before=before))
        return out


@hookimpl
def cdcflow_register_transforms(registry: Registrar[Transform[Any]]) -> None:
    registry.add(RouteTransform)
