"""TiDBMounter: raw TiKV writes → RowChange / DDLEvent, with the schema at commit_ts − 1."""

import asyncio
import datetime as dt
import decimal
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.data.events import DDLEvent, OpType, RawKVEvent, Span
from cdcflow.core.errors import CdcflowError, Severity
from cdcflow.plugins.sources.tikv.tidb import ddl_job
from cdcflow.plugins.sources.tikv.tidb.ddl_job import DDLJob
from cdcflow.plugins.sources.tikv.tidb.mounter import RowDecodeError, TiDBMounter, UnsupportedColumnTypeError
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBDatabase, TiDBTable
from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore

from . import refcodec
from . import tidb_json as tj

SPAN = Span(100, b"", b"")


def row_key(table_id, handle):
    return b"t" + struct.pack(">Q", table_id + (1 << 63)) + b"_r" + struct.pack(">Q", handle + (1 << 63))


def users_value(name, score, ts=None, email=None):
    cols = {
        2: name.encode(),
        3: bytes([10, 2]) + refcodec.bin_decimal(decimal.Decimal(score), 10, 2),
        4: None if ts is None else refcodec.le_int(refcodec.packed_time(ts), False),
    }
    if email is not None:
        cols[5] = email.encode()
    return refcodec.row_v2(cols)


def store_with(table_json, ts=0, db="shop"):
    store = SchemaStore()
    store.add_database(TiDBDatabase(1, db))
    store.add_table(1, db, TiDBTable.from_json(table_json), ts)
    return store


def mount(mounter, **kw):
    event = RawKVEvent(span=SPAN, **{"old_value": b"", "start_ts": 90, "delete": False, **kw})
    return asyncio.run(mounter.mount_event(event))


def test_insert_update_delete():
    m = TiDBMounter(store_with(tj.users_table()))
    ts = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC)
    v1 = users_value("ann", "1.50", ts, "a@x")
    ins = mount(m, key=row_key(100, 7), value=v1, commit_ts=100)
    assert ins.op is OpType.INSERT and ins.before is None
    assert ins.after == {"id": 7, "name": "ann", "score": decimal.Decimal("1.50"), "ts": ts, "email": "a@x"}
    assert (ins.table.schema, ins.table.table, ins.commit_ts, ins.start_ts) == ("shop", "users", 100, 90)
    assert ins.schema.handle_key_columns() == ("id",)

    v2 = users_value("ann", "-2.25", None, "a@x")
    upd = mount(m, key=row_key(100, 7), value=v2, old_value=v1, commit_ts=110)
    assert upd.op is OpType.UPDATE
    assert upd.before["score"] == decimal.Decimal("1.50") and upd.after["score"] == decimal.Decimal("-2.25")
    assert upd.after["ts"] is None

    dele = mount(m, key=row_key(100, 7), value=b"", old_value=v2, delete=True, commit_ts=120)
    assert dele.op is OpType.DELETE and dele.after is None and dele.before["name"] == "ann"

    bare = mount(m, key=row_key(100, -3), value=b"", delete=True, commit_ts=130)
    assert bare.op is OpType.DELETE and bare.before == {"id": -3}


def test_missing_column_takes_origin_default():
    m = TiDBMounter(store_with(tj.users_table()))
    old_row = users_value("bob", "0", None)  # written before `email` existed
    change = mount(m, key=row_key(100, 1), value=old_row, commit_ts=100)
    assert change.after["email"] == "none"


def test_index_meta_and_unknown_keys_are_skipped():
    m = TiDBMounter(store_with(tj.users_table()))
    index_key = b"t" + struct.pack(">Q", 100 + (1 << 63)) + b"_i" + struct.pack(">Q", 1 + (1 << 63)) + b"\x01x"
    assert mount(m, key=index_key, value=b"\x00", commit_ts=100) is None
    assert mount(m, key=b"mDDLJobList", value=b"x", commit_ts=100) is None
    assert mount(m, key=row_key(999, 1), value=users_value("x", "1"), commit_ts=100) is None


def test_table_filter_skips_unreplicated_tables():
    m = TiDBMounter(store_with(tj.users_table()), replicate=lambda t: t.schema != "shop")
    assert mount(m, key=row_key(100, 1), value=users_value("x", "1"), commit_ts=100) is None
    assert asyncio.run(m.mount(RawKVEvent(SPAN, row_key(100, 1), users_value("x", "1"), b"", 90, 100))) is None


def test_schema_at_commit_ts_minus_one():
    store = store_with(tj.users_table(with_email=False))
    store.add_table(1, "shop", TiDBTable.from_json(tj.users_table()), 200)
    m = TiDBMounter(store)
    value = users_value("c", "1", None, "c@x")
    assert "email" not in mount(m, key=row_key(100, 1), value=value, commit_ts=200).after
    assert mount(m, key=row_key(100, 1), value=value, commit_ts=201).after["email"] == "c@x"


