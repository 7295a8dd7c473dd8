"""SQL statements of the MySQL sink, built from a table's downstream keys.

Every value is bound as a parameter (``%s`` placeholders handed to the
driver with the values); only identifiers are spliced into SQL, and they are
always back-quoted with embedded back-quotes doubled, and, since the driver
formats the text with ``%``, with every ``%`` doubled too (a table ``50%off``,
a column ``a%b``). Consecutive changes of
the same kind become one multi-row statement: one ``INSERT``/``REPLACE`` with
many ``VALUES`` rows, one ``DELETE … WHERE k IN (…)``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.data.events import OpType, RowChange

__all__ = ["Statement", "TableMeta", "plan_statements", "quote", "quote_param"]


#: Rows in one multi-row statement: keeps a huge upstream transaction's DELETE … IN (…)
#: well below max_allowed_packet (the driver splits long INSERTs by itself).
MAX_ROWS_PER_STATEMENT = 512


def quote(identifier: str) -> str:
    """A back-quoted MySQL identifier: ``a`b`` → ```a``b```."""
    return "`" + identifier.replace("`", "``") + "`"


def quote_param(identifier: str) -> str:
    """:func:`quote` for SQL text run with parameters (``%s`` placeholders): PyMySQL
    formats such text with ``sql % args``, so a ``%`` of the identifier is doubled
    (``50%off`` → ```50%%off```), or the driver would read it as a placeholder."""
    return quote(identifier).replace("%", "%%")


@dataclass(frozen=True, slots=True)
class TableMeta:
    """What the sink knows of a downstream table: its columns and unique keys.

    ``handle`` is the key used in WHERE clauses (the primary key, else the
    first unique key whose columns are all NOT NULL); empty for a table
    without one, whose rows are then matched on every column (``LIMIT 1``).
    ``unique_keys`` lists every primary/unique index, for conflict detection.
    """

    schema: str
    table: str
    columns: tuple[str, ...]
    handle: tuple[str, ...] = ()
    unique_keys: tuple[tuple[str, ...], ...] = ()
    generated: frozenset[str] = field(default_factory=frozenset)

    @property
    def qualified(self) -> str:
        return f"{quote(self.schema)}.{quote(self.table)}"


@dataclass(slots=True)
class Statement:
    """One SQL text run once (``args``) or as a multi-row executemany (``many``)."""

    sql: str
    args: tuple[Any, ...] = ()
    many: list[tuple[Any, ...]] | None = None
    #: The row changes this statement applies, for precise error reports.
    rows: list[RowChange] = field(default_factory=list)


def _values(image: Mapping[str, Any], columns: Sequence[str], zone: dt.tzinfo) -> tuple[Any, ...]:
    return tuple(_bindable(image.get(c), zone) for c in columns)


def _bindable(value: Any, zone: dt.tzinfo) -> Any:
    # Aware datetimes are shown in the session time zone; the driver drops tzinfo.
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(zone).replace(tzinfo=None)
    return value


