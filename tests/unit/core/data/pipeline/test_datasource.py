"""The data source's offsets and partitions, read from a real event store's files."""

from cdcflow.core.data.events import DDLEvent, RawKVEvent, Span, TableName
from cdcflow.core.data.logservice import EventStore
from cdcflow.core.data.logservice.records import ARROW_SCHEMA
from cdcflow.core.data.pipeline.datasource import CdcflowDataSource, CdcflowStreamReader

SPAN = Span(1, b"a", b"b")


def offset(ts, chunk=None):
    return {"resolved_ts": ts} if chunk is None else {"resolved_ts": ts, "chunk": chunk}


def store_with_ddl(tmp_path):
    store = EventStore(tmp_path, "cf", start_ts=5, fsync=False, chunk_rows=2)
    store.add_span(SPAN, 5, replicating=True)
    for ts in range(10, 60, 5):
        store.put(SPAN, RawKVEvent(SPAN, b"k%d" % ts, b"v", b"", ts - 1, ts))
    store.put_ddl(DDLEvent(30, "alter table t add c int", TableName("s", "t", 1)))
    store.resolve(SPAN, 50)
    return store


def test_offsets_start_at_the_checkpoint_and_stop_at_each_ddl_barrier(tmp_path):
    store_with_ddl(tmp_path)
    reader = CdcflowStreamReader(tmp_path)
    # Chunks of 2 rows: 10,15 | 20,25 | 30 (cut at the DDL) | 35,40 | 45,50.
    assert reader.initialOffset() == offset(5, 0)
    assert reader.latestOffset(offset(5, 0), None) == offset(30, 3)
    assert reader.latestOffset(offset(30, 3), None) == offset(50, 5)
    assert reader.latestOffset(offset(50, 5), None) == offset(50, 5)
    # Offsets logged before chunk numbers existed are read by ts.
    assert reader.latestOffset(offset(5), None) == offset(30, 3)
    assert reader.latestOffset(offset(30), None) == offset(50, 5)


def test_partitions_pack_the_chunks_of_the_range_and_read_yields_arrow_batches(tmp_path):
    store = store_with_ddl(tmp_path)
    reader = CdcflowStreamReader(tmp_path, partition_rows=3)
    parts = reader.partitions(offset(5), offset(30))
    assert [len(p.value) for p in parts] == [2, 1]  # chunks of 2, 2, 1 rows packed to >= 3 rows
    batches = [b for p in parts for b in reader.read(p)]
    assert all(b.schema == ARROW_SCHEMA for b in batches)
    assert [ts for b in batches for ts in b.column("commit_ts").to_pylist()] == [10, 15, 20, 25, 30]
    later = reader.partitions(offset(30), offset(50))
    assert [ts for p in later for b in reader.read(p) for ts in b.column("commit_ts").to_pylist()] == [35, 40, 45, 50]
    store.release(30)
    assert reader.partitions(offset(5), offset(30)) == []


def test_data_source_requires_the_store_path():
    source = CdcflowDataSource({})
    assert CdcflowDataSource.name() == "cdcflow"
    try:
        source.streamReader(None)
    except ValueError as exc:
        assert "path" in str(exc)
    else:
        raise AssertionError("expected a ValueError")


def test_a_batch_of_few_chunks_is_split_by_record_batch_into_a_partition_per_core(tmp_path):
    """One chunk of 12 rows in record batches of 2: with ``min_partitions`` 3 (and at least
    2 rows per partition) it is read as 3 contiguous ranges, every row once, in order."""
    store = EventStore(tmp_path, "cf", start_ts=5, fsync=False, chunk_rows=100, batch_rows=2)
    store.add_span(SPAN, 5, replicating=True)
    for ts in range(10, 70, 5):
        store.put(SPAN, RawKVEvent(SPAN, b"k%d" % ts, b"v", b"", ts - 1, ts))
    store.resolve(SPAN, 70)
    whole = CdcflowStreamReader(tmp_path).partitions(offset(5), offset(70, 1))
    assert len(whole) == 1 and len(whole[0].value) == 1  # the one chunk, one partition

    reader = CdcflowStreamReader(tmp_path, min_partitions=3, min_split_rows=2)
    parts = reader.partitions(offset(5), offset(70, 1))
    assert [[(first, stop) for _, first, stop in p.value] for p in parts] == [[(0, 2)], [(2, 4)], [(4, 6)]]
    read = [ts for p in parts for b in reader.read(p) for ts in b.column("commit_ts").to_pylist()]
    assert read == list(range(10, 70, 5))
    # Fewer partitions when there are too few rows for one each; whole below two.
    few = CdcflowStreamReader(tmp_path, min_partitions=3, min_split_rows=5)
    assert len(few.partitions(offset(5), offset(70, 1))) == 2
    assert (
        len(CdcflowStreamReader(tmp_path, min_partitions=3, min_split_rows=13).partitions(offset(5), offset(70, 1)))
        == 1
    )


