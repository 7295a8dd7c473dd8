"""The ``json`` codec: one self-describing JSON object per event.

Not a wire protocol of any other product; it exists for debugging and for
tests, where a line of JSON per change is the easiest thing to read. Values
are written so that they round-trip: decimals, dates and times as strings,
bytes as base64.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from cdcflow.core.data.codec import Codec, EncodedMessage
from cdcflow.core.data.events import DDLEvent, RowChange
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl

__all__ = ["JsonCodec", "JsonCodecConfig", "json_value"]


def json_value(value: Any) -> Any:
    """A JSON-able form of a row value."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    return str(value)


def _image(image: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if image is None:
        return None
    return {name: json_value(v) for name, v in image.items()}


class JsonCodecConfig(PluginConfig):
    """Options of the json codec."""

    include_before: bool = Field(True, description="Write the old image of updates and deletes.")


class JsonCodec(Codec[JsonCodecConfig]):
    """One JSON object per row change, DDL and resolved ts (for debugging and tests)."""

    type_name = "json"
    Config = JsonCodecConfig
    file_extension = "jsonl"

    def encode_rows(self, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        out = []
        for row in rows:
            doc: dict[str, Any] = {
                "type": "row",
                "op": row.op.value,
                "schema": row.table.schema,
                "table": row.table.table,
                "commit_ts": row.commit_ts,
                "start_ts": row.start_ts,
                "after": _image(row.after),
            }
            if self.config.include_before:
                doc["before"] = _image(row.before)
            value = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
            out.append(EncodedMessage(None, value, row.table, 1, row.commit_ts))
        return out

    def encode_ddl(self, ddl: DDLEvent) -> EncodedMessage:
        doc = {
            "type": "ddl",
            "commit_ts": ddl.commit_ts,
            "query": ddl.query,
            "schema": ddl.table.schema if ddl.table else None,
            "table": ddl.table.table if ddl.table else None,
            "action_type": ddl.action_type,
        }
        return EncodedMessage(None, json.dumps(doc, sort_keys=True).encode(), ddl.table, 0, ddl.commit_ts)

    def encode_resolved(self, ts: int) -> EncodedMessage:
        return EncodedMessage(None, json.dumps({"type": "resolved", "ts": ts}).encode(), None, 0, ts)


@hookimpl
def cdcflow_register_codecs(registry: Registrar[Codec[Any]]) -> None:
    registry.add(JsonCodec)
