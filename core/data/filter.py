"""Table filters in TiDB's table-filter syntax (``schema.table`` patterns).

Rules are ``schema-pattern.table-pattern`` with the wildcards ``*`` (any run
of characters), ``?`` (one character) and ``[...]`` (a character class); a
leading ``!`` excludes. A table is replicated when the *last* rule that
matches it is not an exclusion. Names are compared case-insensitively unless
``case_sensitive`` is set. Backquotes quote a name with special characters:
```my.db`.`t*``` matches the literal schema ``my.db``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdcflow.core.data.events import DDLEvent

__all__ = ["DEFAULT_FILTER_RULES", "FilterRuleError", "TableFilter", "replicates_ddl"]

#: The rules of a filter that nobody wrote: every table.
DEFAULT_FILTER_RULES: tuple[str, ...] = ("*.*",)

#: Schemas never replicated, whatever the rules say (TiDB system schemas).
SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "metrics_schema", "sys"})


class FilterRuleError(ValueError):
    """A rule that does not parse; the message says why."""


@dataclass(frozen=True, slots=True)
class _Rule:
    text: str
    exclude: bool
    schema: re.Pattern[str]
    table: re.Pattern[str]


def _split(rule: str) -> tuple[str, str]:
    """Split ``schema.table`` at the first dot outside backquotes."""
    parts: list[str] = []
    buf = ""
    quoted = False
    i = 0
    while i < len(rule):
        ch = rule[i]
        if ch == "`":
            if quoted and i + 1 < len(rule) and rule[i + 1] == "`":
                buf += "``"
                i += 2
                continue
            quoted = not quoted
            buf += ch
        elif ch == "." and not quoted and not parts:
            parts.append(buf)
            buf = ""
        else:
            buf += ch
        i += 1
    if quoted:
        raise FilterRuleError(f"unbalanced backquote in {rule!r}")
    parts.append(buf)
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise FilterRuleError(f"{rule!r} is not of the form schema.table (e.g. 'shop.*' or '*.orders')")
    return parts[0], parts[1]


def _compile(pattern: str, case_sensitive: bool) -> re.Pattern[str]:
    if len(pattern) >= 2 and pattern[0] == "`" and pattern[-1] == "`":
        literal = pattern[1:-1].replace("``", "`")
        return re.compile(re.escape(literal), 0 if case_sensitive else re.IGNORECASE)
    out = ""
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            out += ".*"
        elif ch == "?":
            out += "."
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                raise FilterRuleError(f"unclosed '[' in {pattern!r}")
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            if not body or body == "^":
                raise FilterRuleError(f"empty character class in {pattern!r}")
            out += "[" + body.replace("\\", "\\\\") + "]"
            i = end
        elif ch == "`":
            raise FilterRuleError(f"backquotes must enclose a whole name in {pattern!r}")
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out, 0 if case_sensitive else re.IGNORECASE)


class TableFilter:
    """Decides which tables a changefeed replicates."""

    def __init__(self, rules: Iterable[str] = DEFAULT_FILTER_RULES, *, case_sensitive: bool = False) -> None:
        self._rules: list[_Rule] = []
        for raw in rules:
            text = raw.strip()
            exclude = text.startswith("!")
            body = text[1:].strip() if exclude else text
            schema, table = _split(body)
            self._rules.append(_Rule(text, exclude, _compile(schema, case_sensitive), _compile(table, case_sensitive)))

    def matches_every_table(self) -> bool:
        """Whether the rules admit every table (a ``*.*`` rule and no exclusion)."""
        return any(r.text == "*.*" for r in self._rules) and not any(r.exclude for r in self._rules)

    @staticmethod
    def check(rule: str) -> str | None:
        """Why ``rule`` is invalid, or None when it parses."""
        try:
            TableFilter([rule])
        except FilterRuleError as exc:
            return str(exc)
        return None

    def patterns(self) -> list[tuple[bool, str, str, bool]]:
        """Each rule as ``(exclude, schema regex, table regex, ignore_case)``, in order,
        for engines that match names themselves (the Spark pipeline's query).
        The last matching rule decides; system schemas are never replicated."""
        return [
            (r.exclude, r.schema.pattern, r.table.pattern, bool(r.schema.flags & re.IGNORECASE)) for r in self._rules
        ]

    def matches(self, schema: str, table: str) -> bool:
        """Whether ``schema.table`` is replicated."""
        if schema.lower() in SYSTEM_SCHEMAS:
            return False
        decision = False
        for rule in self._rules:
            if rule.schema.fullmatch(schema) and rule.table.fullmatch(table):
                decision = not rule.exclude
        return decision


def replicates_ddl(table_filter: TableFilter, ddl: DDLEvent) -> bool:
    """Whether a changefeed with ``table_filter`` applies ``ddl`` downstream: DDL of a
    table the filter matches; a RENAME when the filter matches the old name or the
    new one (renamed out of the filter, the downstream table is renamed too, as
    TiCDC does, and gets no rows after it). Schema-level DDL (no table) is not
    replicated: the filter cannot tell which schemas it concerns, and a changefeed
    must not create or drop databases it does not replicate (sinks create a
    missing database before a table's DDL)."""
    names = [ddl.table, ddl.renamed_from]
    return any(t is not None and bool(t.table) and table_filter.matches(t.schema, t.table) for t in names)
