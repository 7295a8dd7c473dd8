"""Sinkless ``CREATE CHANGEFEED`` in the playground: rows ``(table, key, value)`` as CockroachDB streams them.

Options (../reference facts §1.2): ``updated``, ``mvcc_timestamp``, ``diff``,
``resolved[=duration]``, ``min_checkpoint_frequency`` (resolved rows come no
more often than it; default 30 s), ``cursor`` (changes after it, from the
version history; no initial scan unless ``initial_scan='yes'``; below the
table's GC threshold: the GC error), ``initial_scan`` (yes/no/only),
``envelope`` (wrapped only), ``format`` (json only), ``schema_change_policy``
(backfill: every row again at the change; nobackfill; stop: rows below the
change and a resolved row, then the error ``schema change occurred at <ts>``),
``schema_change_events`` (default / column_changes); a watched table dropped
ends the feed with ``"<table>" was dropped``. Like CockroachDB it may
repeat rows after a restart; unlike it, it emits each transaction's rows as one
group in HLC order.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cdcflow.plugins.sources.cockroach_playground.sql import SQLError, _expr
from cdcflow.plugins.sources.cockroach_playground.store import Commit, Store, TableDef
from cdcflow.plugins.sources.cockroachdb.hlc import HLC

if TYPE_CHECKING:
    from cdcflow.plugins.sources.cockroach_playground.sql import _P, Session

__all__ = ["ChangefeedSpec", "parse_changefeed", "run_changefeed"]

_FLAGS = {"updated", "mvcc_timestamp", "diff", "resolved", "key_in_value", "full_table_name"}
_KNOWN = _FLAGS | {
    "min_checkpoint_frequency",
    "cursor",
    "initial_scan",
    "envelope",
    "format",
    "schema_change_policy",
    "schema_change_events",
    "no_initial_scan",
    "end_time",
    "on_error",
}


@dataclass
class ChangefeedSpec:
    tables: list[str]
    options: dict[str, str | None] = field(default_factory=dict)
    #: Set by the playground's fault injection: the error the feed raises at its next step.
    fail_with: SQLError | None = None


def _seconds(text: str | None, default: float) -> float:
    if text is None or text == "":
        return default
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if m is None:
        raise SQLError("22023", f"invalid duration {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def parse_changefeed(p: _P, session: Session) -> ChangefeedSpec:
    if not p.accept("CREATE", "CHANGEFEED"):
        p.expect("EXPERIMENTAL", "CHANGEFEED")
    p.expect("FOR")
    p.accept("TABLE")
    tables = [p.name()]
    while p.accept(","):
        p.accept("TABLE")
        tables.append(p.name())
    if p.accept("INTO"):
        raise SQLError("0A000", "the playground runs sinkless changefeeds only (no INTO)")
    options: dict[str, str | None] = {}
    if p.accept("WITH"):
        while True:
            key = p.ident()
            value = None
            if p.accept("="):
                value = str(_expr(p, session)({}))
            if key not in _KNOWN:
                raise SQLError("42601", f"unknown changefeed option: {key}")
            options[key] = value
            if not p.accept(","):
                break
    for t in tables:
        try:
            session.store.table(t)
        except LookupError:
            raise SQLError("42P01", f'relation "{t}" does not exist') from None
    if options.get("envelope", "wrapped") != "wrapped" or options.get("format", "json") != "json":
        raise SQLError("0A000", "the playground supports envelope='wrapped', format='json'")
    return ChangefeedSpec(tables, options)


def _json_value(v: Any) -> Any:
    """A stored value as CockroachDB's changefeed JSON writes it (BYTES as ``\\x<hex>``, times ISO 8601)."""
    if isinstance(v, bytes):
        return "\\x" + v.hex()
    if isinstance(v, dt.datetime):
        if v.tzinfo:
            return v.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
        return v.isoformat()
    if isinstance(v, dt.date):
        return v.isoformat()
    return v


def _json(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, Decimal)):
        return str(v)  # DECIMAL as a JSON number with its exact digits
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_json(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_json(x) for x in v) + "]"
    return json.dumps(v if isinstance(v, str) else str(v))


def _dumps(obj: Any) -> bytes:
    return _json(obj).encode()


def _row_json(row: dict[str, Any] | None) -> Any:
    return None if row is None else {k: _json_value(v) for k, v in row.items()}