def _writable_columns(meta: TableMeta, image: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(c for c in image if c not in meta.generated)


def _where(meta: TableMeta, image: Mapping[str, Any], zone: dt.tzinfo) -> tuple[str, tuple[Any, ...], str]:
    """WHERE text, its args and a LIMIT clause matching the row ``image``."""
    if meta.handle:
        cols = meta.handle
        return " AND ".join(f"{quote_param(c)} = %s" for c in cols), _values(image, cols, zone), ""
    cols = _writable_columns(meta, image)
    return " AND ".join(f"{quote_param(c)} <=> %s" for c in cols), _values(image, cols, zone), " LIMIT 1"


def key_changed(meta: TableMeta, row: RowChange) -> bool:
    """Whether an update moves the row to another handle key."""
    if row.before is None or row.after is None:
        return False
    cols = meta.handle or tuple(row.before)
    return any(row.before.get(c) != row.after.get(c) for c in cols)


@dataclass(slots=True)
class _Run:
    kind: str  # "insert", "replace", "delete", "update"
    columns: tuple[str, ...]
    rows: list[RowChange] = field(default_factory=list)


def _runs(meta: TableMeta, rows: Sequence[RowChange], safe: Sequence[bool]) -> Iterator[_Run]:
    """Consecutive changes grouped into runs that one statement can apply."""
    current: _Run | None = None
    for row, upsert in zip(rows, safe, strict=True):
        for kind, image in _steps(meta, row, upsert):
            columns = meta.handle if kind == "delete" and meta.handle else _writable_columns(meta, image)
            batchable = kind != "update" and (kind != "delete" or bool(meta.handle))
            fits = current is not None and len(current.rows) < MAX_ROWS_PER_STATEMENT
            if current and fits and batchable and current.kind == kind and current.columns == columns:
                current.rows.append(row)
                continue
            if current:
                yield current
            current = _Run(kind, columns, [row])
            if not batchable:
                yield current
                current = None
    if current:
        yield current


def _steps(meta: TableMeta, row: RowChange, upsert: bool) -> list[tuple[str, Mapping[str, Any]]]:
    """The statements one change needs: safe mode turns INSERT/UPDATE into REPLACE."""
    if row.op is OpType.DELETE:
        return [("delete", row.before or {})]
    after = row.after or {}
    if row.op is OpType.INSERT:
        return [("replace" if upsert else "insert", after)]
    if not upsert:
        return [("update", after)]
    steps: list[tuple[str, Mapping[str, Any]]] = []
    if key_changed(meta, row):
        steps.append(("delete", row.before or {}))
    steps.append(("replace", after))
    return steps


def plan_statements(
    meta: TableMeta, rows: Sequence[RowChange], safe: Sequence[bool], zone: dt.tzinfo
) -> list[Statement]:
    """Statements applying ``rows`` of one table in order; ``safe[i]`` makes row i an upsert."""
    statements: list[Statement] = []
    for run in _runs(meta, rows, safe):
        statements.append(_statement(meta, run, zone))
    return statements


def _statement(meta: TableMeta, run: _Run, zone: dt.tzinfo) -> Statement:
    table = f"{quote_param(meta.schema)}.{quote_param(meta.table)}"
    if run.kind in ("insert", "replace"):
        verb = "INSERT" if run.kind == "insert" else "REPLACE"
        cols = ", ".join(quote_param(c) for c in run.columns)
        marks = ", ".join(["%s"] * len(run.columns))
        images = [r.after or {} for r in run.rows]
        return Statement(
            f"{verb} INTO {table} ({cols}) VALUES ({marks})",
            many=[_values(i, run.columns, zone) for i in images],
            rows=run.rows,
        )
    if run.kind == "delete" and meta.handle:
        args = tuple(v for r in run.rows for v in _values(r.before or {}, meta.handle, zone))
        # Plain IN for a one-column key, OR of ANDs otherwise: row-constructor IN ((a, b), …)
        # is not turned into index lookups by every server (MariaDB scans the table).
        if len(meta.handle) == 1:
            marks = ", ".join(["%s"] * len(run.rows))
            key = quote_param(meta.handle[0])
            return Statement(f"DELETE FROM {table} WHERE {key} IN ({marks})", args, rows=run.rows)
        one = "(" + " AND ".join(f"{quote_param(c)} = %s" for c in meta.handle) + ")"
        return Statement(f"DELETE FROM {table} WHERE " + " OR ".join([one] * len(run.rows)), args, rows=run.rows)
    row = run.rows[0]
    if run.kind == "delete":
        where, where_args, limit = _where(meta, row.before or {}, zone)
        return Statement(f"DELETE FROM {table} WHERE {where}{limit}", where_args, rows=run.rows)
    after = row.after or {}
    sets = ", ".join(f"{quote_param(c)} = %s" for c in run.columns)
    where, where_args, limit = _where(meta, row.before or after, zone)
    return Statement(
        f"UPDATE {table} SET {sets} WHERE {where}{limit}",
        _values(after, run.columns, zone) + where_args,
        rows=run.rows,
    )
