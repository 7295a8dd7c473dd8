"""An Open Protocol consumer for tests, written independently of cdcflow's codec.

It reads every partition of a topic from the start and rebuilds tables with
the recipe TiCDC documents for Open Protocol consumers:

* buffer row events per partition;
* a row whose commit ts is at or below its partition's last resolved ts is a
  duplicate from a replay: drop it;
* when every partition has passed resolved ts T, apply the buffered rows
  with commit ts ≤ T in commit-ts order (stable within a partition);
* DDL events are collected (they reach every partition).

Only the standard library and confluent-kafka are used: framing, JSON and
value decoding are re-implemented here from the protocol description.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, TopicPartition

TableKey = tuple[str, str]


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    """Every (key, value) of every partition of ``topic``, in offset order, as the broker has
    them (a key or value may be absent: canal-json watermarks have no key, Avro deletes no value)."""
    return read_messages(bootstrap, topic, timeout)


def read_messages(
    bootstrap: str, topic: str, timeout: float = 30.0
) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    """Every (key or None, value or None) of every partition of ``topic``, in offset order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{topic}", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=timeout)
        partitions = sorted(meta.topics[topic].partitions)
        marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout) for p in partitions}
        trimmed = {p: low for p, (low, _) in marks.items() if low > 0}
        assert not trimmed, f"{topic}: the broker no longer has the first messages (log start offsets {trimmed})"
        ends = {p: high for p, (_, high) in marks.items()}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        out: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in partitions}
        remaining = sum(ends.values())
        while remaining:
            msg = consumer.poll(timeout)
            assert msg is not None, f"timed out reading {topic}: {remaining} messages left"
            assert msg.error() is None, msg.error()
            partition, key, value = msg.partition(), msg.key(), msg.value()
            assert partition is not None, "a message without partition"
            out[partition].append((key, value))
            remaining -= 1
        return out
    finally:
        consumer.close()


def frames(data: bytes) -> list[bytes]:
    items, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack(">Q", data[pos : pos + 8])
        items.append(data[pos + 8 : pos + 8 + n])
        pos += 8 + n
    assert pos == len(data), "trailing bytes in an Open Protocol frame"
    return items


def decode(key: bytes | None, value: bytes | None) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(key JSON, value JSON or None) pairs of one message."""
    assert key is not None, "an Open Protocol message without key"
    (version,) = struct.unpack(">Q", key[:8])
    assert version == 1, f"unexpected Open Protocol version {version}"
    keys = [json.loads(k) for k in frames(key[8:])]
    values = frames(value or b"")
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for i, k in enumerate(keys):
        if k["t"] == 3:
            out.append((k, None))
        else:
            out.append((k, json.loads(values[i])))
    return out


_GO_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}


def unquote_go(text: str) -> bytes:
    out, i = bytearray(), 0
    while i < len(text):
        if text[i] != "\\":
            out += text[i].encode()
            i += 1
        elif text[i + 1] == "x":
            out.append(int(text[i + 2 : i + 4], 16))
            i += 4
        elif text[i + 1] in "uU":
            n = 4 if text[i + 1] == "u" else 8
            out += chr(int(text[i + 2 : i + 2 + n], 16)).encode()
            i += 2 + n
        else:
            out.append(_GO_ESCAPES[text[i + 1]])
            i += 2
    return bytes(out)


def parse_time(text: str) -> datetime.timedelta:
    sign = -1 if text.startswith("-") else 1
    h, m, s = text.lstrip("-").split(":")
    whole, _, frac = s.partition(".")
    micro = int(frac.ljust(6, "0")) if frac else 0
    return sign * datetime.timedelta(hours=int(h), minutes=int(m), seconds=int(whole), microseconds=micro)


def column_value(col: dict[str, Any]) -> Any:
    t, f, v = col["t"], col.get("f", 0), col["v"]
    if v is None:
        return None
    try:
        if t in (10, 14):
            return datetime.date.fromisoformat(v)
        if t == 12:
            return datetime.datetime.fromisoformat(v)
        if t == 7:  # TIMESTAMP, written in UTC
            return datetime.datetime.fromisoformat(v).replace(tzinfo=datetime.UTC)
        if t == 11:
            return parse_time(v)
    except ValueError:
        return v  # zero dates stay text
    if t in (0, 246):
        return decimal.Decimal(v)
    if t in (4, 5):
        return float(v)
    if t in (249, 250, 251, 252):
        data = base64.b64decode(v)
        return data if f & 1 else data.decode()
    if t in (15, 253, 254) and f & 1:
        return unquote_go(v)
    return v


def handle_key(image: dict[str, Any]) -> tuple[Any, ...]:
    names = sorted(n for n, c in image.items() if c.get("h") or c.get("f", 0) & 2)
    assert names, f"row without handle-key columns: {image}"
    return tuple(column_value(image[n]) for n in names)


def row_values(image: dict[str, Any]) -> dict[str, Any]:
    return {n: column_value(c) for n, c in image.items()}


@dataclass
class Replica:
    """Tables rebuilt from one topic."""

    tables: dict[TableKey, dict[tuple[Any, ...], dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    ddl: list[tuple[int, str]] = field(default_factory=list)
    resolved_ts: int = 0
    duplicates_dropped: int = 0
    rows_applied: int = 0

    def apply(self, key: dict[str, Any], value: dict[str, Any]) -> None:
        table = self.tables[(key.get("scm", ""), key.get("tbl", ""))]
        if "d" in value:
            table.pop(handle_key(value["d"]), None)
            return
        if "p" in value:
            table.pop(handle_key(value["p"]), None)
        table[handle_key(value["u"])] = row_values(value["u"])
        self.rows_applied += 1


def rebuild(partitions: dict[int, list[tuple[bytes | None, bytes | None]]]) -> Replica:
    """Apply the consumer recipe to the partitions' messages."""
    replica = Replica()
    events = {p: [e for k, v in msgs for e in decode(k, v)] for p, msgs in partitions.items()}
    cursor = dict.fromkeys(events, 0)
    resolved = dict.fromkeys(events, 0)
    pending: dict[int, list[tuple[dict[str, Any], dict[str, Any]]]] = {p: [] for p in events}
    ddl_seen: set[tuple[int, str]] = set()
    while True:
        progressed = False
        for p, items in events.items():
            # read partition p up to and including its next resolved event
            while cursor[p] < len(items):
                key, value = items[cursor[p]]
                cursor[p] += 1
                progressed = True
                if key["t"] == 3:
                    resolved[p] = max(resolved[p], key["ts"])
                    break
                if key["t"] == 2:
                    assert value is not None
                    ddl_seen.add((key["ts"], value["q"]))
                elif key["ts"] <= resolved[p]:
                    replica.duplicates_dropped += 1
                else:
                    assert value is not None
                    pending[p].append((key, value))
        watermark = min(resolved.values())
        if watermark > replica.resolved_ts:
            ready = [
                (k["ts"], p, n, k, v) for p in pending for n, (k, v) in enumerate(pending[p]) if k["ts"] <= watermark
            ]
            for _ts, _p, _n, k, v in sorted(ready, key=lambda e: (e[0], e[1], e[2])):
                replica.apply(k, v)
            for p, rows in list(pending.items()):
                pending[p] = [(k, v) for k, v in rows if k["ts"] > watermark]
            replica.resolved_ts = watermark
        if not progressed:
            break
    replica.ddl = sorted(ddl_seen)
    return replica
