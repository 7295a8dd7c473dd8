"""TiDBMounter.mount_many: rows of a batch decoded with per-(table, version, header) layouts.

Every test compares against :meth:`TiDBMounter.mount_row` of each event (the
one-row path, itself tested against reference bytes in test_mounter.py):
the rows must be equal, their images in the same column order, and a value
that does not decode must raise the same coded error.
"""

import asyncio
import decimal
import pickle
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.data.events import OpType, RawKVEvent, Span
from cdcflow.plugins.sources.tikv.tidb.mounter import RowDecodeError, TiDBMounter, UnsupportedColumnTypeError
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBTable

from . import refcodec
from . import tidb_json as tj
from .test_mounter import ALL_TYPES, row_key, store_with, users_value, wide_table

SPAN = Span(100, b"", b"")


def event(key, value, commit_ts, old_value=b"", delete=False):
    return RawKVEvent(SPAN, key, value, old_value, commit_ts - 1, commit_ts, delete=delete)


def assert_same_as_one_by_one(mounter, events):
    """mount_many gives what mount_row gives, event by event, images in the same column order."""
    many = mounter.mount_many(events)
    single = [TiDBMounter(mounter.schemas).mount_row(e) for e in events]
    assert many == single
    for a, b in zip(many, single, strict=True):
        if a is not None:
            assert list(a.after or {}) == list(b.after or {})
            assert list(a.before or {}) == list(b.before or {})
    return many


def users_history_store():
    """shop.users without ``email`` until ts 200, with it (origin default 'none') from then on."""
    store = store_with(tj.users_table(with_email=False))
    store.add_table(1, "shop", TiDBTable.from_json(tj.users_table()), 200)
    return store


def test_two_schema_versions_in_one_batch_and_the_default_of_an_added_column():
    m = TiDBMounter(users_history_store())
    old = users_value("ann", "1.50")  # written before email existed: no column 5
    new = users_value("bob", "2.00", None, "b@x")
    events = [
        event(row_key(100, 1), old, 150),
        event(row_key(100, 2), new, 200),  # decoded with the version at 199: no email
        event(row_key(100, 1), users_value("ann", "1.75"), 201, old_value=old),  # the new version: default
        event(row_key(100, 3), new, 202),
        event(row_key(100, 2), b"", 203, old_value=new, delete=True),
    ]
    rows = assert_same_as_one_by_one(m, events)
    assert [r.op for r in rows] == [OpType.INSERT, OpType.INSERT, OpType.UPDATE, OpType.INSERT, OpType.DELETE]
    assert "email" not in rows[0].after and "email" not in rows[1].after
    assert rows[2].after["email"] == "none" and rows[2].before["email"] == "none"
    assert rows[3].after == {"id": 3, "name": "bob", "score": decimal.Decimal("2.00"), "ts": None, "email": "b@x"}
    assert rows[4].before["email"] == "b@x" and rows[4].after is None
    assert len({id(r.schema) for r in rows}) == 2 and rows[0].schema != rows[2].schema


def test_nulls_and_absent_columns_in_one_table():
    m = TiDBMounter(store_with(tj.users_table()))
    values = [
        refcodec.row_v2({2: b"a", 3: None, 4: None, 5: b"e"}),  # two NULLs
        refcodec.row_v2({2: b"b"}),  # score, ts absent: nullable → NULL; email absent → default
        refcodec.row_v2({2: b"c", 3: None}),
        refcodec.row_v2({2: b"d", 3: None, 4: None, 5: b"f"}),  # the first header again
    ]
    rows = assert_same_as_one_by_one(m, [event(row_key(100, i), v, 10 + i) for i, v in enumerate(values)])
    assert rows[0].after == {"id": 0, "name": "a", "score": None, "ts": None, "email": "e"}
    assert rows[1].after == {"id": 1, "name": "b", "score": None, "ts": None, "email": "none"}
    # One layout per distinct header: the first and last rows share theirs.
    assert len(m._plan(m.schemas.table_for_row(100, 20), 100).layouts) == 3


