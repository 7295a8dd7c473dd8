"""Partition math against CRC32-IEEE values known by heart.

crc32("123456789") = 0xCBF43926 (the standard check value), crc32("a") = 0xE8B7BE43,
crc32("abc") = 0x352441C2. The position hash CRCs each write's concatenated
arguments and XORs the sums.
"""

import pytest

from cdcflow.core.data.events import ColumnInfo, OpType, RowChange, TableName, TableSchema
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.plugins.sinks.kafka.dispatch import (
    DispatchRule,
    EventRouter,
    PositionHash,
    TopicExpression,
    column_value_string,
    key_changed,
    make_dispatcher,
)


def row(schema, table, image, *, handle=(), ts=1, before=None, op=OpType.INSERT):
    name = TableName(schema, table)
    columns = tuple(ColumnInfo(c, 15, ColumnInfo.HANDLE_KEY if c in handle else 0) for c in image)
    return RowChange(name, op, ts, ts - 1, image, before, TableSchema(name, columns))


def test_position_hash_xors_crc32_per_write():
    assert PositionHash().write(b"1234", b"56789").sum32() == 0xCBF43926
    assert PositionHash().write(b"123456789").write(b"12345", b"6789").sum32() == 0
    assert PositionHash().write(b"a", b"bc").write(b"a").sum32() == 0x352441C2 ^ 0xE8B7BE43 == 0xDD93FF81


def test_table_dispatcher():
    r = row("1234", "56789", {"id": 1})
    # 0xCBF43926 = 3421780262 = 7 * 488825751 + 5
    assert make_dispatcher("table").partition(r, 7) == 5
    assert make_dispatcher("default").partition(r, 7) == 5


def test_index_value_dispatcher_hashes_handle_key_columns():
    # H("1234","56789") ^ H("1234", "56789") = 0 → partition 0
    assert make_dispatcher("index-value").partition(row("1234", "56789", {"1234": 56789}, handle={"1234"}), 7) == 0
    # H("a","bc") ^ H("a", "") = 0xDD93FF81 → mod 4 = 1 (low bits 0b01)
    assert make_dispatcher("index-value").partition(row("a", "bc", {"a": "", "x": 9}, handle={"a"}), 4) == 1
    # no handle key known: the table's hash alone
    assert make_dispatcher("index-value").partition(row("a", "bc", {"a": ""}), 4) == 0x352441C2 % 4


def test_columns_dispatcher_and_missing_column():
    dispatcher = make_dispatcher("columns", ["A"])
    # the column name as written in the rule ("A") and the value "bc": H("1234","56789") ^ H("A","bc")
    # crc32("Abc") is not one to know by heart; "a" + "bc" is: use a lower-case rule for the exact figure.
    r = row("1234", "56789", {"a": "bc"})
    assert make_dispatcher("columns", ["a"]).partition(r, 1 << 32) == 0xCBF43926 ^ 0x352441C2
    assert dispatcher.partition(r, 4) in range(4)
    with pytest.raises(ConfigInvalidError, match="does not have"):
        make_dispatcher("columns", ["nope"]).partition(r, 4)


def test_ts_dispatcher():
    assert make_dispatcher("ts").partition(row("s", "t", {"id": 1}, ts=1_000_003), 4) == 3


def test_unknown_rule_is_config_error():
    with pytest.raises(ConfigInvalidError, match="unknown partition rule"):
        make_dispatcher("hash")


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, b"null"), (True, b"1"), (-5, b"-5"), (1.5, b"1.5"), (1e21, b"1000000000000000000000"), (b"\xff", b"\xff")],
)
def test_value_strings(value, text):
    assert column_value_string(value) == text


def test_topic_expressions():
    assert TopicExpression("cdc_{schema}_{table}").topic("shop", "order items") == "cdc_shop_order_items"
    assert TopicExpression("{schema}").topic("shop", "x") == "shop"
    assert TopicExpression("plain-topic").topic("a", "b") == "plain-topic"
    for bad in ("{table}", "{Schema}", "a b", "{schema}/{table}", ""):
        with pytest.raises(ConfigInvalidError):
            TopicExpression(bad)


