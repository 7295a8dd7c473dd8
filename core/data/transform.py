"""Transforms: Kafka Connect's single message transforms, run in the Spark tasks.

A transform plugin (``cdcflow_register_transforms``) reshapes the rows of a
micro-batch between mounting and the sinks: it keeps or drops rows, changes
their columns, or sends them to another table. A connector lists its
transforms under ``transforms:``; each is scoped to tables with table-filter
rules (``tables:``, empty: every table) and they apply in order, so a later
transform's scope sees the table names an earlier route gave.

The chain (:class:`TransformChain`) is pickled into every Spark task with the
batch's plan: tasks apply it to the rows of their partition after mounting,
and the driver applies the very same chain on the path where sinks are written
from the driver. Per batch, each transform prepares what it needs once per
table schema (a compiled expression, a column plan); per row, it runs that.

DDL passes through the chain too (:meth:`TransformChain.ddl`): its table is
routed, its ``schema_after`` transformed, and its text rewritten so that a
DDL-applying sink (MySQL) creates and alters the transformed table: a CREATE
TABLE is written again from the transformed schema, an ADD or DROP COLUMN of a
column a transform drops is left out, a renamed column or a routed table is
renamed in the text.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field, field_validator

from cdcflow.core.data.events import ColumnInfo, DDLEvent, RowChange, TableName, TableSchema
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin.base import ConfigT, Plugin, PluginConfig

__all__ = [
    "Transform",
    "TransformChain",
    "TransformConfig",
    "TransformStep",
    "column_for_sql_type",
]

#: DDL kinds (TiDB ActionType) a route that merges tables leaves out: they would drop
#: or rename the merged table for every source.
_ACTION_DROP_TABLE = 4
_ACTION_TRUNCATE_TABLE = 11
_ACTION_RENAME_TABLE = 14


class TransformConfig(PluginConfig):
    """What every transform's config has: its scope."""

    tables: list[str] = Field(
        default_factory=list,
        description="Table-filter rules of the tables this transform applies to (schema.table, * ? [] "
        "wildcards, ! to exclude, the last match wins); empty: every table.",
    )

    @field_validator("tables")
    @classmethod
    def _rules(cls, rules: list[str]) -> list[str]:
        for i, rule in enumerate(rules):
            problem = TableFilter.check(rule)
            if problem:
                raise ValueError(f"rule {i} {problem}")
        return rules


class Transform(Plugin[ConfigT], abc.ABC):
    """Base class of transform plugins.

    Instances are pickled into Spark tasks with every batch: keep what they
    hold small and picklable, and compile what rows need lazily (per table
    schema, cached on the instance; the cache is not pickled, see
    :meth:`__getstate__`).
    """

    Config: ClassVar[type[PluginConfig]] = TransformConfig
    #: Whether the transform may route rows to another table (route-conflict checks).
    routes_tables: ClassVar[bool] = False

    def __getstate__(self) -> dict[str, Any]:
        # Caches hold compiled closures: rebuilt in each task, never shipped.
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_cache")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @abc.abstractmethod
    def apply(self, rows: list[RowChange]) -> list[RowChange]:
        """The rows ``rows`` become (all in the transform's scope, in batch order); may
        drop, change or add rows, and must keep the order of each key's changes."""

    def schema(self, schema: TableSchema) -> TableSchema:
        """The schema rows of ``schema`` have after the transform (also a DDL's schema).
        Raises ConfigInvalidError (naming the field) when the transform cannot apply to it."""
        return schema

    def table(self, table: TableName) -> TableName:
        """The table rows of ``table`` go to (a route's target)."""
        return table

    def merges(self, table: TableName) -> bool:
        """Whether rows of several source tables may reach ``self.table(table)``."""
        return False

    def column(self, name: str) -> str | None:
        """What the column ``name`` is called after the transform, None when it is dropped."""
        return name

    def keeps_ddl(self, ddl: DDLEvent) -> bool:
        """Whether ``ddl`` (of a table in scope) still reaches the sinks."""
        return True


@dataclass(frozen=True)
class TransformStep:
    """One entry of a connector's ``transforms:`` list."""

    #: How messages name it: ``transforms[1] (mask)``.
    label: str
    transform: Transform[Any]
    scope: TableFilter

    def applies(self, table: TableName) -> bool:
        return self.scope.matches(table.schema, table.table)


