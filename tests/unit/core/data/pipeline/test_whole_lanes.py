"""How a batch's files are dealt to tasks that each write whole lanes (query.whole_lane_shares)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.events import RawKVEvent, Span, TableSchema
from cdcflow.core.data.logservice.records import record_from_event, record_tables, write_records
from cdcflow.core.data.pipeline.query import deal_largest_first, whole_lane_shares
from cdcflow.core.testing import insert


class _NoSchemas:
    def id_of(self, schema: TableSchema | None) -> int:
        return -1


def lane(route: str, n: int = 0, writer: int = 0) -> tuple[int, str, int]:
    return (writer, route, n)


def test_tables_on_lanes_of_their_own_are_dealt_largest_first():
    files = [
        ("a1", 40, [lane("a")]),
        ("b1", 30, [lane("b")]),
        ("a2", 20, [lane("a")]),  # a's second span: with a1
        ("c1", 35, [lane("c")]),
        ("d1", 0, None),  # no rows: no lanes needed, in no share
    ]
    # Groups a (60), c (35), b (30): a to one task, c and b to the other.
    assert whole_lane_shares(files, 2) == [["a1", "a2"], ["b1", "c1"]]


def test_files_sharing_any_lane_are_one_group():
    files = [
        ("a", 10, [lane("t", 0)]),
        ("b", 10, [lane("t", 1)]),
        ("c", 10, [lane("t", 0), lane("t", 1), lane("t", 2)]),  # a topic dispatched per row
        ("d", 10, [lane("u", 0)]),
        ("e", 10, [lane("t", 2, writer=1)]),  # another sink's lane: not t/2 of writer 0
    ]
    assert whole_lane_shares(files, 2, slack=3) == [["a", "b", "c"], ["d", "e"]]


def test_none_when_a_lane_is_not_known_one_group_holds_everything_or_the_share_is_uneven():
    assert whole_lane_shares([("a", 10, [lane("a")]), ("b", 10, None)], 2) is None
    assert whole_lane_shares([("a", 10, [lane("a")]), ("b", 10, [lane("a")])], 2) is None
    # 80 of 100 on one of two tasks: over 1.5 times an even share (75).
    assert whole_lane_shares([("a", 80, [lane("a")]), ("b", 20, [lane("b")])], 2) is None
    assert whole_lane_shares([("a", 70, [lane("a")]), ("b", 30, [lane("b")])], 2) == [["a"], ["b"]]
    assert whole_lane_shares([("a", 10, [lane("a")]), ("b", 10, [lane("b")])], 1) is None


@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.sets(st.integers(0, 8), max_size=3)),
        min_size=1,
        max_size=12,
    ),
    st.integers(2, 4),
)
def test_every_file_with_rows_is_in_one_share_and_every_lane_in_one_task(files, tasks):
    named = [(f"f{i}", rows, [lane("t", n) for n in lanes]) for i, (rows, lanes) in enumerate(files)]
    shares = whole_lane_shares(named, tasks, slack=float(tasks))
    if shares is None:
        return
    assert 2 <= len(shares) <= tasks
    dealt = [path for share in shares for path in share]
    assert sorted(dealt) == sorted(path for path, rows, _ in named if rows)
    index = {path: i for i, (path, _, _) in enumerate(named)}
    task_of_lane: dict[tuple[int, str, int], int] = {}
    for task, share in enumerate(shares):
        assert [index[p] for p in share] == sorted(index[p] for p in share)  # in the batch's order
        for path in share:
            for each in named[index[path]][2]:
                assert task_of_lane.setdefault(each, task) == task


def test_deal_largest_first():
    assert deal_largest_first({"x": 5, "y": 3, "z": 3, "w": 1}, 2) == [(6, ["x", "w"]), (6, ["y", "z"])]
    assert deal_largest_first({"x": 5}, 3) == [(5, ["x"])]
    assert deal_largest_first({}, 2) == []


def test_the_tables_a_chunk_of_rows_names_and_none_for_raw_events(tmp_path: Path):
    rows = [insert("shop", t, {"id": i}, commit_ts=10 + i) for i in range(3) for t in ("orders", "items")]
    path = tmp_path / "rows.arrow"
    write_records(path, [record_from_event(r, 0, _NoSchemas()) for r in rows], 4, fsync=False)
    assert {(t.schema, t.table, t.partition_id) for t in record_tables(path) or ()} == {
        ("shop", "orders", None),
        ("shop", "items", None),
    }
    assert {t.table_id for t in record_tables(path) or ()} == {r.table.table_id for r in rows}


def test_a_chunk_of_raw_events_names_no_table(tmp_path: Path):
    span = Span(5, b"t5", b"t5~")
    raw = RawKVEvent(span, b"t5_r1", b"v", b"", 9, 10)
    path = tmp_path / "raw.arrow"
    write_records(path, [record_from_event(raw, 0, _NoSchemas())], 4, fsync=False)
    assert record_tables(path) is None
