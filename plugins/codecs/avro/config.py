"""Options of the ``avro`` codec (sinks hand over the ones they carry, e.g. from a kafka:// URI)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cdcflow.core.plugin import PluginConfig
from cdcflow.plugins.codecs.open_protocol import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["AvroConfig"]


class AvroConfig(PluginConfig):
    """How rows become Avro records, and where their schemas are registered."""

    schema_registry: str = Field(
        "",
        description=(
            "Confluent Schema Registry URL, http(s)://[user:password@]host:port; required. "
            "User and password (URL-encoded) are sent as HTTP basic auth."
        ),
    )
    schema_registry_timeout: float = Field(
        10.0, gt=0, description="Seconds to wait for one schema registry request before the write fails (2001)."
    )
    enable_tidb_extension: bool = Field(
        False, description="Add _tidb_op, _tidb_commit_ts and _tidb_commit_physical_time to inserts and updates."
    )
    avro_decimal_handling_mode: Literal["precise", "string"] = Field(
        "precise", description="DECIMAL as Avro decimal bytes with the column's precision and scale, or as string."
    )
    avro_bigint_unsigned_handling_mode: Literal["long", "string"] = Field(
        "long", description="BIGINT UNSIGNED as long (values above 2^63-1 wrap, as in TiCDC) or as decimal string."
    )
    avro_time_handling_mode: Literal["logical", "string"] = Field(
        "logical",
        description=(
            "DATE, DATETIME, TIMESTAMP and TIME as Avro logical types (date, local-timestamp-micros, "
            "timestamp-micros, time-micros) or as strings the way TiCDC writes them."
        ),
    )
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES,
        ge=1024,
        description="Largest message (key + value + record overhead); a larger row fails naming table and key.",
    )
    avro_enable_watermark: bool = Field(
        False,
        description=(
            "With enable-tidb-extension: also send DDL and resolved-ts (watermark) messages, in TiCDC's "
            "non-Avro framing (first byte 1 or 2). Confluent deserializers cannot read them; for cdcflow's "
            "own decoder and tests."
        ),
    )