def test_a_task_reads_its_share_of_the_chunk_files_itself(tmp_path):
    """ChunkRangesTask: the task of ``spark.range`` row i gets the record batches of share
    i, read from the chunk files, in order, as the data source would have read them."""
    import pyarrow as pa

    from cdcflow.core.data.pipeline.datasource import split_record_batches
    from cdcflow.core.data.pipeline.tasks import ChunkRangesTask

    store = store_with_ddl(tmp_path)  # chunks of 2, 2, 1, 2, 2 rows; one record batch each
    files = [str(tmp_path / c.file) for c in store.chunks_in(0, 5)]
    shares = tuple(tuple(s) for s in split_record_batches(files, 2))
    assert [len(s) for s in shares] == [2, 3]  # five record batches dealt in order

    seen: list[list[int]] = []

    def task(batches):
        got = [ts for b in batches for ts in b.column("commit_ts").to_pylist()]
        seen.append(got)
        yield pa.RecordBatch.from_pylist([{"rows": len(got)}])

    reader = CdcflowStreamReader(tmp_path)
    for i in range(2):
        ids = pa.RecordBatch.from_pylist([{"id": i}])  # what spark.range(2, numPartitions=2) gives task i
        out = list(ChunkRangesTask(shares, task)(iter([ids])))
        assert out[0].column("rows").to_pylist() == [len(seen[-1])]
    assert seen == [[10, 15, 20, 25], [30, 35, 40, 45, 50]]
    # The same records, in the same order, as the data source's read of the whole range.
    whole = [
        ts
        for p in reader.partitions(offset(5), offset(50, 5))
        for b in reader.read(p)
        for ts in b.column("commit_ts").to_pylist()
    ]
    assert [ts for share in seen for ts in share] == whole


def test_shares_are_cut_by_rows_not_by_record_batch_count(tmp_path):
    """A chunk's last record batch holds what was left of its span's rows: shares dealt by
    batch count would give one task most of the rows. They are cut at the batch boundary
    nearest an equal share of the rows."""
    import pyarrow as pa

    from cdcflow.core.data.logservice.records import record_batch_rows, record_from_event, records_to_batch
    from cdcflow.core.data.pipeline.datasource import split_record_batches

    class NoIds:
        def id_of(self, schema):
            return -1

    def chunk(name, sizes):
        path = tmp_path / name
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, ARROW_SCHEMA) as writer:
            for rows in sizes:
                events = [RawKVEvent(SPAN, b"k%d" % t, b"v" * 100, b"", t, t) for t in range(rows)]
                writer.write_batch(records_to_batch([record_from_event(e, 1, NoIds()) for e in events]))
        return str(path)

    # Five spans' chunks of a batch: three spans with a few rows, two with many.
    files = [chunk(f"{n}.arrow", [rows]) for n, rows in enumerate([2, 3, 1, 64, 64])]
    assert [rows for path in files for rows in record_batch_rows(path)] == [2, 3, 1, 64, 64]
    # By count, the first task would get 5 rows and the second 129. By size: 70 and 64.
    assert split_record_batches(files, 2) == [[(path, 0, 1) for path in files[:4]], [(files[4], 0, 1)]]
    # Cut where the rows are, into no empty share: a big batch between two small ones, in three.
    files = [chunk("c.arrow", [2, 200, 2])]
    shares = split_record_batches(files, 3)
    assert shares == [[(files[0], 0, 1)], [(files[0], 1, 2)], [(files[0], 2, 3)]]
    assert split_record_batches(files, 1) == [[(files[0], 0, 3)]]


def test_an_initial_snapshots_parquet_parts_are_shared_by_row_group(tmp_path):
    """Snapshot part files (Parquet, one row group per page read) are dealt by row group
    and read back with the event store's record schema, every record once, in order."""
    import pyarrow.parquet as pq

    from cdcflow.core.data.logservice.records import read_record_batches, record_from_event, records_to_batch
    from cdcflow.core.data.pipeline.datasource import split_record_batches

    class NoIds:
        def id_of(self, schema):
            return -1

    files = []
    for part in range(2):
        path = tmp_path / f"part-{part:08d}-6.parquet"
        with pq.ParquetWriter(path, ARROW_SCHEMA) as writer:
            for page in range(3):
                ts = [100 * part + 10 * page + i for i in range(2)]
                events = [RawKVEvent(SPAN, b"k%d" % t, b"v", b"", t, t) for t in ts]
                writer.write_batch(records_to_batch([record_from_event(e, 1, NoIds()) for e in events]))
        files.append(str(path))
    shares = split_record_batches(files, 4)  # six row groups of two rows: 1, 2, 1 and 2 of them
    assert shares == [[(files[0], 0, 1)], [(files[0], 1, 3)], [(files[1], 0, 1)], [(files[1], 1, 3)]]
    read = [
        batch for share in shares for path, first, stop in share for batch in read_record_batches(path, first, stop)
    ]
    assert all(b.schema == ARROW_SCHEMA for b in read)
    assert [ts for b in read for ts in b.column("commit_ts").to_pylist()] == [
        0,
        1,
        10,
        11,
        20,
        21,
        100,
        101,
        110,
        111,
        120,
        121,
    ]


