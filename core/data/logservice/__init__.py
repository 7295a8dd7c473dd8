"""The log service's event store: sorted, bounded-memory buffers of a changefeed's
events that publish resolved chunks for the Spark pipeline (ARCHITECTURE.md, "Log service")."""

from cdcflow.core.data.logservice.manifest import ChunkInfo, Manifest, read_manifest
from cdcflow.core.data.logservice.records import ARROW_SCHEMA, SPARK_SCHEMA_DDL, SchemaRegistry, event_from_record
from cdcflow.core.data.logservice.store import DEFAULT_CHUNK_ROWS, EventStore, StoreStats

__all__ = [
    "ARROW_SCHEMA",
    "DEFAULT_CHUNK_ROWS",
    "SPARK_SCHEMA_DDL",
    "ChunkInfo",
    "EventStore",
    "Manifest",
    "SchemaRegistry",
    "StoreStats",
    "event_from_record",
    "read_manifest",
]