class TransformChain:
    """A connector's transforms, in order (picklable; shipped with every task)."""

    def __init__(self, steps: Sequence[TransformStep] = ()) -> None:
        self.steps = tuple(steps)
        self._cache_scope: dict[tuple[int, TableName], bool] = {}

    def __bool__(self) -> bool:
        return bool(self.steps)

    def __getstate__(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]
        self._cache_scope = {}

    def _in_scope(self, index: int, table: TableName) -> bool:
        key = (index, table)
        found = self._cache_scope.get(key)
        if found is None:
            found = self._cache_scope[key] = self.steps[index].applies(table)
        return found

    # -- rows -------------------------------------------------------------------------

    def apply(self, rows: list[RowChange]) -> list[RowChange]:
        """``rows`` through every transform, in order. Rows out of a transform's scope
        pass it unchanged, in their place."""
        for index, step in enumerate(self.steps):
            if not rows:
                break
            scoped = [self._in_scope(index, row.table) for row in rows]
            if all(scoped):
                rows = step.transform.apply(rows)
                continue
            if not any(scoped):
                continue
            out: list[RowChange] = []
            run: list[RowChange] = []
            for row, inside in zip(rows, scoped, strict=True):
                if inside:
                    run.append(row)
                    continue
                if run:
                    out.extend(step.transform.apply(run))
                    run = []
                out.append(row)
            if run:
                out.extend(step.transform.apply(run))
            rows = out
        return rows

    # -- schemas and tables -----------------------------------------------------------

    def schema(self, schema: TableSchema) -> TableSchema:
        """The schema sinks see for rows of ``schema``."""
        for index, step in enumerate(self.steps):
            if self._in_scope(index, schema.table):
                schema = step.transform.schema(schema)
                table = step.transform.table(schema.table)
                if table != schema.table:
                    schema = dataclasses.replace(schema, table=table)
        return schema

    def table(self, table: TableName) -> TableName:
        """The table sinks see rows of ``table`` under."""
        for index, step in enumerate(self.steps):
            if self._in_scope(index, table):
                table = step.transform.table(table)
        return table

    def check(self, schemas: Sequence[TableSchema]) -> list[tuple[str, str, str]]:
        """Problems of the chain with these source schemas, as ``(step label, field,
        message)``: a transform that cannot apply (an unknown column), or a route that
        sends tables of different columns to one table."""
        problems: list[tuple[str, str, str]] = []
        targets: dict[tuple[str, str], tuple[TableSchema, TableSchema, str]] = {}
        for source in schemas:
            schema = source
            for index, step in enumerate(self.steps):
                if not self._in_scope(index, schema.table):
                    continue
                try:
                    schema = step.transform.schema(schema)
                except ConfigInvalidError as exc:
                    field = str((exc.detail or {}).get("field", ""))
                    problems.append((step.label, field, f"table {source.table}: {exc.message}"))
                    break
                table = step.transform.table(schema.table)
                if table != schema.table:
                    schema = dataclasses.replace(schema, table=table)
                    key = (table.schema.lower(), table.table.lower())
                    seen = targets.get(key)
                    if seen is None:
                        targets[key] = (source, schema, step.label)
                    elif _shape(seen[1]) != _shape(schema):
                        problems.append(
                            (
                                step.label,
                                "routes",
                                f"{seen[0].table} and {source.table} both go to {table} with different columns "
                                f"({_describe(seen[1])} vs {_describe(schema)}); route them to different tables, "
                                "or project them to the same columns first",
                            )
                        )
        return problems

    # -- DDL --------------------------------------------------------------------------

    def ddl(self, event: DDLEvent) -> DDLEvent | None:  # noqa: PLR0912
        """``event`` as the sinks see it, or None when the transforms leave it out."""
        if event.table is None or not self.steps:
            return event
        table = event.table
        schema = event.schema_after
        query = event.query
        renamed_from = event.renamed_from
        regenerate = False
        if_not_exists = False
        for index, step in enumerate(self.steps):
            if not self._in_scope(index, table):
                continue
            transform = step.transform
            if not transform.keeps_ddl(event):
                return None
            if schema is not None:
                before = schema
                schema = transform.schema(schema)
                if _shape(schema) != _shape(before) or [c.name for c in schema.columns] != [
                    c.name for c in before.columns
                ]:
                    regenerate = regenerate or _is_create(query)
            query, dropped = _rewrite_columns(query, transform, schema)
            if dropped:
                return None
            target = transform.table(table)
            if target != table:
                if transform.merges(table):
                    if event.action_type in (_ACTION_DROP_TABLE, _ACTION_TRUNCATE_TABLE, _ACTION_RENAME_TABLE):
                        return None  # would drop or rename the merged table for every source
                    if_not_exists = True
                query = _rename_table(query, table, target)
                if renamed_from is not None:
                    renamed_from = transform.table(renamed_from)
                table = target
                if schema is not None:
                    schema = dataclasses.replace(schema, table=target)
        if (regenerate or if_not_exists) and _is_create(query) and schema is not None:
            query = create_table_sql(schema, if_not_exists=if_not_exists)
        elif if_not_exists:
            query = _if_exists_clauses(query)
        return dataclasses.replace(event, table=table, schema_after=schema, query=query, renamed_from=renamed_from)