def test_router_first_matching_rule_wins():
    router = EventRouter(
        "default",
        [
            DispatchRule(matcher=["shop.orders"], topic="{schema}_{table}", partition="index-value"),
            DispatchRule(matcher=["shop.*"], partition="ts"),
        ],
    )
    topic, dispatcher = router.route(TableName("shop", "orders"))
    assert topic == "shop_orders" and type(dispatcher).__name__ == "IndexValueDispatcher"
    topic, dispatcher = router.route(TableName("shop", "users"))
    assert topic == "default" and type(dispatcher).__name__ == "TsDispatcher"
    assert router.route(TableName("crm", "x"))[0] == "default"
    assert router.topic_of(TableName("shop", "")) == "default"
    with pytest.raises(ConfigInvalidError, match="both"):
        EventRouter("d", [DispatchRule(partition="ts", dispatcher="table")])


def test_key_change_detected_for_key_based_rules_only():
    moved = row("s", "t", {"id": 2}, handle={"id"}, before={"id": 1}, op=OpType.UPDATE)
    assert key_changed(make_dispatcher("index-value"), moved)
    assert not key_changed(make_dispatcher("table"), moved)
    same = row("s", "t", {"id": 1, "v": 2}, handle={"id"}, before={"id": 1, "v": 1}, op=OpType.UPDATE)
    assert not key_changed(make_dispatcher("index-value"), same)


def test_columns_rule_detects_moves_whatever_the_case_of_its_names():
    moved = row("s", "t", {"Region": "eu", "v": 1}, before={"Region": "us", "v": 1}, op=OpType.UPDATE)
    assert key_changed(make_dispatcher("columns", ["region"]), moved)
    assert not key_changed(make_dispatcher("columns", ["v"]), moved)


def test_value_strings_follow_column_precision():
    import datetime as dt

    moment = dt.datetime(2024, 1, 2, 3, 4, 5)
    assert column_value_string(moment) == b"2024-01-02 03:04:05"
    assert column_value_string(moment, ColumnInfo("c", 12, sql_type="datetime(3)")) == b"2024-01-02 03:04:05.000"
    single = 0.10000000149011612  # 0.1 as a FLOAT column holds it
    assert column_value_string(single) == b"0.10000000149011612"
    assert column_value_string(single, ColumnInfo("c", 4)) == b"0.1"


def shop_routes():
    """A router with a rule of each kind (per row, per ts to a topic of its own, per table),
    and its topics' partition counts."""
    router = EventRouter(
        "cdc",
        [
            DispatchRule(matcher=["shop.items"], partition="index-value"),
            DispatchRule(matcher=["shop.events"], topic="{schema}_{table}", partition="ts"),
            DispatchRule(matcher=["shop.*"], partition="table"),
        ],
    )
    return router, {"cdc": 7, "shop_events": 3}


def test_a_tables_lanes_are_its_partition_under_the_table_rule_else_every_partition_of_its_topic():
    """What the runtime asks before a batch's rows are mounted (LaneTaskWriter.table_lanes):
    the one partition every row of a table goes to under the table rule (the one route_rows
    gives its rows), else every partition of its topic."""
    from cdcflow.plugins.sinks.kafka.sink import _KafkaTaskWriter, route_rows

    router, counts = shop_routes()
    writer = _KafkaTaskWriter({}, router, None, counts, 1.0, "mock")
    for name in ("orders", "users", "audit"):
        rows = [row("shop", name, {"id": i}, handle=("id",), ts=10 + i) for i in range(20)]
        routed = route_rows(rows, router, counts.__getitem__)
        assert writer.table_lanes(TableName("shop", name)) == list(routed) and len(routed) == 1
    assert writer.table_lanes(TableName("shop", "items")) == [("cdc", p) for p in range(7)]
    assert writer.table_lanes(TableName("shop", "events")) == [("shop_events", p) for p in range(3)]
    assert writer.table_lanes(TableName("crm", "x")) is not None
    assert _KafkaTaskWriter({}, router, None, {}, 1.0, "mock").table_lanes(TableName("shop", "orders")) is None
    # Under the table rule a partitioned table's partitions share its lane.
    assert writer.table_lanes(TableName("shop", "orders", 70, 71)) == writer.table_lanes(TableName("shop", "orders"))