@st.composite
def batches(draw):
    """Writes of the wide table (every type group), as inserts, updates and deletes, with NULLs and absent columns."""
    events = []
    for n in range(draw(st.integers(1, 12))):
        handle = draw(st.integers(-(1 << 63), (1 << 63) - 1))
        images = []
        for _ in range(2):
            raw = {}
            for i, (_, strategy, encode) in enumerate(ALL_TYPES):
                choice = draw(st.sampled_from(("value", "null", "absent")))
                if choice == "null":
                    raw[i + 2] = None
                elif choice == "value":
                    raw[i + 2] = encode(draw(strategy))
            doc = draw(st.none() | st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2))
            if doc is not None:
                tp, body = refcodec.json_bin(doc)
                raw[len(ALL_TYPES) + 2] = bytes([tp]) + body
            images.append(refcodec.row_v2(raw, checksum=draw(st.booleans())))
        kind = draw(st.sampled_from(("insert", "update", "delete", "bare delete")))
        key, ts = row_key(500, handle), 10 + n
        if kind == "insert":
            events.append(event(key, images[0], ts))
        elif kind == "update":
            events.append(event(key, images[1], ts, old_value=images[0]))
        elif kind == "delete":
            events.append(event(key, b"", ts, old_value=images[0], delete=True))
        else:
            events.append(event(key, b"", ts, delete=True))
    return events


@settings(max_examples=60, deadline=None)
@given(batches())
def test_every_type_group_batch_equals_one_by_one(events):
    store = store_with(wide_table())
    assert_same_as_one_by_one(TiDBMounter(store), events)


def test_paths_the_batch_leaves_to_the_one_row_mounter():
    """Large (4-byte id) and v1 values, bare deletes, unsigned handles, other keys, unknown tables."""
    data = tj.users_table()
    data["cols"][0]["type"]["Flag"] |= tj.UNSIGNED
    m = TiDBMounter(store_with(data))
    large = refcodec.row_v2({2: b"big", 3: None, 5: b"l@x"}, force_large=True)
    v1 = bytes.fromhex("08 04 02 06 61 6e 6e".replace(" ", ""))  # (2, "ann") as v1 datums
    index_key = b"t" + struct.pack(">Q", 100 + (1 << 63)) + b"_i" + struct.pack(">Q", 1 + (1 << 63)) + b"\x01x"
    events = [
        event(row_key(100, -1), users_value("u", "1"), 5),
        event(row_key(100, 2), large, 6),
        event(row_key(100, 3), v1, 7),
        event(row_key(100, 4), b"", 8, delete=True),
        event(index_key, b"\x00", 9),
        event(row_key(999, 1), users_value("x", "1"), 10),
        event(b"mDDLJobList", b"x", 11),
    ]
    rows = assert_same_as_one_by_one(m, events)
    assert rows[0].after["id"] == (1 << 64) - 1
    assert rows[1].after["name"] == "big" and rows[2].after["name"] == "ann"
    assert rows[3].before == {"id": 4}
    assert rows[4:] == [None, None, None]


def test_common_handle_rows_equal_one_by_one():
    cols = [
        tj.column(1, "region", 0, tj.field_type(15, tj.NOT_NULL | tj.PRI, 8, **tj.BIN)),
        tj.column(2, "seq", 1, tj.field_type(8, tj.NOT_NULL | tj.PRI, 20)),
        tj.column(3, "v", 2, tj.field_type(15, 0, 8, **tj.UTF8)),
    ]
    pk = tj.index(1, "PRIMARY", "events", [("region", 0), ("seq", 1)], primary=True)
    m = TiDBMounter(store_with(tj.table(7, "events", cols, [pk], common=True)))
    handle = b"\x01" + b"eu\x00\x00\x00\x00\x00\x00\xf9" + b"\x03" + struct.pack(">Q", 5 + (1 << 63))
    key = b"t" + struct.pack(">Q", 7 + (1 << 63)) + b"_r" + handle
    rows = assert_same_as_one_by_one(m, [event(key, refcodec.row_v2({3: b"hi"}), 50)])
    assert rows[0].after == {"region": b"eu", "seq": 5, "v": "hi"}