def test_tasks_reading_chunks_leave_out_rows_the_table_filter_leaves_out(tmp_path):
    """What the streaming query's table predicate does to the data source's frame, the
    task does to the chunks it reads: row records of tables the filter refuses (and of
    system schemas) are left out, raw records (tables known only once mounted) pass."""
    import pyarrow as pa

    from cdcflow.core.data.filter import TableFilter
    from cdcflow.core.data.pipeline.datasource import split_record_batches
    from cdcflow.core.data.pipeline.tasks import ChunkRangesTask
    from cdcflow.core.testing import insert

    store = EventStore(tmp_path, "cf", start_ts=5, fsync=False, chunk_rows=100)
    store.add_span(SPAN, 5, replicating=True)
    tables = [("shop", "orders"), ("shop", "secrets"), ("mysql", "user"), ("Shop", "orders")]
    for n, ts in enumerate(range(10, 90, 5)):
        schema, table = tables[n % len(tables)]
        store.put(SPAN, insert(schema, table, {"id": ts}, commit_ts=ts))
    store.put(SPAN, RawKVEvent(SPAN, b"k", b"v", b"", 94, 95))
    store.resolve(SPAN, 100)
    files = [str(tmp_path / c.file) for c in store.chunks_in(0, store.next_chunk)]
    shares = tuple(tuple(s) for s in split_record_batches(files, 1))
    table_filter = TableFilter(["shop.*", "!shop.secrets"])

    def kept(task_filter):
        seen = []

        def task(batches):
            for b in batches:
                seen.extend(zip(b.column("kind").to_pylist(), b.column("table_name").to_pylist(), strict=True))
            yield pa.RecordBatch.from_pylist([{"n": len(seen)}])

        list(ChunkRangesTask(shares, task, task_filter)(iter([pa.RecordBatch.from_pylist([{"id": 0}])])))
        return seen

    everything = kept(None)
    assert len(everything) == 17  # 16 rows and the raw record
    filtered = kept(table_filter)
    rows = [name for kind, name in filtered if kind != 0]
    assert rows == ["orders"] * 8  # shop.orders and Shop.orders (names match case-insensitively)
    assert [kind for kind, _ in filtered].count(0) == 1  # the raw record passes


def test_a_single_task_batch_is_sorted_in_the_tasks_worker(tmp_path):
    """SortedTask (a one-task batch read by ChunkRangesTask): the task gets every record
    of the batch's files in the order Spark's sort would give it: commit ts, start ts,
    key (bytes, unsigned), whatever the files' order."""
    import pyarrow as pa

    from cdcflow.core.data.pipeline.datasource import split_record_batches
    from cdcflow.core.data.pipeline.tasks import ChunkRangesTask, SortedTask

    store = EventStore(tmp_path, "cf", start_ts=5, fsync=False, chunk_rows=2)
    other = Span(2, b"b", b"c")
    store.add_span(SPAN, 5, replicating=True)
    store.add_span(other, 5, replicating=True)
    # Two spans' events: each span's chunks are in its own order, not the batch's.
    for span, events in (
        (SPAN, [(b"k2", 8, 20), (b"k1", 8, 20), (b"\xff", 9, 20), (b"k3", 29, 30)]),
        (other, [(b"b9", 3, 10), (b"b1", 18, 20), (b"b\x00", 8, 20)]),
    ):
        for key, start_ts, commit_ts in events:
            store.put(span, RawKVEvent(span, key, b"v", b"", start_ts, commit_ts))
    store.resolve(SPAN, 40)
    store.resolve(other, 40)
    chunks = store.chunks_in(0, 10)
    assert len(chunks) > 1
    shares = tuple(tuple(s) for s in split_record_batches([str(tmp_path / c.file) for c in chunks], 1))

    seen = []

    def task(batches):
        for batch in batches:
            seen.extend(zip(*(batch.column(c).to_pylist() for c in ("commit_ts", "start_ts", "key")), strict=True))
        yield pa.RecordBatch.from_pylist([{"rows": len(seen)}])

    out = list(ChunkRangesTask(shares, SortedTask(task))(iter([pa.RecordBatch.from_pylist([{"id": 0}])])))
    assert out[0].column("rows").to_pylist() == [7]
    assert seen == [
        (10, 3, b"b9"),
        (20, 8, b"b\x00"),
        (20, 8, b"k1"),
        (20, 8, b"k2"),
        (20, 9, b"\xff"),
        (20, 18, b"b1"),
        (30, 29, b"k3"),
    ]
    # No records: the task still runs, on nothing.
    seen.clear()
    assert list(SortedTask(task)(iter([]))) == [pa.RecordBatch.from_pylist([{"rows": 0}])]
