"""Typed comparison of downstream rows with the playground's snapshot.

What "equal" means across MariaDB, Parquet, Kafka and the playground:

- DECIMAL: compared as numbers at the column's scale (Spark stores ``decimal(38,10)``).
- DATETIME / TIMESTAMP: naive UTC datetimes (the playground decodes TIMESTAMP as aware UTC;
  MariaDB and Spark sessions run in UTC and return naive values).
- TIME: a ``timedelta`` (the Spark sink stores TIME as its ``str(timedelta)`` text).
- ENUM: the member name (TiDB rows and the Spark sink carry the 1-based index).
- JSON: the parsed document (MariaDB returns the text; key order and spacing are free).
- Everything else (ints, unsigned ints, DOUBLE, VARCHAR, NULL) must be identical.

A column typed by CockroachDB's type name (a ``str``: the CockroachDB playground's
descriptors) is compared as upstream and every sink agree on it: DECIMAL at its scale,
BOOL as a bool (``1``/``t``/``true``), INT as int, FLOAT as float, TIMESTAMP(TZ) naive
UTC, DATE a date, JSONB parsed, BYTES as bytes, anything else as its text.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from typing import Any

__all__ = ["diff", "normalise", "normalise_cockroach", "typed_rows"]


def _time(value: Any) -> dt.timedelta:
    if isinstance(value, dt.timedelta):
        return value
    match = re.fullmatch(r"(-)?(?:(\d+) days?, )?(\d+):(\d\d):(\d\d)(?:\.(\d+))?", str(value))
    assert match, f"not a TIME value: {value!r}"
    sign, days, h, m, s, frac = match.groups()
    delta = dt.timedelta(
        days=int(days or 0), hours=int(h), minutes=int(m), seconds=int(s), microseconds=int((frac or "0").ljust(6, "0"))
    )
    return -delta if sign else delta


def normalise(value: Any, ft: Any) -> Any:
    """``value`` of a column of TiDB type ``ft`` in the comparable form documented above."""
    from cdcflow.core.data.types import TypeCode

    if value is None:
        return None
    if isinstance(ft, str):
        return normalise_cockroach(value, ft)
    tp = TypeCode(ft.tp)
    if tp == TypeCode.NEWDECIMAL:
        return decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-max(ft.decimal, 0)))
    if tp in (TypeCode.DATETIME, TypeCode.TIMESTAMP):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value
    if tp == TypeCode.DURATION:
        return _time(value)
    if tp == TypeCode.ENUM:
        if isinstance(value, int) or str(value).isdigit():
            return ft.elems[int(value) - 1]
        return value
    if tp == TypeCode.JSON:
        return json.loads(value) if isinstance(value, str | bytes) else value
    return value


def normalise_cockroach(value: Any, crdb_type: str) -> Any:
    """``value`` of a column of CockroachDB type ``crdb_type`` in the comparable form documented above."""
    if value is None:
        return None
    t = crdb_type.upper()
    if t.startswith("DECIMAL"):
        scale = re.search(r",\s*(\d+)\)", t)
        return decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-int(scale.group(1) if scale else 0)))
    if t.startswith("BOOL"):
        return value if isinstance(value, bool) else str(value).lower() in ("1", "t", "true")
    if t.startswith("INT"):
        return int(value)
    if t.startswith("FLOAT"):
        return float(value)
    if t.startswith("TIMESTAMP"):
        value = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
        return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value
    if t == "DATE":
        return value.date() if isinstance(value, dt.datetime) else dt.date.fromisoformat(str(value))
    if t.startswith("JSON"):
        return json.loads(value) if isinstance(value, str | bytes) else value
    if t.startswith("BYTES"):
        return bytes(value) if not isinstance(value, str) else value.encode("latin-1")
    return str(value)


def typed_rows(
    rows: list[dict[str, Any]], types: dict[str, Any], key: tuple[str, ...] = ("id",)
) -> dict[Any, dict[str, Any]]:
    """Rows keyed by their ``key`` columns' values (one column: the value itself), every column
    normalised by its type."""

    def key_of(row: dict[str, Any]) -> Any:
        values = tuple(normalise(row.get(c), types[c]) if c in types else row.get(c) for c in key)
        return values[0] if len(values) == 1 else values

    return {key_of(row): {c: normalise(row.get(c), ft) for c, ft in types.items()} for row in rows}


def diff(want: dict[Any, dict[str, Any]], got: dict[Any, dict[str, Any]], limit: int = 5) -> str:
    """A short description of how ``got`` differs from ``want`` (empty when equal)."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    changed = [k for k in sorted(set(want) & set(got)) if want[k] != got[k]]
    if not (missing or extra or changed):
        return ""
    counts = f"{len(missing)} missing, {len(extra)} extra, {len(changed)} differ"
    lines = [f"{len(want)} rows wanted, {len(got)} got: {counts}"]
    lines += [f"missing {k}: {want[k]}" for k in missing[:limit]]
    lines += [f"extra {k}: {got[k]}" for k in extra[:limit]]
    lines += [f"differs {k}: want {want[k]} got {got[k]}" for k in changed[:limit]]
    return "\n".join(lines)