class _Feed:
    def __init__(self, store: Store, spec: ChangefeedSpec) -> None:
        self.store = store
        self.spec = spec
        o = spec.options
        self.ids = {store.table(t).id: t for t in spec.tables}
        self.diff = "diff" in o
        self.updated = "updated" in o
        self.mvcc = "mvcc_timestamp" in o
        self.resolved_every = (
            max(_seconds(o.get("resolved"), 0), _seconds(o.get("min_checkpoint_frequency"), 30.0))
            if "resolved" in o
            else None
        )
        self.policy = o.get("schema_change_policy") or "backfill"
        self.events = o.get("schema_change_events") or "default"

    def row(self, name: str, d: TableDef, key: tuple[Any, ...], before: Any, after: Any, ts: HLC) -> tuple[Any, ...]:
        value: dict[str, Any] = {"after": _row_json(d.project(after))}
        if self.diff:
            value["before"] = _row_json(d.project(before))
        if self.updated:
            value["updated"] = str(ts)
        if self.mvcc:
            value["mvcc_timestamp"] = str(ts)
        key_json = _dumps([_json_value(v) for v in key])
        return (name, key_json, _dumps(value))

    def resolved_row(self, ts: HLC) -> tuple[Any, ...]:
        return (None, None, _dumps({"resolved": str(ts)}))

    def triggers(self, old: TableDef | None, new: TableDef | None) -> bool:
        if old is None or new is None:
            return False
        before = {c.name for c in old.columns}
        after = {c.name for c in new.columns}
        if self.events == "column_changes":
            return before != after
        added = [c for c in new.columns if c.name not in before]
        return bool(before - after) or any(c.default is not None for c in added)

    def commit_rows(self, commit: Commit) -> list[tuple[Any, ...]]:
        out = []
        for table_id, key, before, after in commit.writes:
            name = self.ids.get(table_id)
            if name is None:
                continue
            d = self.store.by_id(table_id).descriptor(commit.hlc)
            if d is not None:
                out.append(self.row(name, d, key, before, after, commit.hlc))
        return out


def _catch_up(feed: _Feed, cursor: HLC, until: int) -> list[Commit]:
    """The commits after ``cursor`` already in the log (the log is in HLC order)."""
    log = feed.store.log[:until]
    lo, hi = 0, len(log)
    while lo < hi:
        mid = (lo + hi) // 2
        if log[mid].hlc <= cursor:
            lo = mid + 1
        else:
            hi = mid
    return log[lo:]


async def run_changefeed(store: Store, spec: ChangefeedSpec) -> AsyncIterator[tuple[Any, ...]]:  # noqa: PLR0912, PLR0915
    """The feed's rows, forever (until the consumer stops or an error is raised)."""
    feed = _Feed(store, spec)
    cursor_text = spec.options.get("cursor")
    with store.lock:
        statement_ts = store.clock.now()
        position = len(store.log)
        cursor = HLC.parse(cursor_text) if cursor_text else statement_ts
        for name in spec.tables:
            threshold = store.table(name).gc_threshold
            if cursor < threshold:
                raise SQLError(
                    "XXUUU",
                    f"batch timestamp {cursor.go_string()} must be after replica GC threshold {threshold.go_string()}",
                )
        scan = spec.options.get("initial_scan") or ("no" if cursor_text else "yes")
        scanned: list[tuple[Any, ...]] = []
        if scan in ("yes", "only"):
            for name in spec.tables:
                table = store.table(name)
                d = table.descriptor(cursor)
                if d is None:
                    continue
                for key in sorted(table.rows, key=repr):
                    row = table.value(key, cursor)
                    if row is not None:
                        scanned.append(feed.row(name, d, key, None, row, cursor))
        pending = _catch_up(feed, cursor, position) if cursor_text else []
    for item in scanned:
        yield item
    if scan == "only":
        return
    last_resolved = time.monotonic()
    while True:
        if spec.fail_with is not None:
            raise spec.fail_with
        if not pending:
            with store.lock:
                pending = store.log[position:]
                position += len(pending)
                frontier = store.clock.now()
        else:
            frontier = None
        for commit in pending:
            if commit.schema_change is not None:
                table_id, old, new = commit.schema_change
                if table_id in feed.ids and old is not None and new is None:
                    raise SQLError("XXUUU", f'"{feed.ids[table_id]}" was dropped')  # as CockroachDB fails the feed
                if table_id in feed.ids and feed.triggers(old, new):
                    if feed.policy == "stop":
                        yield feed.resolved_row(commit.hlc.prev())
                        raise SQLError("XXUUU", f"schema change occurred at {commit.hlc.go_string()}")
                    if feed.policy == "backfill" and new is not None:
                        table = store.by_id(table_id)
                        for key in list(table.rows):
                            row = table.value(key, commit.hlc)
                            if row is not None:
                                yield feed.row(feed.ids[table_id], new, key, row, row, commit.hlc)
                continue
            for item in feed.commit_rows(commit):
                yield item
        was_catch_up = frontier is None
        pending = []
        if was_catch_up:
            continue
        if (
            frontier is not None
            and feed.resolved_every is not None
            and time.monotonic() - last_resolved >= feed.resolved_every
        ):
            last_resolved = time.monotonic()
            yield feed.resolved_row(frontier)
        await asyncio.sleep(0.01)
