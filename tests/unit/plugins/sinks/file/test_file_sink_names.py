"""Upstream schema and table names become safe path segments: nothing is written
outside the target directory, whatever the names hold."""

import asyncio
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.data.events import DDLEvent, MicroBatch, TableName
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.errors import DownstreamUnavailableError, Retryable
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import ListSource, drive, insert
from cdcflow.plugins.sinks.file import FileSink, FileSinkConfig
from cdcflow.plugins.sinks.file.sink import MAX_SEGMENT_BYTES, name_of, segment_of

PLUGINS = PluginManager.default(autoload=False)


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_table_named_to_climb_out_stays_in_its_directory(tmp_path):
    root = tmp_path / "a" / "b" / "out"
    sink = FileSink(FileSinkConfig(path=str(root), fsync=False))
    source = ListSource.of(
        [
            insert("shop", "../../../x", {"id": 1}, commit_ts=10),
            insert("..", "..", {"id": 2}, commit_ts=10),
            insert("/etc", "/tmp/y", {"id": 3}, commit_ts=10),
            insert("metadata", "ddl-1.jsonl", {"id": 4}, commit_ts=10),
            ListSource.resolved(12),
        ]
    )
    asyncio.run(drive(source, [sink], changefeed_id="cf"))
    everything = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert all(p.startswith("a/b/out/") for p in everything), everything
    assert files_under(root) == [
        "%2E./%2E./000000000000-12.jsonl",
        "%2Fetc/%2Ftmp%2Fy/000000000000-12.jsonl",
        "%6Detadata/%64dl-1.jsonl/000000000000-12.jsonl",
        "metadata",
        "shop/%2E.%2F..%2F..%2Fx/000000000000-12.jsonl",
    ]


def test_spark_partition_writers_use_the_same_segments(tmp_path):
    sink = FileSink(FileSinkConfig(path=str(tmp_path), fsync=False))
    sink.open(SinkContext("cf", plugins=PLUGINS))
    table = TableName("..", "../../../x", 1)
    batch = MicroBatch("cf", 3, 0, 30, (), (DDLEvent(30, "CREATE TABLE t (a INT)", TableName("..", "", 0)),))
    writer = sink.task_writer([table]).open(batch, 0)
    writer.write([insert("..", "../../../x", {"id": 1}, commit_ts=20)])
    writer.flush()
    writer.close()
    sink.commit_batch(batch)
    assert files_under(tmp_path) == [
        "%2E./%2E.%2F..%2F..%2Fx/000000000003-30-p00000.jsonl",
        "%2E./ddl-30.jsonl",
        "metadata",
    ]


def test_a_symlink_out_of_the_directory_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "out"
    root.mkdir()
    os.symlink(outside, root / "shop")
    sink = FileSink(FileSinkConfig(path=str(root), fsync=False))
    sink.open(SinkContext("cf", plugins=PLUGINS))
    batch = MicroBatch("cf", 0, 0, 12, (insert("shop", "t", {"id": 1}, commit_ts=10),), ())
    with pytest.raises(DownstreamUnavailableError) as info:
        sink.write_batch(batch)
    assert "outside the target directory" in str(info.value) and info.value.retryable is Retryable.NONE
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "segment"),
    [
        ("orders", "orders"),
        ("50%off", "50%25off"),
        ("a/b\\c", "a%2Fb%5Cc"),
        ("nul\x00", "nul%00"),
        (".hidden", "%2Ehidden"),
        ("..", "%2E."),
        ("", "%"),
        ("_", "%5F"),
        ("ünïcødé", "ünïcødé"),
    ],
)
def test_segments_are_percent_encoded_and_reversible(name, segment):
    assert segment_of(name) == segment
    assert name_of(segment) == name


def test_over_long_names_are_truncated_with_a_hash():
    long_a, long_b = "é" * 200 + "a", "é" * 200 + "b"
    a, b = segment_of(long_a), segment_of(long_b)
    assert a != b and len(a.encode()) <= MAX_SEGMENT_BYTES and "%~" in a
    assert name_of(a) is None


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_every_name_is_one_safe_reversible_segment(name):
    segment = segment_of(name)
    assert "/" not in segment and "\\" not in segment and "\x00" not in segment
    assert segment not in (".", "..", "metadata", "_") and not segment.startswith((".", "ddl-"))
    assert 0 < len(segment.encode("utf-8", "surrogatepass")) <= MAX_SEGMENT_BYTES
    assert name_of(segment) in (name, None)
    if len(segment.encode("utf-8", "surrogatepass")) < 150:
        assert name_of(segment) == name
