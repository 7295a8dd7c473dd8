"""Column selection: which columns of a replicated table reach the sinks.

A selector has a table matcher (table-filter rules) and column patterns with
the table filter's wildcards (``*``, ``?``, ``[...]``), ``!`` excluding; the
last matching pattern decides, names compare case-insensitively (as MySQL
column names do). The first selector whose matcher matches a table applies;
tables no selector matches keep every column. Handle-key columns are always
kept, so that sinks can still key, dispatch and deduplicate rows.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import Any

from cdcflow.core.config.settings import ColumnSelectorSettings
from cdcflow.core.data.events import RowChange, TableName
from cdcflow.core.data.filter import TableFilter

__all__ = ["ColumnSelection"]


class _Selector:
    def __init__(self, settings: ColumnSelectorSettings) -> None:
        self.tables = TableFilter(settings.matcher)
        self.rules = [
            (p.startswith("!"), re.compile(fnmatch.translate(p.lstrip("!").strip()), re.IGNORECASE))
            for p in settings.columns
        ]

    def keeps(self, column: str) -> bool:
        decision = False
        for exclude, pattern in self.rules:
            if pattern.match(column):
                decision = not exclude
        return decision


class ColumnSelection:
    """Applies a connector's column selectors to rows."""

    def __init__(self, selectors: Iterable[ColumnSelectorSettings] = ()) -> None:
        self._selectors = [_Selector(s) for s in selectors]
        self._by_table: dict[TableName, _Selector | None] = {}

    def __bool__(self) -> bool:
        return bool(self._selectors)

    def apply(self, row: RowChange) -> RowChange:
        """``row`` with only the selected columns in its images and schema."""
        selector = self._selector_for(row.table)
        if selector is None:
            return row
        keys = set(row.schema.handle_key_columns()) if row.schema is not None else set()

        def keep(name: str) -> bool:
            return name in keys or selector.keeps(name)

        schema = row.schema
        if schema is not None:
            schema = dataclasses.replace(schema, columns=tuple(c for c in schema.columns if keep(c.name)))
        return dataclasses.replace(
            row, after=_project(row.after, keep), before=_project(row.before, keep), schema=schema
        )

    def _selector_for(self, table: TableName) -> _Selector | None:
        if table not in self._by_table:
            self._by_table[table] = next(
                (s for s in self._selectors if s.tables.matches(table.schema, table.table)), None
            )
        return self._by_table[table]


def _project(image: Mapping[str, Any] | None, keep: Any) -> dict[str, Any] | None:
    return None if image is None else {k: v for k, v in image.items() if keep(k)}
