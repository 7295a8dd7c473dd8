"""Column DDL applied to a snapshot: ADD, DROP, RENAME and MODIFY/CHANGE COLUMN.

A DDL event carries the table's schema after it (``DDLEvent.schema_after``).
The snapshot's columns (name → Spark type, in order) are compared with it by
name, case-insensitively as MySQL and Spark compare column names, after the
renames the statement names (``RENAME COLUMN a TO b``, ``CHANGE [COLUMN] a b
…``; the schema alone cannot tell a rename from a drop and an add):

* a column of the schema that the snapshot lacks is added, and existing rows
  get its origin default (:attr:`ColumnInfo.origin_default`: what the upstream
  reads for rows written before the column existed), typed as the column;
* a column of the snapshot that the schema lacks is dropped;
* a renamed column keeps its values under the new name;
* a column whose Spark type changed is cast (Spark's ``CAST``; where Spark
  cannot cast, :class:`~cdcflow.core.errors.DDLBlockedError` names the
  table, column and DDL);
* the columns take the schema's order.

A DDL that leaves names and types as they are (CREATE INDEX, SET DEFAULT …)
changes nothing. The plan is computed from the snapshot as it is, so applying
a DDL twice (a replayed batch) gives the same table.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdcflow.core.data.events import DDLEvent, RowChange, TableName
from cdcflow.core.errors import DDLBlockedError, Retryable, Severity
from cdcflow.plugins.sinks.spark.frames import column_type

__all__ = [
    "ColumnPlan",
    "TargetColumn",
    "column_plan",
    "cut_at_ddl",
    "ddl_by_table",
    "ddl_error",
    "evolve",
    "renamed_columns",
    "sql_literal",
]


@dataclass(frozen=True, slots=True)
class TargetColumn:
    """One column of the snapshot after a DDL, and where its values come from."""

    name: str
    spark_type: str
    #: The snapshot column it is made from (renamed, cast, or as is); None: a new column.
    source: str | None
    #: The value existing rows get in a new column (the column's origin default).
    default: Any = None
    #: The source column's type, when it differs from ``spark_type`` (a cast).
    cast_from: str | None = None


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """How one DDL turns the snapshot's columns into those of its ``schema_after``."""

    ddl: DDLEvent
    columns: tuple[TargetColumn, ...]
    dropped: tuple[str, ...]

    @property
    def renamed(self) -> tuple[tuple[str, str], ...]:
        return tuple((c.source, c.name) for c in self.columns if c.source is not None and c.source != c.name)

    @property
    def added(self) -> tuple[TargetColumn, ...]:
        return tuple(c for c in self.columns if c.source is None)

    @property
    def cast(self) -> tuple[TargetColumn, ...]:
        return tuple(c for c in self.columns if c.cast_from is not None)


# -- DDL text ---------------------------------------------------------------------

_TOKEN = re.compile(
    r"`((?:[^`]|``)*)`"  # quoted identifier
    r"|'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\""  # string literals (skipped)
    r"|/\*.*?\*/|--[^\n]*|#[^\n]*"  # comments (skipped)
    r"|([A-Za-z0-9_$]+)"  # bare word
    r"|(\S)",  # punctuation
    re.DOTALL,
)


def _tokens(query: str) -> list[tuple[str, str]]:
    """(kind, text): kind ``id`` for a quoted identifier, ``word``, ``punct``; literals and comments dropped."""
    out: list[tuple[str, str]] = []
    for m in _TOKEN.finditer(query):
        quoted, word, punct = m.group(1), m.group(2), m.group(3)
        if quoted is not None:
            out.append(("id", quoted.replace("``", "`")))
        elif word is not None:
            out.append(("word", word))
        elif punct is not None:
            out.append(("punct", punct))
    return out


