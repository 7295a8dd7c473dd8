"""An initial snapshot read by Spark: one task per key range, each reading at version T.

:func:`snapshot_ranges` cuts spans into ranges — one per region (PD's current
boundaries), or, with ``range_keys``, by the region boundaries and then into
ranges of about that many keys (sampled with key-only scans) so that a few
huge regions still spread over many tasks. :class:`RangeScanTask` is the
``mapInArrow`` function that reads them: each task opens its own PD client and
:class:`~.snapshot.SnapshotReader` (region errors and locks are handled
there) and yields every key of its ranges as a raw record of the event
store's record format with commit ts and start ts T — an insert of the row as
of T. The frame it makes goes through the pipeline's mounting and sink
writes (``MountTask`` / ``WriteTask``) like any batch of raw changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cdcflow.core.data.events import Span
from cdcflow.core.data.logservice.records import SPARK_SCHEMA_DDL, raw_puts_batch
from cdcflow.core.data.source import SnapshotTask
from cdcflow.plugins.sources.tikv.channels import TLSFiles
from cdcflow.plugins.sources.tikv.pd import PDClient
from cdcflow.plugins.sources.tikv.snapshot import DEFAULT_PAGE_SIZE, SnapshotReader, region_ranges

__all__ = [
    "RANGE_SCHEMA",
    "RANGE_SCHEMA_DDL",
    "RangeScanTask",
    "SnapshotRange",
    "TiKVSnapshotTask",
    "snapshot_frame",
    "snapshot_ranges",
]

#: The rows a snapshot's Spark job starts from: one per range.
RANGE_SCHEMA = pa.schema(
    [("range_id", pa.int32()), ("span_id", pa.int32()), ("start", pa.binary()), ("end", pa.binary())]
)
RANGE_SCHEMA_DDL = "range_id INT, span_id INT, start BINARY, end BINARY"

#: Records handed to Spark at a time by a task.
_BATCH_RECORDS = 8192


@dataclass(frozen=True, slots=True)
class SnapshotRange:
    """A part ``[start, end)`` (raw keys) of the span with event-store id ``span_id``."""

    range_id: int
    span_id: int
    start: bytes
    end: bytes


async def snapshot_ranges(
    pd: PDClient, spans: Mapping[int, Span], version: int = 0, *, range_keys: int = 0
) -> list[SnapshotRange]:
    """The ranges of ``spans`` (event-store id → span): one per region, or about
    ``range_keys`` keys each when given (counted at ``version`` with key-only scans)."""
    out: list[SnapshotRange] = []
    # Cut points need no exact read: sampled keys only, locks not waited for.
    reader = SnapshotReader(pd, page_size=max(1, range_keys), keys_only=True) if range_keys else None
    try:
        for span_id, span in sorted(spans.items(), key=lambda item: item[1].start):
            for lo, hi in await region_ranges(pd, span.start, span.end):
                if reader is None:
                    out.append(SnapshotRange(len(out), span_id, lo, hi))
                    continue
                for start, end in await _by_keys(reader, lo, hi, version):
                    out.append(SnapshotRange(len(out), span_id, start, end))
    finally:
        if reader is not None:
            await reader.close()
    return out


async def _by_keys(reader: SnapshotReader, lo: bytes, hi: bytes, version: int) -> list[tuple[bytes, bytes]]:
    """``[lo, hi)`` cut after every ``reader.page_size`` keys."""
    cuts = [lo]
    async for page in reader.scan(lo, hi, version):
        if len(page) >= reader.page_size:
            cuts.append(page[-1][0] + b"\x00")
    if len(cuts) > 1 and (cuts[-1] == hi):
        cuts.pop()
    return [(a, b) for a, b in zip(cuts, [*cuts[1:], hi], strict=True)]


@dataclass(frozen=True)
class RangeScanTask:
    """``mapInArrow`` function: rows of :data:`RANGE_SCHEMA` → raw records at ``version``."""

    pd_endpoints: tuple[str, ...]
    version: int
    spans: Mapping[int, Span]
    tls: TLSFiles | None = None
    page_size: int = DEFAULT_PAGE_SIZE

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ranges = [
            SnapshotRange(int(r["range_id"]), int(r["span_id"]), r["start"], r["end"])
            for batch in batches
            for r in batch.to_pylist()
        ]
        yield from self.read(ranges)

    def read(self, ranges: Sequence[SnapshotRange]) -> Iterator[pa.RecordBatch]:
        """The raw records of ``ranges`` at ``version``, in key order, a record batch at a time."""
        if not ranges:
            return
        loop = asyncio.new_event_loop()
        try:
            pages = self._pages(ranges)
            while True:
                records = loop.run_until_complete(_next(pages))
                if records is None:
                    break
                yield records
        finally:
            loop.run_until_complete(pages.aclose())
            loop.close()

    async def _pages(self, ranges: Sequence[SnapshotRange]) -> Any:
        """Record batches of at least ``_BATCH_RECORDS`` raw puts (but a range's last)."""
        pd = PDClient(list(self.pd_endpoints), tls=self.tls)
        await pd.connect()
        reader = SnapshotReader(pd, tls=self.tls, page_size=self.page_size)
        try:
            for part in ranges:
                table_id = self.spans[part.span_id].table_id
                keys: list[bytes] = []
                values: list[bytes] = []
                async for page in reader.scan(part.start, part.end, self.version):
                    keys.extend(key for key, _ in page)
                    values.extend(value for _, value in page)
                    if len(keys) >= _BATCH_RECORDS:
                        yield raw_puts_batch(keys, values, part.span_id, table_id, self.version)
                        keys, values = [], []
                if keys:
                    yield raw_puts_batch(keys, values, part.span_id, table_id, self.version)
        finally:
            await reader.close()
            await pd.close()


@dataclass(frozen=True)
class TiKVSnapshotTask(SnapshotTask):
    """One range of an initial snapshot (the source contract's picklable part)."""

    scan: RangeScanTask
    range: SnapshotRange

    def read(self) -> Iterator[pa.RecordBatch]:
        return self.scan.read([self.range])

    def key_range(self) -> Span | None:
        span = self.scan.spans.get(self.range.span_id)
        if span is None:
            return None
        return Span(span.table_id, self.range.start, self.range.end)


async def _next(pages: Any) -> pa.RecordBatch | None:
    try:
        records: pa.RecordBatch = await pages.__anext__()
    except StopAsyncIteration:
        return None
    return records


def snapshot_frame(spark: Any, task: RangeScanTask, ranges: Sequence[SnapshotRange]) -> Any:
    """A DataFrame of the raw records of ``ranges`` at ``task.version``: one Spark task per range."""
    rows = [(r.range_id, r.span_id, bytearray(r.start), bytearray(r.end)) for r in ranges]
    frame = spark.createDataFrame(rows, RANGE_SCHEMA_DDL).repartition(max(1, len(ranges)), "range_id")
    return frame.mapInArrow(task, SPARK_SCHEMA_DDL)
