"""The MySQL sink's partition writers: what a Spark task gets, and how rows become transactions."""

from __future__ import annotations

import pickle

from cdcflow.core.data.events import RowChange
from cdcflow.core.testing import insert
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from cdcflow.plugins.sinks.mysql.tasks import MySQLTaskWriter, ready_rows


def rows_of(*txns: tuple[int, int]) -> list[RowChange]:
    """(commit ts, row count) per upstream transaction, all on one table."""
    out = []
    for commit_ts, count in txns:
        out += [insert("s", "t", {"id": commit_ts * 100 + i}, commit_ts=commit_ts) for i in range(count)]
    return out


def test_the_sink_partitions_by_table() -> None:
    assert MySQLSink(MySQLSinkConfig()).task_partitioning() == "table"


def test_the_task_writer_pickles_with_settings_not_connections() -> None:
    writer = MySQLTaskWriter(
        MySQLSinkConfig(uri="mysql://u:secret@db:3306/", max_txn_row=8),
        "cf",
        writer_id="w1",
        flushed_ts=5,
        safe_until=9,
    )
    again = pickle.loads(pickle.dumps(writer))
    assert (again.changefeed_id, again.writer_id, again.flushed_ts, again.safe_until) == ("cf", "w1", 5, 9)
    assert again.config.max_txn_row == 8 and again.config.uri == "mysql://u:secret@db:3306/"


def test_the_last_transaction_waits_for_its_rows_and_full_transactions_go() -> None:
    pending = rows_of((10, 2), (11, 2), (12, 1), (13, 2))
    ready, rest = ready_rows(pending, 4, final=False)
    # ts 13 may continue in the next rows; ts 12 alone is not a full transaction yet.
    assert [[r.commit_ts for r in txn] for txn in ready] == [[10, 10, 11, 11]]
    assert [r.commit_ts for r in rest] == [12, 13, 13]


def test_a_unit_larger_than_max_txn_row_stays_whole_and_final_takes_everything() -> None:
    pending = rows_of((10, 1), (11, 6), (12, 1))
    ready, rest = ready_rows(pending, 4, final=False)
    assert [[r.commit_ts for r in txn] for txn in ready] == [[10], [11] * 6]
    assert [r.commit_ts for r in rest] == [12]
    ready, rest = ready_rows(rest, 4, final=True)
    assert [[r.commit_ts for r in txn] for txn in ready] == [[12]] and rest == []


def test_nothing_is_ready_while_one_transaction_is_being_read() -> None:
    pending = rows_of((10, 9))
    assert ready_rows(pending, 4, final=False) == ([], pending)