@pytest.mark.parametrize(
    "value",
    [
        b"\x80\x00\x01",  # truncated header
        refcodec.row_v2({2: b"\xff\xfe", 3: None}),  # invalid UTF-8 in varchar
        refcodec.row_v2({2: b"a", 3: b"\x0a\x02\x80"}),  # truncated decimal
        refcodec.row_v2({2: b"a", 4: b"\x01\x02\x03"}),  # 3-byte packed time
        b"\x08\x04\x7f",  # v1 row with a bad datum flag
    ],
)
def test_corrupt_values_raise_precise_errors(value):
    m = TiDBMounter(store_with(tj.users_table()))
    key = row_key(100, 42)
    with pytest.raises(RowDecodeError) as info:
        mount(m, key=key, value=value, commit_ts=123456)
    err = info.value
    assert isinstance(err, CdcflowError)
    assert err.severity is Severity.WARN
    assert key.hex() in err.message and "123456" in err.message and "shop.users" in err.message
    assert err.detail["key"] == key.hex() and err.detail["commit_ts"] == 123456 and err.detail["table"] == "shop.users"


def test_unknown_column_type_raises():
    data = tj.users_table()
    data["cols"].append(tj.column(6, "geo", 5, tj.field_type(255, 0, -1, -1, "binary", "binary")))
    m = TiDBMounter(store_with(data))
    value = refcodec.row_v2({2: b"a", 6: b"\x00\x01"})
    with pytest.raises(UnsupportedColumnTypeError) as info:
        mount(m, key=row_key(100, 1), value=value, commit_ts=77)
    assert "geo" in info.value.message and info.value.detail["commit_ts"] == 77


def test_common_handle_columns_come_from_the_key():
    cols = [
        tj.column(1, "region", 0, tj.field_type(15, tj.NOT_NULL | tj.PRI, 8, **tj.BIN)),
        tj.column(2, "seq", 1, tj.field_type(8, tj.NOT_NULL | tj.PRI, 20)),
        tj.column(3, "v", 2, tj.field_type(15, 0, 8, **tj.UTF8)),
    ]
    pk = tj.index(1, "PRIMARY", "events", [("region", 0), ("seq", 1)], primary=True)
    m = TiDBMounter(store_with(tj.table(7, "events", cols, [pk], common=True)))
    handle = b"\x01" + b"eu\x00\x00\x00\x00\x00\x00\xf9" + b"\x03" + struct.pack(">Q", 5 + (1 << 63))
    key = b"t" + struct.pack(">Q", 7 + (1 << 63)) + b"_r" + handle
    change = mount(m, key=key, value=refcodec.row_v2({3: b"hi"}), commit_ts=50)
    assert change.after == {"region": b"eu", "seq": 5, "v": "hi"}


def test_unsigned_pk_handle():
    data = tj.users_table()
    data["cols"][0]["type"]["Flag"] |= tj.UNSIGNED
    m = TiDBMounter(store_with(data))
    change = mount(m, key=row_key(100, -1), value=users_value("u", "1"), commit_ts=5)
    assert change.after["id"] == (1 << 64) - 1


# ----------------------------------------------------------------- DDL jobs


def job_row(table_id, job_json):
    """A tidb_ddl_job row as TiDB writes it: job_meta is column 5 (longblob)."""
    cols = {
        2: b"\x00",
        3: b"1",
        4: str(job_json["table_id"]).encode(),
        5: json.dumps(job_json).encode(),
        6: bytes([job_json["type"]]),
        7: b"\x01",
    }
    return row_key(table_id, job_json["id"]), refcodec.row_v2(cols)


def test_ddl_job_write_gives_exact_commit_ts_and_new_schema():
    store = store_with(tj.users_table(with_email=False))
    m = TiDBMounter(store)
    after = tj.users_table()
    job = tj.job(
        41, 5, 1, 100, "ALTER TABLE users ADD COLUMN email varchar(128)", state=4, table_info=after, finished_ts=999
    )
    key, value = job_row((1 << 48) - 2, job)
    ddl = mount(m, key=key, value=value, commit_ts=300, start_ts=290)
    assert isinstance(ddl, DDLEvent)
    assert (ddl.commit_ts, ddl.action_type, ddl.query) == (300, 5, job["query"])
    assert ddl.table.table == "users" and ddl.table.schema == "shop"
    assert [c.name for c in ddl.schema_after.columns][-1] == "email"
    # rows committed after the DDL decode with the new schema, earlier ones with the old
    row = users_value("d", "1", None, "d@x")
    assert "email" not in mount(m, key=row_key(100, 1), value=row, commit_ts=300).after
    assert mount(m, key=row_key(100, 1), value=row, commit_ts=301).after["email"] == "d@x"
    # the same job seen again (history table, or a replay) is not a second DDL
    assert mount(m, key=key, value=value, commit_ts=300) is None
    assert asyncio.run(m.mount(RawKVEvent(SPAN, key, value, b"", 290, 300))) is None