def _shape(schema: TableSchema) -> list[tuple[str, int]]:
    return [(c.name.lower(), c.type_code) for c in schema.columns]


def _describe(schema: TableSchema) -> str:
    return ", ".join(c.name for c in schema.columns) or "no columns"


# -- DDL text -------------------------------------------------------------------------


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _ident(name: str) -> str:
    """A regex matching ``name`` as an identifier, back-quoted or bare."""
    return r"(?:`" + re.escape(name.replace("`", "``")) + r"`|\b" + re.escape(name) + r"\b)"


def _is_create(query: str) -> bool:
    return bool(re.match(r"\s*CREATE\s+TABLE\b", query, re.IGNORECASE))


def create_table_sql(schema: TableSchema, *, if_not_exists: bool = False) -> str:
    """A CREATE TABLE for ``schema`` (columns, NULL-ability, the handle key as primary key)."""
    defs = []
    for c in schema.columns:
        sql_type = c.sql_type or _default_sql_type(c)
        defs.append(f"{_quote(c.name)} {sql_type}{'' if c.nullable else ' NOT NULL'}")
    keys = schema.handle_key_columns()
    if keys:
        defs.append("PRIMARY KEY (" + ", ".join(_quote(k) for k in keys) + ")")
    exists = "IF NOT EXISTS " if if_not_exists else ""
    return f"CREATE TABLE {exists}{_quote(schema.table.schema)}.{_quote(schema.table.table)} ({', '.join(defs)})"


def _default_sql_type(column: ColumnInfo) -> str:
    for names, code in _SQL_TYPES:
        if code == column.type_code:
            return names[0]
    return "text"


def _rename_table(query: str, old: TableName, new: TableName) -> str:
    qualified = _ident(old.schema) + r"\s*\.\s*" + _ident(old.table)
    target = f"{_quote(new.schema)}.{_quote(new.table)}"
    out = re.sub(qualified, lambda _m: target, query)
    if out != query:
        return out
    # An unqualified name after TABLE / TO (the sink runs DDL in the table's schema).
    pattern = r"(\b(?:TABLE(?:\s+IF\s+(?:NOT\s+)?EXISTS)?|TO)\s+)" + _ident(old.table)
    return re.sub(pattern, lambda m: m.group(1) + target, query, flags=re.IGNORECASE)


_COLUMN_CLAUSE = re.compile(
    r"\b(ADD|DROP|MODIFY|CHANGE|RENAME)\s+(?:COLUMN\s+)?(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(`(?:[^`]|``)*`|\w+)",
    re.IGNORECASE,
)