@pytest.mark.parametrize(
    "value",
    [
        b"\x80\x00\x01",  # truncated header
        refcodec.row_v2({2: b"\xff\xfe", 3: None}),  # invalid UTF-8 in varchar
        refcodec.row_v2({2: b"a", 3: b"\x0a\x02\x80"}),  # truncated decimal
        refcodec.row_v2({2: b"a", 4: b"\x01\x02\x03"}),  # 3-byte packed time
        refcodec.row_v2({2: b"a"}) + b"\x00",  # a stray byte after the data
        b"\x80\x00\x02\x00\x00\x00\x03\x02\x01\x00\x02\x00",  # column ids not ascending
        b"\x80\x00\x01\x00\x01\x00\x02\x02\x01\x00a",  # a column both NULL and not
        b"\x80\x00\x02\x00\x00\x00\x02\x03\x02\x00\x01\x00ab",  # end offsets out of order
    ],
)
def test_a_bad_value_in_a_batch_raises_the_one_row_error(value):
    m = TiDBMounter(store_with(tj.users_table()))
    good = event(row_key(100, 1), users_value("a", "1"), 100)
    bad = event(row_key(100, 42), value, 123456)
    with pytest.raises(RowDecodeError) as single:
        TiDBMounter(m.schemas).mount_row(bad)
    with pytest.raises(RowDecodeError) as many:
        m.mount_many([good, bad])
    assert type(many.value) is type(single.value)
    assert many.value.message == single.value.message and many.value.detail == single.value.detail


def test_an_unsupported_type_in_a_batch_raises_the_one_row_error():
    data = tj.users_table()
    data["cols"].append(tj.column(6, "geo", 5, tj.field_type(255, 0, -1, -1, "binary", "binary")))
    m = TiDBMounter(store_with(data))
    with pytest.raises(UnsupportedColumnTypeError) as info:
        m.mount_many([event(row_key(100, 1), refcodec.row_v2({2: b"a", 6: b"\x00\x01"}), 77)])
    assert "geo" in info.value.message and info.value.detail["commit_ts"] == 77


def test_batch_mounter_mount_many_after_pickling():
    m = TiDBMounter(users_history_store())
    batch = pickle.loads(pickle.dumps(asyncio.run(m.for_batch(150, 260))))
    value = users_value("c", "1", None, "c@x")
    events = [event(row_key(100, i), value, ts) for i, ts in enumerate((160, 200, 201, 260))]
    assert batch.mount_many(events) == [batch.mount(e) for e in events]
    assert all(r.schema in batch.schemas() for r in batch.mount_many(events))


def test_any_column_names_and_a_wide_table_decode_as_one_by_one():
    """Layouts are compiled per header: column names never reach their code, wide tables compile."""
    hostile = ['"}; raise SystemExit #', "value", "handle", "n0", "d1", "k2", "e0", "{x}", "'", "\\"]
    names = ["id", *hostile, *(f"c{i}" for i in range(len(hostile) + 2, 240))]
    cols = [tj.column(1, "id", 0, tj.field_type(8, tj.NOT_NULL | tj.PRI, 20))]
    for i, name in enumerate(names[1:], start=2):
        ft = tj.field_type(15, 0, 64, **tj.UTF8) if i % 3 else tj.field_type(8, 0, 20)
        cols.append(tj.column(i, name, i - 1, ft, origin_default="7" if i % 5 == 0 else None))
    m = TiDBMounter(store_with(tj.table(600, "wide", cols, pk_is_handle=True)))
    events = []
    for n in range(6):
        raw = {}
        for i in range(2, len(names) + 1):
            if (i + n) % 7 == 0:
                continue  # absent: its origin default
            if (i + n) % 11 == 0:
                raw[i] = None
            else:
                raw[i] = f"v{i}-{n}".encode() if i % 3 else refcodec.le_int(i * n - 50, True)
        events.append(event(row_key(600, n), refcodec.row_v2(raw), 10 + n))
    rows = assert_same_as_one_by_one(m, events)
    assert list(rows[0].after) == names
    assert rows[1].after['"}; raise SystemExit #'] == "v2-1" and rows[1].after["value"] == 3 * 1 - 50