def test_ddl_job_states_and_deletes():
    m = TiDBMounter(store_with(tj.users_table()))
    running = tj.job(42, 7, 1, 100, "ALTER TABLE users ADD INDEX i(ts)", state=1, table_info=tj.users_table())
    key, value = job_row((1 << 48) - 2, running)
    assert mount(m, key=key, value=value, commit_ts=10) is None
    assert mount(m, key=key, value=b"", delete=True, commit_ts=11) is None
    # the history table counts only for CREATE TABLE in state synced
    hist = tj.job(43, 3, 1, 300, "CREATE TABLE t3 (id int primary key)", table_info=tj.users_table(300))
    hkey = row_key((1 << 48) - 4, 43)
    hvalue = refcodec.row_v2({2: json.dumps(hist).encode(), 3: b"shop", 4: b"t3"})
    ddl = mount(m, key=hkey, value=hvalue, commit_ts=20)
    assert ddl.action_type == 3 and ddl.commit_ts == 20
    assert mount(m, key=row_key(300, 1), value=users_value("e", "1"), commit_ts=21).table.table_id == 300


def test_drop_table_ddl_has_no_schema_after_and_stops_rows():
    m = TiDBMounter(store_with(tj.users_table()))
    job = tj.job(45, 4, 1, 100, "DROP TABLE users", state=4, table_info=tj.users_table())
    key, value = job_row((1 << 48) - 2, job)
    ddl = mount(m, key=key, value=value, commit_ts=700)
    assert ddl.action_type == 4 and ddl.schema_after is None and ddl.table.table == "users"
    assert mount(m, key=row_key(100, 1), value=users_value("x", "1"), commit_ts=700).table.table == "users"
    assert mount(m, key=row_key(100, 1), value=users_value("x", "1"), commit_ts=701) is None


def test_corrupt_ddl_job_raises():
    m = TiDBMounter(store_with(tj.users_table()))
    key = row_key((1 << 48) - 2, 44)
    with pytest.raises(RowDecodeError) as info:
        mount(m, key=key, value=refcodec.row_v2({5: b"{not json"}), commit_ts=9)
    assert info.value.detail["commit_ts"] == 9


def test_product_ddl_job_encoder_matches_reader():
    job = DDLJob.from_json(tj.job(50, 11, 1, 100, "TRUNCATE TABLE users", state=4, table_info=tj.users_table(101)))
    key, value = ddl_job.encode_job_write(job)
    assert key == row_key((1 << 48) - 2, 50)
    decoded = ddl_job.decode_job_write(key, value, start_ts=1, commit_ts=2)
    assert (decoded.id, decoded.type, decoded.finished_ts, decoded.start_ts) == (50, 11, 2, 1)
    assert decoded.table_info.id == 101
    store = store_with(tj.users_table())
    m = TiDBMounter(store)
    ddl = mount(m, key=key, value=value, commit_ts=500)
    assert ddl.action_type == 11
    assert mount(m, key=row_key(100, 1), value=users_value("x", "1"), commit_ts=501) is None
    assert mount(m, key=row_key(101, 1), value=users_value("x", "1"), commit_ts=501).table.table_id == 101
    hkey, hvalue = ddl_job.encode_history_write(
        DDLJob.from_json(tj.job(51, 3, 1, 5, "CREATE TABLE x", table_info=tj.users_table(5)))
    )
    assert ddl_job.decode_job_write(hkey, hvalue, start_ts=1, commit_ts=3).id == 51


# ----------------------------------------------------------------- property: whole rows


