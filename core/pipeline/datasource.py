"""The ``cdcflow`` Spark data source: a changefeed's resolved chunks as a stream.

Registered with ``spark.dataSource.register(CdcflowDataSource)`` and read with
``spark.readStream.format("cdcflow").option("path", <event-store dir>)``.

* **offset** = ``{"resolved_ts": T}``: the changefeed's published resolved ts
  (the span frontier, capped at DDL and maintainer barriers);
* ``latestOffset(start)`` never passes the first DDL barrier above ``start``,
  so a DDL always ends a micro-batch;
* ``partitions(start, end)`` = the resolved chunks published in ``(start, end]``,
  packed into partitions of about ``partitionRows`` rows (option; default
  131072) because every Spark task costs a Python worker round trip; ``read``
  yields the chunks' Arrow record batches.

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

__all__ = [
    "DEFAULT_PARTITION_ROWS",
    "OFFSET_KEY",
    "CdcflowDataSource",
    "CdcflowStreamReader",
    "ChunkPartition",
    "offset_ts",
]

OFFSET_KEY = "resolved_ts"


def offset_ts(offset: dict[str, Any]) -> int:
    """The resolved ts of a ``cdcflow`` source offset."""
    return int(offset[OFFSET_KEY])


#: Rows per Spark partition when the option ``partitionRows`` is not given.
DEFAULT_PARTITION_ROWS = 131_072


class ChunkPartition(InputPartition):
    """Some resolved chunk files (absolute paths), read in order."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__(paths)


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
        rows = int(self.options.get("partitionRows", DEFAULT_PARTITION_ROWS))
        return CdcflowStreamReader(Path(path), rows)


class CdcflowStreamReader(DataSourceStreamReader):
    """Offsets and partitions from the event store's manifest."""

    def __init__(self, directory: Path, partition_rows: int = DEFAULT_PARTITION_ROWS) -> None:
        self.directory = directory
        self.partition_rows = max(1, partition_rows)

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
        partitions: list[ChunkPartition] = []
        paths: list[str] = []
        rows = 0
        for chunk in self._manifest().chunks:
            if begin < chunk.hi <= stop:
                paths.append(str(self.directory / chunk.file))
                rows += chunk.rows
                if rows >= self.partition_rows:
                    partitions.append(ChunkPartition(paths))
                    paths, rows = [], 0
        if paths:
            partitions.append(ChunkPartition(paths))
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for path in partition.value:
            yield from read_record_batches(path)

    def commit(self, end: dict[str, Any]) -> None:
        # Chunks are released by the pipeline once the next batch starts (the
        # capture's process owns the store); nothing to do here.
        return None
