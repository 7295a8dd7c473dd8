"""The ``cdcflow`` Spark data source: a changefeed's resolved chunks as a stream.

Registered with ``spark.dataSource.register(CdcflowDataSource)`` and read with
``spark.readStream.format("cdcflow").option("path", <event-store dir>)``.

* **offset** = ``{"resolved_ts": T, "chunk": N}``: the changefeed's published
  resolved ts (the span frontier, capped at DDL and maintainer barriers) and
  the sequence number of the first chunk not yet covered. Chunks are read in
  sequence order, not by ts: a span that joins the changefeed behind its
  published ts is caught up by chunks labelled with that same ts, and only
  the sequence number tells a reader they are new (an offset without
  ``chunk``, as written by older versions, is read by ts);
* ``latestOffset(start)`` never passes the first DDL barrier above ``start``,
  so a DDL always ends a micro-batch, and stops at the last cut that keeps the
  batch within ``maxBatchRows`` rows (option; default 100000; at least one
  cut): the event store publishes a large resolved interval as several cuts,
  so a catch-up is a series of bounded batches and the checkpoint moves after
  each;
* ``partitions(start, end)`` = the resolved chunks numbered in ``[start, end)``,
  packed into partitions of about ``partitionRows`` rows (option; default
  131072) because every Spark task costs a Python worker round trip; ``read``
  yields the chunks' Arrow record batches. When that makes fewer partitions than
  ``minPartitions`` (option; the pipeline gives Spark's default parallelism) and
  the batch holds enough rows (:data:`MIN_SPLIT_ROWS` per partition), the
  chunks' record batches are dealt into ``minPartitions`` contiguous ranges
  instead, so that a batch of one chunk is read, and its rows worked on, by
  every core.

Spark runs these methods in Python processes of its own (the streaming source
runner and the Python workers), not in the capture's process; they reach the
event store only through its files: the manifest, written atomically after
the chunks it names. In local mode those are the capture's own files; on a
cluster the store's directory (``server.data-dir``) must be on storage that
the driver and every executor mount at the same path (NFS, a shared volume).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from cdcflow.core.config.settings import DEFAULT_MAX_BATCH_ROWS
from cdcflow.core.data.logservice.manifest import Manifest, read_manifest
from cdcflow.core.data.logservice.records import SPARK_SCHEMA_DDL, read_record_batches, record_batch_rows
from cdcflow.core.data.logservice.store import DEFAULT_CHUNK_ROWS

__all__ = [
    "DEFAULT_PARTITION_ROWS",
    "OFFSET_KEY",
    "CdcflowDataSource",
    "CdcflowStreamReader",
    "ChunkPartition",
    "PlannerWarmup",
    "offset_chunk",
    "offset_ts",
    "split_record_batches",
]

OFFSET_KEY = "resolved_ts"
CHUNK_KEY = "chunk"


def offset_ts(offset: dict[str, Any]) -> int:
    """The resolved ts of a ``cdcflow`` source offset."""
    return int(offset[OFFSET_KEY])


def offset_chunk(offset: dict[str, Any], manifest: Manifest) -> int:
    """The first chunk sequence number an offset does not cover.

    An offset without it (older versions) covers the chunks labelled at or
    below its ts."""
    if CHUNK_KEY in offset:
        return int(offset[CHUNK_KEY])
    ts = offset_ts(offset)
    return min((c.seq for c in manifest.chunks if c.hi > ts), default=manifest.next_chunk)


#: Rows per Spark partition when the option ``partitionRows`` is not given: a full chunk's.
DEFAULT_PARTITION_ROWS = DEFAULT_CHUNK_ROWS


#: Rows a partition must get at least for a batch's chunks to be split by record batch
#: (a chunk's record batch holds 8,192).
MIN_SPLIT_ROWS = 8_192


def split_record_batches(paths: Sequence[str], parts: int) -> list[list[tuple[str, int, int]]]:
    """The record batches of the files ``paths`` dealt in order into ``parts`` contiguous
    shares of about as many rows each (fewer shares when there are fewer batches), each a
    list of ``(path, first, stop)``: record batches ``first`` up to ``stop`` (excluded) of
    a file. A file is the event store's chunk (Arrow IPC), or, named ``*.parquet``, an
    initial snapshot's part, whose row groups are its batches.

    Shares are cut by rows, not by batches: a chunk's last batch holds what was left of
    its span's rows, so batches differ in size. Rows, not bytes: a task's time follows its
    rows (about 20 µs each on the shop workload's rows, whatever their width)."""
    batches: list[tuple[str, int]] = []
    ends: list[int] = []  # rows of the batches up to and including each
    total = 0
    for path in paths:
        for i, rows in enumerate(record_batch_rows(path)):
            batches.append((path, i))
            total += rows
            ends.append(total)
    cuts = [0]
    for n in range(1, parts):
        target = total * n / parts
        # The batch boundary nearest the target (the earlier one on a tie), after the last cut.
        k = bisect.bisect_left(ends, target) + 1  # cut after batch k - 1: ends[k - 1] ≥ target
        if k > 1 and target - ends[k - 2] <= ends[k - 1] - target:
            k -= 1
        cuts.append(min(max(k, cuts[-1]), len(batches)))
    cuts.append(len(batches))
    out: list[list[tuple[str, int, int]]] = []
    for start, stop in itertools.pairwise(cuts):
        ranges: list[tuple[str, int, int]] = []
        for path, i in batches[start:stop]:
            if ranges and ranges[-1][0] == path and ranges[-1][2] == i:
                ranges[-1] = (path, ranges[-1][1], i + 1)
            else:
                ranges.append((path, i, i + 1))
        if ranges:
            out.append(ranges)
    return out


class ChunkPartition(InputPartition):
    """Some resolved chunk files (absolute paths), read in order: each a whole file, or
    ``(path, first, stop)``: its record batches ``first`` up to ``stop`` (excluded)."""

    def __init__(self, paths: list[str] | list[tuple[str, int, int]]) -> None:
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
        batch_rows = int(self.options.get("maxBatchRows", DEFAULT_MAX_BATCH_ROWS))
        least = int(self.options.get("minPartitions", 1))
        return CdcflowStreamReader(Path(path), rows, batch_rows, least)


class CdcflowStreamReader(DataSourceStreamReader):
    """Offsets and partitions from the event store's manifest."""

    def __init__(
        self,
        directory: Path,
        partition_rows: int = DEFAULT_PARTITION_ROWS,
        max_batch_rows: int = 0,
        min_partitions: int = 1,
        min_split_rows: int = MIN_SPLIT_ROWS,
    ) -> None:
        self.directory = directory
        self.partition_rows = max(1, partition_rows)
        #: Rows a micro-batch may hold, at least one cut (0: no bound).
        self.max_batch_rows = max_batch_rows
        #: Partitions a batch of enough rows is split into at least (by record batch).
        self.min_partitions = max(1, min_partitions)
        self.min_split_rows = max(1, min_split_rows)

    def _manifest(self) -> Any:
        manifest = read_manifest(self.directory)
        if manifest is None:
            raise FileNotFoundError(f"no event store at {self.directory} (manifest.json missing)")
        return manifest

    def initialOffset(self) -> dict[str, int]:
        # A new query starts at the changefeed's checkpoint: everything above it
        # that the store has published is still there.
        manifest = self._manifest()
        checkpoint = int(manifest.checkpoint_ts)
        return {OFFSET_KEY: checkpoint, CHUNK_KEY: offset_chunk({OFFSET_KEY: checkpoint}, manifest)}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, int]:
        manifest = self._manifest()
        begin = offset_ts(start)
        first = offset_chunk(start, manifest)
        end = max(begin, int(manifest.published_ts))
        barriers = [ts for ts in manifest.ddl_ts if begin < ts <= end]
        if not barriers:
            offset = {OFFSET_KEY: end, CHUNK_KEY: max(first, manifest.next_chunk)}
        else:
            barrier = min(barriers)
            # Chunks are published in ts order (catch-up chunks carry the published ts
            # then), so the chunks up to the barrier are a prefix of the sequence.
            below = [c.seq + 1 for c in manifest.chunks if c.seq >= first and c.hi <= barrier]
            offset = {OFFSET_KEY: barrier, CHUNK_KEY: max([first, *below])}
        return self._bounded(manifest, begin, first, offset)

    def _bounded(self, manifest: Manifest, begin: int, first: int, offset: dict[str, int]) -> dict[str, int]:
        """``offset``, or an earlier cut's end when the chunks up to it hold more than
        ``max_batch_rows`` rows; at least the first cut after ``begin`` is taken."""
        if self.max_batch_rows <= 0:
            return offset
        chunks = sorted((c for c in manifest.chunks if first <= c.seq < offset[CHUNK_KEY]), key=lambda c: c.seq)
        rows, end = 0, None
        for n, chunk in enumerate(chunks):
            rows += chunk.rows
            # Chunks of one cut end a batch together (the offset's ts is the cut's);
            # catch-up chunks (``lo == hi``: a span that joined behind the published ts)
            # may end a batch one by one, the first batch's too: the ts stays, the chunk
            # number moves on, and that span's checkpoint follows its catch-up.
            following = chunks[n + 1] if n + 1 < len(chunks) else None
            last_of_cut = (
                following is None
                or following.hi != chunk.hi
                or following.lo == following.hi
                or chunk.lo == chunk.hi
                or chunk.hi <= begin
            )
            if not last_of_cut:
                continue
            if rows > self.max_batch_rows and end is not None:
                break  # this cut would overfill the batch; it opens the next one
            end = {OFFSET_KEY: max(begin, chunk.hi), CHUNK_KEY: chunk.seq + 1}
            if rows >= self.max_batch_rows:
                break
        if end is None or end[CHUNK_KEY] >= offset[CHUNK_KEY]:
            return offset
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[ChunkPartition]:
        manifest = self._manifest()
        first, stop = offset_chunk(start, manifest), offset_chunk(end, manifest)
        chunks = [c for c in sorted(manifest.chunks, key=lambda c: c.seq) if first <= c.seq < stop]
        total = sum(c.rows for c in chunks)
        partitions: list[ChunkPartition] = []
        paths: list[str] = []
        rows = 0
        for chunk in chunks:
            paths.append(str(self.directory / chunk.file))
            rows += chunk.rows
            if rows >= self.partition_rows:
                partitions.append(ChunkPartition(paths))
                paths, rows = [], 0
        if paths:
            partitions.append(ChunkPartition(paths))
        parts = min(self.min_partitions, total // self.min_split_rows)
        if len(partitions) < parts:
            return self._split([str(self.directory / c.file) for c in chunks], parts) or partitions
        return partitions

    @staticmethod
    def _split(paths: list[str], parts: int) -> list[ChunkPartition]:
        return [ChunkPartition(ranges) for ranges in split_record_batches(paths, parts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for part in partition.value:
            if isinstance(part, str):
                yield from read_record_batches(part)
            else:
                path, first, stop = part
                yield from read_record_batches(path, first, stop)

    def commit(self, end: dict[str, Any]) -> None:
        # Chunks are released by the pipeline once the next batch starts (the
        # capture's process owns the store); nothing to do here.
        return None


class PlannerWarmup(DataSource):
    """A data source of no rows, read once as the capture's Spark starts (see
    :func:`~cdcflow.core.data.pipeline.session.warm_python_workers`).

    Spark plans every Python data source read, a stream's first micro-batch too, in a
    Python process it forks from a daemon of its own (one per kind of planning step),
    started on first use; with the task modules it imports, that start took 1.2 to
    1.5 s of each catch-up's first batch. Reading this source at start-up starts that
    daemon; the first batch of every changefeed's query then forks from it."""

    @classmethod
    def name(cls) -> str:
        return "cdcflow_planner_warmup"

    def schema(self) -> str:
        return "id long"

    def reader(self, schema: Any) -> DataSourceReader:
        return _NoRows()


class _NoRows(DataSourceReader):
    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return iter(())