ALL_TYPES = [
    # (field type JSON, hypothesis strategy of decoded values, reference encoder)
    (tj.field_type(3, 0, 11), st.integers(-(1 << 31), (1 << 31) - 1), lambda v: refcodec.le_int(v, True)),
    (tj.field_type(8, tj.UNSIGNED, 20), st.integers(0, (1 << 64) - 1), lambda v: refcodec.le_int(v, False)),
    (tj.field_type(5, 0, 22), st.floats(allow_nan=False), refcodec.cmp_float),
    (
        tj.field_type(246, 0, 20, 4, "binary", "binary"),
        st.integers(-(10**20) + 1, 10**20 - 1).map(lambda i: decimal.Decimal(f"{i}E-4")),
        lambda v: bytes([20, 4]) + refcodec.bin_decimal(v, 20, 4),
    ),
    (tj.field_type(15, 0, 64, **tj.UTF8), st.text(max_size=20), str.encode),
    (tj.field_type(252, 0, 65535, **tj.BIN), st.binary(max_size=20), bytes),
    (tj.field_type(10, 0, 10, 0), st.dates(), lambda v: refcodec.le_int(refcodec.packed_time(v), False)),
    (tj.field_type(12, 0, 26, 6), st.datetimes(), lambda v: refcodec.le_int(refcodec.packed_time(v), False)),
    (
        tj.field_type(7, 0, 26, 6),
        st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2037, 1, 1), timezones=st.just(dt.UTC)),
        lambda v: refcodec.le_int(refcodec.packed_time(v), False),
    ),
    (
        tj.field_type(11, 0, 17, 6),
        st.integers(-(10**12), 10**12).map(lambda us: dt.timedelta(microseconds=us)),
        lambda v: refcodec.le_int((v // dt.timedelta(microseconds=1)) * 1000, True),
    ),
    (tj.field_type(247, 0, 1, elems=["a", "b", "c"]), st.integers(1, 3), lambda v: refcodec.le_int(v, False)),
    (tj.field_type(248, 0, 5, elems=["a", "b", "c"]), st.integers(0, 7), lambda v: refcodec.le_int(v, False)),
    (tj.field_type(16, tj.UNSIGNED, 64), st.integers(0, (1 << 64) - 1), lambda v: refcodec.le_int(v, False)),
]


@st.composite
def typed_rows(draw):
    values = {}
    for i, (_, strategy, _) in enumerate(ALL_TYPES):
        values[i + 2] = draw(st.none() | strategy)
    values[len(ALL_TYPES) + 2] = draw(
        st.none() | st.dictionaries(st.text(max_size=4), st.integers(-(1 << 63), (1 << 64) - 1), max_size=3)
    )
    return draw(st.integers(-(1 << 63), (1 << 63) - 1)), values


def wide_table():
    cols = [tj.column(1, "id", 0, tj.field_type(8, tj.NOT_NULL | tj.PRI, 20))]
    for i, (ft, _, _) in enumerate(ALL_TYPES):
        cols.append(tj.column(i + 2, f"c{i + 2}", i + 1, ft))
    n = len(ALL_TYPES) + 2
    cols.append(tj.column(n, f"c{n}", n - 1, tj.field_type(245, 0, -1, -1, "binary", "binary")))
    return tj.table(500, "wide", cols, pk_is_handle=True)


@settings(max_examples=60)
@given(typed_rows())
def test_every_type_mounts_back_to_its_value(case):
    handle, row = case
    m = TiDBMounter(store_with(wide_table()))
    raw = {}
    for cid, v in row.items():
        if v is None:
            raw[cid] = None
        elif cid - 2 < len(ALL_TYPES):
            raw[cid] = ALL_TYPES[cid - 2][2](v)
        else:
            tp, body = refcodec.json_bin(v)
            raw[cid] = bytes([tp]) + body
    change = mount(m, key=row_key(500, handle), value=refcodec.row_v2(raw), commit_ts=10)
    expected = {"id": handle, **{f"c{cid}": v for cid, v in row.items()}}
    json_col = f"c{len(ALL_TYPES) + 2}"
    got = dict(change.after)
    if got[json_col] is not None:
        got[json_col] = json.loads(got[json_col])
    assert got == expected


def test_batch_mounter_pickles_and_decodes_like_the_mounter_across_a_ddl():
    """What a Spark task gets: the versions valid in the batch's range, nothing else."""
    import pickle

    store = store_with(tj.users_table(with_email=False))
    store.add_table(1, "shop", TiDBTable.from_json(tj.users_table()), 200)
    m = TiDBMounter(store)
    batch = pickle.loads(pickle.dumps(asyncio.run(m.for_batch(150, 260))))
    value = users_value("c", "1", None, "c@x")
    for commit_ts in (160, 200, 201, 260):
        event = RawKVEvent(SPAN, row_key(100, 1), value, b"", 90, commit_ts)
        assert batch.mount(event) == mount(m, key=row_key(100, 1), value=value, commit_ts=commit_ts)
    # Both versions the range decodes with, and only those, are declared.
    assert sorted(len(s.columns) for s in batch.schemas()) == [4, 5]
    assert all(
        row.schema in batch.schemas() for row in [batch.mount(RawKVEvent(SPAN, row_key(100, 1), value, b"", 90, 201))]
    )
    # A range after the DDL ships only the new version.
    assert [len(s.columns) for s in asyncio.run(m.for_batch(300, 400)).schemas()] == [5]
    # DDL job keys are not rows: the source follows DDL itself.
    assert batch.mount(RawKVEvent(SPAN, b"mDDLJobList", b"x", b"", 90, 201)) is None