def _clauses(tokens: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The statement split at top-level commas (ALTER TABLE t spec, spec, …)."""
    clauses: list[list[tuple[str, str]]] = [[]]
    depth = 0
    for kind, text in tokens:
        if kind == "punct" and text == "(":
            depth += 1
        elif kind == "punct" and text == ")":
            depth -= 1
        elif kind == "punct" and text == "," and depth == 0:
            clauses.append([])
            continue
        clauses[-1].append((kind, text))
    return clauses


def _is(token: tuple[str, str] | None, word: str) -> bool:
    return token is not None and token[0] == "word" and token[1].upper() == word


def _name(token: tuple[str, str] | None) -> str | None:
    return token[1] if token is not None and token[0] in ("id", "word") else None


def renamed_columns(query: str) -> list[tuple[str, str]]:
    """(old, new) for each ``RENAME COLUMN old TO new`` and ``CHANGE [COLUMN] old new …`` of ``query``."""
    renames: list[tuple[str, str]] = []
    for clause in _clauses(_tokens(query)):
        padded: list[tuple[str, str] | None] = [*clause, None, None, None, None]
        for i, token in enumerate(clause):
            if _is(token, "RENAME") and _is(padded[i + 1], "COLUMN") and _is(padded[i + 3], "TO"):
                old, new = _name(padded[i + 2]), _name(padded[i + 4])
            elif _is(token, "CHANGE"):
                j = i + 2 if _is(padded[i + 1], "COLUMN") else i + 1
                old, new = _name(padded[j]), _name(padded[j + 1])
            else:
                continue
            if old is not None and new is not None and old != new:
                renames.append((old, new))
            break
    return renames


# -- the plan -----------------------------------------------------------------------


def column_plan(current: Sequence[tuple[str, str]], ddl: DDLEvent) -> ColumnPlan | None:
    """The plan from the snapshot's ``current`` (name, Spark type) columns to ``ddl.schema_after``.

    None when the DDL has no schema, or when names, types and order stay the same.
    """
    schema = ddl.schema_after
    if schema is None or not schema.columns:
        return None
    types = {name.lower(): (name, kind) for name, kind in current}
    renames = {}
    for old, new in renamed_columns(ddl.query):
        if old.lower() in types and any(c.name.lower() == new.lower() for c in schema.columns):
            renames[new.lower()] = types[old.lower()][0]
    renamed_away = {old.lower() for old in renames.values()}
    columns = []
    for col in schema.columns:
        kind = column_type(col)
        source = renames.get(col.name.lower())
        if source is None and col.name.lower() in types and col.name.lower() not in renamed_away:
            source = types[col.name.lower()][0]
        if source is None:
            columns.append(TargetColumn(col.name, kind, None, col.origin_default))
            continue
        was = types[source.lower()][1]
        columns.append(TargetColumn(col.name, kind, source, cast_from=was if was != kind else None))
    used = {c.source.lower() for c in columns if c.source is not None}
    dropped = tuple(name for name, _ in current if name.lower() not in used)
    plan = ColumnPlan(ddl, tuple(columns), dropped)
    unchanged = [(c.name, c.spark_type) for c in columns] == list(current)
    return None if unchanged else plan


def evolve(frame: Any, plan: ColumnPlan, table: TableName) -> Any:
    """``frame`` with the columns of ``plan``; DDLBlockedError where Spark cannot cast."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    exprs = []
    for col in plan.columns:
        if col.source is None:
            exprs.append(F.expr(sql_literal(col.default, col.spark_type)).alias(col.name))
            continue
        expr = F.col(_q(col.source))
        if col.cast_from is not None:
            try:
                frame.select(expr.cast(col.spark_type))  # analysed now: refused casts raise here
            except AnalysisException as exc:
                raise ddl_error(table, plan.ddl, col, str(exc).splitlines()[0]) from exc
            expr = expr.cast(col.spark_type)
        exprs.append(expr.alias(col.name))
    return frame.select(*exprs)


def ddl_error(table: TableName, ddl: DDLEvent, column: TargetColumn, reason: str) -> DDLBlockedError:
    """The error for a DDL the snapshot cannot follow: what, where, and what to do."""
    return DDLBlockedError(
        f"Spark sink: the snapshot of {table} cannot follow DDL {ddl.query!r} (commit ts {ddl.commit_ts}): "
        f"column {column.source or column.name!r} from {column.cast_from} to {column.spark_type}: {reason}. "
        "To go on, remove the table from the changefeed's filter, write it in changelog mode only, or move its "
        "snapshot directory aside and re-load the table; then resume the changefeed",
        detail={
            "table": str(table),
            "column": column.source or column.name,
            "from": column.cast_from,
            "to": column.spark_type,
            "ddl": ddl.query,
            "commit_ts": ddl.commit_ts,
        },
        severity=Severity.ERROR,
        retryable=Retryable.NONE,
    )


# -- values -----------------------------------------------------------------------------


def sql_literal(value: Any, spark_type: str) -> str:
    """A Spark SQL expression of ``value`` (a row-image value) as ``spark_type``.

    The same value the change records would hold: an aware datetime is an instant
    (TIMESTAMP), a naive one a wall-clock time (TIMESTAMP_NTZ), TIME its text.
    MySQL's zero dates have no Spark value: NULL.
    """
    typed = f"CAST(NULL AS {spark_type})"
    if value is None:
        return typed
    if isinstance(value, bytes | bytearray) and spark_type == "binary":
        text = f"X'{bytes(value).hex()}'"
    elif isinstance(value, bytes | bytearray):
        text = _string(bytes(value).decode("utf-8", "replace"))
    elif isinstance(value, bool):
        text = "TRUE" if value else "FALSE"
    elif isinstance(value, dt.datetime):
        text = _string(value.isoformat(sep=" "))
    elif isinstance(value, dt.date):
        text = _string(value.isoformat())
    elif isinstance(value, str) and value.startswith("0000-00-00") and spark_type.startswith(("date", "timestamp")):
        return typed
    elif isinstance(value, float):
        text = _string(repr(value))
    else:  # int, Decimal, str; TIME (timedelta) as the change records keep it: its text
        text = _string(str(value))
    return f"CAST({text} AS {spark_type})"


def _string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# -- a batch cut at its DDL ---------------------------------------------------------------


def cut_at_ddl(rows: Sequence[RowChange], ddl: Sequence[DDLEvent]) -> list[tuple[list[RowChange], DDLEvent | None]]:
    """The rows of one table split at its DDL: the rows below each DDL's commit ts, then the DDL.

    The last step holds the rows at or above the last DDL (and no DDL). Rows keep
    their order; DDL are taken in commit ts order.
    """
    steps: list[tuple[list[RowChange], DDLEvent | None]] = []
    pending = list(rows)
    for event in sorted(ddl, key=lambda d: d.commit_ts):
        below = [r for r in pending if r.commit_ts < event.commit_ts]
        pending = [r for r in pending if r.commit_ts >= event.commit_ts]
        steps.append((below, event))
    steps.append((pending, None))
    return steps


def ddl_by_table(ddl: Sequence[DDLEvent]) -> Mapping[tuple[str, str], list[DDLEvent]]:
    """The batch's DDL per (schema, table); DDL without a table (CREATE DATABASE …) are left out."""
    out: dict[tuple[str, str], list[DDLEvent]] = {}
    for event in ddl:
        if event.table is not None and event.table.table:
            out.setdefault((event.table.schema, event.table.table), []).append(event)
    return out
