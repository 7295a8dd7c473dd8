"""A canal-json consumer for tests, written from the format's description, not from cdcflow's codec.

A canal-json message is one JSON document per row change or DDL, without a key:
``database``, ``table``, ``type`` (INSERT / UPDATE / DELETE, or a DDL type with
``isDdl: true``), ``pkNames``, ``mysqlType`` (base type names), ``data`` (the new
row, or the deleted one) and ``old`` (the whole old row of an update); every value
is text or null, binary values as ISO-8859-1 text.

Tables are rebuilt in one of two ways:

* with TiDB's extension (``enable-tidb-extension=true``) every row carries
  ``_tidb.commitTs`` and ``TIDB_WATERMARK`` events reach every partition: the
  consumer applies the recipe of the Open Protocol consumer (rows buffered per
  partition, a row at or below its partition's last watermark is a replayed
  duplicate and dropped, rows applied in commit-ts order once every partition has
  passed a watermark), and :attr:`Replica.resolved_ts` is the lowest watermark;
* without it there is no commit ts: rows are applied in offset order per
  partition. This is right when a table's rows stay in one partition (the sink's
  default ``table`` dispatch, or ``index-value``) and the topic is read after the
  writes stopped: a replay after a restart repeats a suffix of a key's changes,
  which ends in the same state. :attr:`Replica.resolved_ts` stays 0 (unknown).

Values are typed from ``mysqlType``: integers, DOUBLE/FLOAT, DECIMAL, DATE,
DATETIME/TIMESTAMP (naive; TiCDC writes TIMESTAMP in UTC), TIME as a
``timedelta``, BLOB/BINARY as bytes; everything else (VARCHAR, ENUM and SET
member names, JSON text) stays text.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.testing.open_protocol import parse_time, read_messages

__all__ = ["Replica", "decode", "read_topic", "rebuild", "typed_value"]

TableKey = tuple[str, str]

_INTEGERS = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint", "year", "bit"})
_BINARY = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, list[dict[str, Any]]]:
    """The JSON documents of every partition of ``topic``, in offset order."""
    return {
        partition: [decode(value) for _key, value in messages if value is not None]
        for partition, messages in read_messages(bootstrap, topic, timeout).items()
    }


def decode(value: bytes) -> dict[str, Any]:
    """One canal-json message."""
    doc = json.loads(value)
    assert isinstance(doc, dict) and "type" in doc, f"not a canal-json message: {value[:200]!r}"
    return doc


def typed_value(text: str | None, mysql_type: str) -> Any:
    """A canal-json value (text) as the Python value of its MySQL type (see the module docs)."""
    if text is None:
        return None
    base = mysql_type.split(" ", maxsplit=1)[0]
    try:
        if base in _INTEGERS:
            return int(text)
        if base in ("float", "double"):
            return float(text)
        if base == "decimal":
            return decimal.Decimal(text)
        if base == "date":
            return datetime.date.fromisoformat(text)
        if base in ("datetime", "timestamp"):
            return datetime.datetime.fromisoformat(text)
        if base == "time":
            return parse_time(text)
    except ValueError:
        return text  # zero dates stay text
    if base in _BINARY:
        return text.encode("latin-1")
    return text


def _row(image: dict[str, Any], types: dict[str, str]) -> dict[str, Any]:
    return {name: typed_value(value, types.get(name, "")) for name, value in image.items()}


def _key(doc: dict[str, Any], row: dict[str, Any]) -> tuple[Any, ...]:
    names = doc.get("pkNames") or sorted(row)  # a table without a primary key: the whole row
    return tuple(row.get(n) for n in names)


@dataclass
class Replica:
    """Tables rebuilt from one topic."""

    tables: dict[TableKey, dict[tuple[Any, ...], dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    ddl: list[str] = field(default_factory=list)
    #: The lowest watermark over the partitions (0 without TiDB's extension: unknown).
    resolved_ts: int = 0
    duplicates_dropped: int = 0
    rows_applied: int = 0

    def apply(self, doc: dict[str, Any]) -> None:
        table = self.tables[(doc.get("database", ""), doc.get("table", ""))]
        types = doc.get("mysqlType") or {}
        row = _row((doc.get("data") or [{}])[0], types)
        if doc["type"] == "DELETE":
            table.pop(_key(doc, row), None)
            return
        if doc["type"] == "UPDATE" and doc.get("old"):
            old = {**row, **_row(doc["old"][0], types)}
            table.pop(_key(doc, old), None)
        table[_key(doc, row)] = row
        self.rows_applied += 1


def rebuild(partitions: dict[int, list[dict[str, Any]]]) -> Replica:
    """Apply the consumer recipe of the module docs to the partitions' documents."""
    replica = Replica()
    docs = [d for items in partitions.values() for d in items]
    replica.ddl = [d.get("sql", "") for d in docs if d.get("isDdl")]
    if not any(d["type"] == "TIDB_WATERMARK" for d in docs):
        for doc in docs:  # partition by partition, in offset order
            if not doc.get("isDdl"):
                replica.apply(doc)
        return replica
    resolved = dict.fromkeys(partitions, 0)
    pending: list[tuple[int, int, int, dict[str, Any]]] = []  # (commit ts, partition, offset, document)
    for partition, items in partitions.items():
        for offset, doc in enumerate(items):
            if doc["type"] == "TIDB_WATERMARK":
                resolved[partition] = max(resolved[partition], int(doc["_tidb"]["watermarkTs"]))
                continue
            if doc.get("isDdl"):
                continue
            assert "_tidb" in doc, f"a row without _tidb.commitTs among watermarks: {doc}"
            commit_ts = int(doc["_tidb"]["commitTs"])
            if commit_ts <= resolved[partition]:
                replica.duplicates_dropped += 1
            else:
                pending.append((commit_ts, partition, offset, doc))
    replica.resolved_ts = min(resolved.values()) if resolved else 0
    for commit_ts, _partition, _offset, doc in sorted(pending, key=lambda e: e[:3]):
        if commit_ts <= replica.resolved_ts:
            replica.apply(doc)
    return replica
