"""The sinkless ``CREATE CHANGEFEED`` statement of one table span."""

from __future__ import annotations

from cdcflow.plugins.sources.cockroachdb.hlc import HLC

__all__ = ["changefeed_statement", "quote_ident", "quote_literal"]


def quote_ident(name: str) -> str:
    """A SQL identifier, double-quoted."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _duration(seconds: float) -> str:
    return f"{max(round(seconds * 1000), 1)}ms"


def changefeed_statement(
    table: str, cursor: HLC, *, resolved_seconds: float, initial_scan: str = "no", sql_schema: str = "public"
) -> str:
    """``CREATE CHANGEFEED FOR TABLE … WITH …`` streaming to the client (no ``INTO``).

    ``cursor`` is the span's checkpoint (so a move, restart or resume continues
    where it stopped); ``schema_change_policy='stop'`` with
    ``schema_change_events='column_changes'`` ends the feed at every column
    change, after the rows below it are resolved: the source then emits the DDL
    at that ts and starts again from it (the DDL barrier). ``resolved`` and
    ``min_checkpoint_frequency`` are set together: resolved rows come no more
    often than checkpoints.
    """
    every = quote_literal(_duration(resolved_seconds))
    options = [
        "updated",
        "mvcc_timestamp",
        "diff",
        f"resolved = {every}",
        f"min_checkpoint_frequency = {every}",
        f"cursor = {quote_literal(str(cursor))}",
        f"initial_scan = {quote_literal(initial_scan)}",
        "envelope = 'wrapped'",
        "format = 'json'",
        "schema_change_policy = 'stop'",
        "schema_change_events = 'column_changes'",
    ]
    target = f"{quote_ident(sql_schema)}.{quote_ident(table)}"
    return f"CREATE CHANGEFEED FOR TABLE {target} WITH {', '.join(options)}"