def _rewrite_columns(query: str, transform: Transform[Any], schema: TableSchema | None) -> tuple[str, bool]:
    """``query`` with the columns ``transform`` renames renamed and the type of a column it
    retypes replaced; ``(query, True)`` when it adds or drops a column the transform drops."""
    if _is_create(query):
        return query, False  # written again from the schema
    clauses = list(_COLUMN_CLAUSE.finditer(query))
    for m in clauses:
        word = m.group(1).upper()
        name = m.group(2)
        if word in ("ADD", "DROP") and name.upper() in ("INDEX", "KEY", "PRIMARY", "UNIQUE", "CONSTRAINT", "PARTITION"):
            continue
        name = name[1:-1].replace("``", "`") if name.startswith("`") else name
        renamed = transform.column(name)
        if renamed is None:
            if len(clauses) == 1 and word in ("ADD", "DROP"):
                return query, True
            continue
        if word == "ADD" and schema is not None:
            column = next((c for c in schema.columns if c.name == renamed), None)
            if column is not None and len(clauses) == 1 and _retyped(query, m.end(), column):
                head = query[: m.start()]
                definition = f"ADD COLUMN {_quote(renamed)} {column.sql_type}"
                return head + definition, False
        if renamed != name:
            query = re.sub(_ident(name), _quote(renamed).replace("\\", "\\\\"), query)
    return query, False


def _retyped(query: str, at: int, column: ColumnInfo) -> bool:
    """Whether the ADD COLUMN definition after ``at`` has another type than ``column``."""
    rest = query[at:].strip()
    return bool(column.sql_type) and not rest.lower().startswith(column.sql_type.lower())


def _if_exists_clauses(query: str) -> str:
    """ADD COLUMN → ADD COLUMN IF NOT EXISTS, DROP COLUMN → DROP COLUMN IF EXISTS (MariaDB,
    TiDB): several sources merged into one table repeat their schema changes."""
    query = re.sub(r"\bADD\s+COLUMN\s+(?!IF\b)", "ADD COLUMN IF NOT EXISTS ", query, flags=re.IGNORECASE)
    return re.sub(r"\bDROP\s+COLUMN\s+(?!IF\b)", "DROP COLUMN IF EXISTS ", query, flags=re.IGNORECASE)


# -- SQL types of new columns ------------------------------------------------------------

_SQL_TYPES: tuple[tuple[tuple[str, ...], int], ...] = (
    (("bigint",), TypeCode.LONGLONG),
    (("int", "integer", "mediumint"), TypeCode.LONG),
    (("smallint",), TypeCode.SHORT),
    (("tinyint", "boolean", "bool"), TypeCode.TINY),
    (("double", "real"), TypeCode.DOUBLE),
    (("float",), TypeCode.FLOAT),
    (("decimal", "numeric"), TypeCode.NEWDECIMAL),
    (("varchar", "char"), TypeCode.VARCHAR),
    (("text", "tinytext", "mediumtext", "longtext"), TypeCode.BLOB),
    (("date",), TypeCode.DATE),
    (("datetime",), TypeCode.DATETIME),
    (("timestamp",), TypeCode.TIMESTAMP),
    (("json",), TypeCode.JSON),
)

#: The Spark SQL cast that makes a value fit a column of this SQL type (None: as is).
_CASTS = {
    TypeCode.LONGLONG: "bigint",
    TypeCode.LONG: "bigint",
    TypeCode.SHORT: "bigint",
    TypeCode.TINY: "bigint",
    TypeCode.DOUBLE: "double",
    TypeCode.FLOAT: "double",
    TypeCode.VARCHAR: "string",
    TypeCode.BLOB: "string",
    TypeCode.DATE: "date",
    TypeCode.JSON: "string",
}


def column_for_sql_type(name: str, sql_type: str) -> tuple[ColumnInfo, Callable[[Any], Any]]:
    """A nullable column of MySQL type ``sql_type`` (``bigint``, ``varchar(64)``,
    ``decimal(10,2)``, …) and the function that makes a value fit it. ValueError
    for a type that is not supported."""
    from cdcflow.core.data.expr import _cast

    text = sql_type.strip().lower()
    base = re.match(r"[a-z]+", text)
    if base is not None:
        for names, code in _SQL_TYPES:
            if base.group() in names:
                column = ColumnInfo(name, int(code), ColumnInfo.NULLABLE, text, True)
                if code == TypeCode.NEWDECIMAL:
                    args = text[len(base.group()) :].strip() or "(10,0)"
                    cast = "decimal" + args.replace(" ", "")
                    return column, lambda v, to=cast: _cast(v, to)
                spark = _CASTS.get(TypeCode(code))
                if spark is None:
                    return column, lambda v: v
                return column, lambda v, to=spark: _cast(v, to)
    known = ", ".join(n for names, _ in _SQL_TYPES for n in names)
    raise ValueError(f"unsupported column type {sql_type!r}; use one of: {known}")
