"""The ``cdcflow`` Spark data source: a changefeed's resolved chunks as a stream.

Registered with ``spark.dataSource.register(CdcflowDataSource)`` and read with
``spark.readStream.format("cdcflow").option("path", <event-store dir>)``.

* **offset** = ``{"resolved_ts": T}``: the changefeed's published resolved ts
  (the span frontier, capped at DDL and maintainer barriers);
* ``latestOffset(start)`` never passes the first DDL barrier above ``start``,
  so a DDL always ends a micro-batch;
* ``partitions(start, end)`` = one partition per resolved chunk published in
  ``(start, end]``; ``read`` yields the chunk's Arrow record batches.

Spark runs these methods in Python processes of its own (the streaming source
runner and the Python workers), not in the capture's process; they reach the
event store only through its files: the manifest, written atomically after
the chunks it names. In local mode those are the capture's own files; on a
cluster the store's directory (``server.data-dir``) must be on storage that
the driver and every executor mount at the same path (NFS, a shared volume).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from cdcflow.core.logservice.manifest import read_manifest
from cdcflow.core.logservice.records import SPARK_SCHEMA_DDL, read_record_batches

__all__ = ["OFFSET_KEY", "CdcflowDataSource", "CdcflowStreamReader", "ChunkPartition", "offset_ts"]

OFFSET_KEY = "resolved_ts"


def offset_ts(offset: dict[str, Any]) -> int:
    """The resolved ts of a ``cdcflow`` source offset."""
    return int(offset[OFFSET_KEY])


class ChunkPartition(InputPartition):
    """One resolved chunk file (absolute path)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class CdcflowDataSource(DataSource):
    """A changefeed's event store as a streaming source. Option ``path``: the store directory."""

    @classmethod
    def name(cls) -> str:
        return "cdcflow"

    def schema(self) -> str:
        return SPARK_SCHEMA_DDL

    def streamReader(self, schema: Any) -> CdcflowStreamReader:
        path = self.options.get("path")
        if not path:
            raise ValueError("the cdcflow data source needs option 'path' (the changefeed's event-store directory)")
        return CdcflowStreamReader(Path(path))


class CdcflowStreamReader(DataSourceStreamReader):
    """Offsets and partitions from the event store's manifest."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _manifest(self) -> Any:
        manifest = read_manifest(self.directory)
        if manifest is None:
            raise FileNotFoundError(f"no event store at {self.directory} (manifest.json missing)")
        return manifest

    def initialOffset(self) -> dict[str, int]:
        # A new query starts at the changefeed's checkpoint: everything above it
        # that the store has published is still there.
        return {OFFSET_KEY: int(self._manifest().checkpoint_ts)}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, int]:
        manifest = self._manifest()
        begin = offset_ts(start)
        end = max(begin, int(manifest.published_ts))
        barriers = [ts for ts in manifest.ddl_ts if begin < ts <= end]
        return {OFFSET_KEY: min(barriers, default=end)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[ChunkPartition]:
        begin, stop = offset_ts(start), offset_ts(end)
        chunks = self._manifest().chunks
        return [ChunkPartition(str(self.directory / c.file)) for c in chunks if begin < c.hi <= stop]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_record_batches(partition.value)

    def commit(self, end: dict[str, Any]) -> None:
        # Chunks are released by the pipeline once the next batch starts (the
        # capture's process owns the store); nothing to do here.
        return None
