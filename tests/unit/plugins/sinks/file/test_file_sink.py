import asyncio
import json
import struct

import pytest

from cdcflow.core.data.events import DDLEvent, MicroBatch, TableName
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.errors import ConfigInvalidError, DownstreamUnavailableError
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import ListSource, drive, insert, update
from cdcflow.plugins.sinks.file import FileSink, FileSinkConfig
from cdcflow.plugins.sinks.file.sink import directory_of

#: The plugin manager sinks are opened with (their codecs are plugins).
PLUGINS = PluginManager.default(autoload=False)


def test_writes_per_table_batch_files_and_metadata(tmp_path):
    sink = FileSink(FileSinkConfig(path=str(tmp_path)))
    source = ListSource.of(
        [
            insert("shop", "orders", {"id": 1, "price": 2}, commit_ts=10),
            insert("shop", "users", {"id": 3}, commit_ts=11),
            ListSource.resolved(12),
            update("shop", "orders", {"id": 1, "price": 2}, {"id": 1, "price": 5}, commit_ts=13),
            ListSource.resolved(20),
        ]
    )
    asyncio.run(drive(source, [sink], changefeed_id="cf"))
    orders = sorted((tmp_path / "shop" / "orders").iterdir())
    assert [p.name for p in orders] == ["000000000000-12.jsonl", "000000000001-20.jsonl"]
    lines = [json.loads(line) for line in orders[1].read_text().splitlines()]
    assert lines == [
        {
            "type": "row",
            "op": "update",
            "schema": "shop",
            "table": "orders",
            "commit_ts": 13,
            "start_ts": 12,
            "after": {"id": 1, "price": 5},
            "before": {"id": 1, "price": 2},
        }
    ]
    meta = json.loads((tmp_path / "metadata").read_text())
    assert meta == {"batch-id": 1, "changefeed-id": "cf", "checkpoint-ts": 20}
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_replay_is_idempotent_and_ddl_written(tmp_path):
    sink = FileSink(FileSinkConfig(path=str(tmp_path), fsync=False))
    sink.open(SinkContext("cf", plugins=PLUGINS))
    table = TableName("shop", "orders", 5)
    batch = MicroBatch(
        "cf", 7, 0, 30, (insert("shop", "orders", {"id": 1}, commit_ts=20),), (DDLEvent(30, "TRUNCATE orders", table),)
    )
    sink.write_batch(batch)
    first = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    sink.write_batch(batch)
    again = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert first == again
    ddl = json.loads((tmp_path / "shop" / "orders" / "ddl-30.jsonl").read_text())
    assert ddl["query"] == "TRUNCATE orders"


def test_uri_forms(tmp_path):
    assert str(directory_of(FileSinkConfig(uri=f"file://{tmp_path}/x"))) == f"{tmp_path}/x"
    assert str(directory_of(FileSinkConfig(uri="file://./rel/dir"))) == "rel/dir"
    with pytest.raises(ConfigInvalidError, match="names host"):
        directory_of(FileSinkConfig(uri="file://otherhost/x"))


