import decimal
import json

from cdcflow.core.data.events import ColumnInfo, DDLEvent, OpType, RowChange, TableName, TableSchema, tso_from_ms
from cdcflow.plugins.codecs.canal_json import CanalJsonCodec, CanalJsonConfig

T = TableName("test", "tp_int", 3)
PK = ColumnInfo.HANDLE_KEY | ColumnInfo.PRIMARY_KEY
SCHEMA = TableSchema(
    T,
    (
        ColumnInfo("id", 3, PK),
        ColumnInfo("c_tinyint", 1, ColumnInfo.NULLABLE | ColumnInfo.UNSIGNED),
        ColumnInfo("c_price", 246, ColumnInfo.NULLABLE),
        ColumnInfo("c_blob", 252, ColumnInfo.NULLABLE | ColumnInfo.BINARY),
        ColumnInfo("c_text", 252, ColumnInfo.NULLABLE),
    ),
)
COMMIT = tso_from_ms(1639633141221, 7)


def codec(**options):
    c = CanalJsonCodec(CanalJsonConfig(**options))
    c.clock = lambda: 1639633142960
    return c


def test_update_golden_bytes_with_tidb_extension():
    before = {"id": 2, "c_tinyint": 127, "c_price": decimal.Decimal("1.50"), "c_blob": b"\xff\x00", "c_text": "é"}
    after = dict(before, c_tinyint=200)
    [message] = codec(enable_tidb_extension=True).encode_rows(
        [RowChange(T, OpType.UPDATE, COMMIT, 1, after, before, SCHEMA)]
    )
    assert message.key is None
    assert message.value == (
        b'{"id":0,"database":"test","table":"tp_int","pkNames":["id"],"isDdl":false,"type":"UPDATE",'
        b'"es":1639633141221,"ts":1639633142960,"sql":"",'
        b'"sqlType":{"id":4,"c_tinyint":5,"c_price":3,"c_blob":2004,"c_text":2005},'
        b'"mysqlType":{"id":"int","c_tinyint":"tinyint unsigned","c_price":"decimal","c_blob":"blob","c_text":"text"},'
        b'"data":[{"id":"2","c_tinyint":"200","c_price":"1.50","c_blob":"\xc3\xbf\\u0000","c_text":"\xc3\xa9"}],'
        b'"old":[{"id":"2","c_tinyint":"127","c_price":"1.50","c_blob":"\xc3\xbf\\u0000","c_text":"\xc3\xa9"}],'
        b'"_tidb":{"commitTs":' + str(COMMIT).encode() + b"}}"
    )


def test_delete_has_row_in_data_and_null_old_without_extension():
    [message] = codec().encode_rows([RowChange(T, OpType.DELETE, COMMIT, 1, None, {"id": 9}, SCHEMA)])
    doc = json.loads(message.value)
    assert doc["type"] == "DELETE" and doc["data"] == [{"id": "9"}] and doc["old"] is None and "_tidb" not in doc


def test_ddl_and_watermark():
    ddl = json.loads(codec(enable_tidb_extension=True).encode_ddl(DDLEvent(COMMIT, "TRUNCATE TABLE t", T, 11)).value)
    assert (ddl["isDdl"], ddl["type"], ddl["sql"], ddl["_tidb"]) == (
        True,
        "TRUNCATE",
        "TRUNCATE TABLE t",
        {"commitTs": COMMIT},
    )
    assert codec().encode_resolved(COMMIT) is None
    mark = json.loads(codec(enable_tidb_extension=True).encode_resolved(COMMIT).value)
    assert (mark["type"], mark["_tidb"], mark["data"]) == ("TIDB_WATERMARK", {"watermarkTs": COMMIT}, None)


def test_enum_and_set_members_and_unsigned_type_names_from_sql_type():
    from cdcflow.plugins.codecs.canal_json import canal_value, mysql_type_name

    enum = ColumnInfo("e", 247, sql_type="enum('a','it''s')")
    assert canal_value(enum, 2) == "it's" and canal_value(enum, 0) == ""
    assert canal_value(ColumnInfo("s", 248, sql_type="set('x','y','z')"), 0b101) == "x,z"
    assert canal_value(ColumnInfo("s", 248), 5) == "5"
    assert mysql_type_name(ColumnInfo("i", 3, ColumnInfo.UNSIGNED, sql_type="int(10) unsigned")) == "int unsigned"
    assert mysql_type_name(ColumnInfo("d", 246, sql_type="decimal(10,2) unsigned")) == "decimal"
    assert mysql_type_name(ColumnInfo("v", 15, ColumnInfo.BINARY)) == "varbinary"