def test_a_dispatcher_that_may_move_rows_has_no_fixed_lane_even_with_a_table_partition():
    """A plugin dispatcher giving a table's partition and naming key columns (a row whose
    key changes is split and its parts routed one by one): every partition of its topic
    is a lane of the table, as routing its rows finds."""
    from cdcflow.plugins.sinks.kafka.dispatch import Dispatcher
    from cdcflow.plugins.sinks.kafka.sink import _KafkaTaskWriter, route_rows

    class ByKey(Dispatcher):
        def partition(self, row, partitions):
            return (row.after or row.before)["id"] % partitions

        def key_columns(self, row):
            return ("id",)

        def table_partition(self, table, partitions):
            return 0

    router = EventRouter("cdc", [])
    router.route = lambda table: ("cdc", ByKey())  # type: ignore[method-assign]
    writer = _KafkaTaskWriter({}, router, None, {"cdc": 3}, 1.0, "mock")
    rows = [row("shop", "orders", {"id": i}, handle=("id",), ts=10 + i) for i in range(6)]
    assert sorted(route_rows(rows, router, {"cdc": 3}.__getitem__)) == [("cdc", p) for p in range(3)]
    assert writer.table_lanes(TableName("shop", "orders")) == [("cdc", p) for p in range(3)]


def test_rows_are_routed_as_each_by_its_own_tables_rule_and_lanes_encode_as_their_parts():
    """route_rows decides a table once per call and appends its rows under the table rule
    without a decision per row: the lanes are those of routing each row by its own table's
    rule, moved rows split; and a task writer's lanes (encode_lanes) hold encode's parts."""
    import dataclasses

    from cdcflow.core.data.sink import LaneTaskWriter
    from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
    from cdcflow.plugins.sinks.kafka.sink import _KafkaTaskWriter, route_rows

    router, counts = shop_routes()
    shared = {name: row("shop", name, {"id": "0", "v": "0"}, handle=("id",)) for name in ("orders", "items")}
    rows = []
    for i in range(60):
        name = ("orders", "items", "events", "users")[i % 4]
        if name in shared:  # rows of one name object, as a mounter gives them
            template = shared[name]
            op, before = (OpType.UPDATE, {"id": str(i + 1), "v": "0"}) if i % 3 == 0 else (OpType.INSERT, None)
            after = {"id": str(i), "v": str(i)}
            rows.append(dataclasses.replace(template, op=op, after=after, before=before, commit_ts=i + 2))
        else:
            rows.append(row("shop", name, {"id": str(i), "v": str(i)}, handle=("id",), ts=i + 2))
    expected: dict = {}
    for i, r in enumerate(rows):
        topic, dispatcher = router.route(r.table)
        moved = key_changed(dispatcher, r)
        split = [
            dataclasses.replace(r, op=OpType.DELETE, after=None),
            dataclasses.replace(r, op=OpType.INSERT, before=None),
        ]
        for part in split if moved else [r]:
            expected.setdefault((topic, dispatcher.partition(part, counts[topic])), []).append((i, part))
    routed = route_rows(rows, router, counts.__getitem__)
    assert routed == expected and list(routed) == list(expected)
    assert any(len(parts) > 1 for parts in expected.values())  # rows moved by their key change

    writer = _KafkaTaskWriter({}, router, OpenProtocolCodec(OpenProtocolConfig()), counts, 1.0, "mock")
    lanes = writer.encode_lanes(rows)
    assert lanes == LaneTaskWriter.encode_lanes(writer, rows) and list(lanes) == list(expected)