def test_file_in_place_of_directory_is_downstream_unavailable(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    sink = FileSink(FileSinkConfig(path=str(blocker / "sub")))
    with pytest.raises(DownstreamUnavailableError) as info:
        sink.open(SinkContext("cf", plugins=PLUGINS))
    assert info.value.code == 2001


def test_open_protocol_files_are_length_framed_and_decode(tmp_path):
    from cdcflow.plugins.codecs.open_protocol_decode import decode_file

    sink = FileSink(
        FileSinkConfig(uri=f"file://{tmp_path}?protocol=open-protocol", protocol="open-protocol", fsync=False)
    )
    sink.open(SinkContext("cf", plugins=PLUGINS))
    table = TableName("shop", "orders", 5)
    rows = tuple(insert("shop", "orders", {"id": i, "blob": b"\n\x00" * i}, commit_ts=20 + i) for i in range(20))
    sink.write_batch(MicroBatch("cf", 3, 0, 60, rows, (DDLEvent(60, "TRUNCATE orders", table, 11),)))
    data = (tmp_path / "shop" / "orders" / "000000000003-60.op").read_bytes()
    # first record: key length, then the key (version 1 + framed key JSONs), then the value
    (key_len,) = struct.unpack(">Q", data[:8])
    assert data[8:16] == b"\0\0\0\0\0\0\0\x01"
    (value_len,) = struct.unpack(">Q", data[8 + key_len : 16 + key_len])
    assert 16 + key_len + value_len < len(data)  # 20 rows: two messages of 16 and 4 rows
    decoded = list(decode_file(data))
    assert [(r.commit_ts, r.after) for r in decoded] == [(r.commit_ts, r.after) for r in rows]
    [ddl] = decode_file((tmp_path / "shop" / "orders" / "ddl-60.op").read_bytes())
    assert (ddl.query, ddl.action_type) == ("TRUNCATE orders", 11)


def test_canal_json_files_hold_one_document_per_line(tmp_path):
    sink = FileSink(FileSinkConfig(path=str(tmp_path), protocol="canal-json", fsync=False))
    sink.open(SinkContext("cf", plugins=PLUGINS))
    rows = (insert("shop", "orders", {"id": 1}, commit_ts=20), insert("shop", "orders", {"id": 2}, commit_ts=21))
    sink.write_batch(MicroBatch("cf", 0, 0, 30, rows))
    lines = (tmp_path / "shop" / "orders" / "000000000000-30.json").read_text().splitlines()
    assert [json.loads(line)["data"] for line in lines] == [[{"id": "1"}], [{"id": "2"}]]


def test_open_protocol_files_print_as_json_lines(tmp_path, capsys):
    from cdcflow.plugins.codecs.open_protocol_decode import main

    sink = FileSink(FileSinkConfig(path=str(tmp_path), protocol="open-protocol", fsync=False))
    sink.open(SinkContext("cf", plugins=PLUGINS))
    sink.write_batch(MicroBatch("cf", 0, 0, 30, (insert("shop", "orders", {"id": 1, "b": b"\x00"}, commit_ts=20),)))
    assert main([str(tmp_path / "shop" / "orders" / "000000000000-30.op")]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line == {
        "type": "insert",
        "ts": 20,
        "schema": "shop",
        "table": "orders",
        "after": {"b": "00", "id": 1},
        "before": None,
    }


def _opened_sink(tmp_path):
    from cdcflow.core.plugin.manager import PluginManager

    sink = FileSink(FileSinkConfig(path=str(tmp_path), fsync=False))
    sink.open(SinkContext("cf", plugins=PluginManager.default(autoload=False)))
    return sink


def test_a_partition_writer_streams_a_file_per_table_and_renames_it_on_flush(tmp_path):
    import pickle

    sink = _opened_sink(tmp_path)
    writer = pickle.loads(pickle.dumps(sink.task_writer([])))  # as shipped to a Spark task
    part = writer.open(MicroBatch("cf", 4, 10, 30), 1)
    part.write([insert("shop", "orders", {"id": 1}, commit_ts=11), insert("shop", "users", {"id": 2}, commit_ts=12)])
    part.write([insert("shop", "orders", {"id": 3}, commit_ts=13)])
    # Nothing is visible before the flush.
    assert not list(tmp_path.rglob("*.jsonl"))
    part.flush()
    part.close()
    orders = tmp_path / "shop" / "orders" / "000000000004-30-p00001.jsonl"
    assert [json.loads(line)["after"]["id"] for line in orders.read_text().splitlines()] == [1, 3]
    assert (tmp_path / "shop" / "users" / "000000000004-30-p00001.jsonl").exists()
    assert not list(tmp_path.rglob("*.tmp"))
    # The batch's DDL and metadata come from the driver, after every partition flushed.
    sink.commit_batch(
        MicroBatch("cf", 4, 10, 30, ddl=(DDLEvent(30, "TRUNCATE TABLE `shop`.`users`", TableName("shop", "users")),))
    )
    assert json.loads((tmp_path / "metadata").read_text())["checkpoint-ts"] == 30
    assert list((tmp_path / "shop" / "users").glob("ddl-30.*"))


def test_a_partition_writer_closed_after_an_error_leaves_no_file(tmp_path):
    sink = _opened_sink(tmp_path)
    part = sink.task_writer([]).open(MicroBatch("cf", 0, 0, 5), 0)
    part.write([insert("shop", "orders", {"id": 1}, commit_ts=3)])
    part.close()  # the task failed before its flush
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_the_sink_takes_its_codecs_from_the_context_only(tmp_path):
    from cdcflow.core.errors import CdcflowError

    sink = FileSink(FileSinkConfig(path=str(tmp_path)))
    with pytest.raises(CdcflowError, match=r"SinkContext\.plugins, which is None"):
        sink.open(SinkContext("cf"))


def test_two_writers_of_a_changefeed_keep_their_own_files_of_one_table(tmp_path):
    """Batch ids are numbered per writer: two captures holding spans of one table can write
    batches of the same id and end ts. Each keeps its file; a writer's replay writes the same
    names again (driver-side batches and task partitions alike)."""
    import pickle

    def opened(writer: str) -> FileSink:
        sink = FileSink(FileSinkConfig(path=str(tmp_path), fsync=False))
        sink.open(SinkContext("cf", plugins=PLUGINS, writer_id=writer))
        return sink

    first, second = opened("a1"), opened("b2")
    for sink, row_id in ((first, 1), (second, 2), (first, 1)):  # the last one: first's replay
        sink.write_batch(MicroBatch("cf", 3, 10, 30, (insert("shop", "orders", {"id": row_id}, commit_ts=20),)))
        part = pickle.loads(pickle.dumps(sink.task_writer([]))).open(MicroBatch("cf", 4, 30, 40), 0)
        part.write([insert("shop", "orders", {"id": row_id * 10}, commit_ts=35)])
        part.flush()
        part.close()
    files = {p.name: json.loads(p.read_text())["after"]["id"] for p in (tmp_path / "shop" / "orders").iterdir()}
    assert files == {
        "000000000003-30-wa1.jsonl": 1,
        "000000000003-30-wb2.jsonl": 2,
        "000000000004-40-wa1-p00000.jsonl": 10,
        "000000000004-40-wb2-p00000.jsonl": 20,
    }
    assert json.loads((tmp_path / "metadata").read_text())["writer"] == "a1"
