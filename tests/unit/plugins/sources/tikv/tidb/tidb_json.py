"""JSON documents shaped exactly like a TiDB status API serves them (hand-written
from TiDB's model structs: capitalised FieldType keys, is_unique/is_primary,
untagged binlog keys), independent of cdcflow's own to_json()."""


def ci(name):
    return {"O": name, "L": name.lower()}


def field_type(tp, flag=0, flen=-1, decimal=-1, charset="", collate="", elems=None):
    return {
        "Tp": tp,
        "Flag": flag,
        "Flen": flen,
        "Decimal": decimal,
        "Charset": charset,
        "Collate": collate,
        "Elems": elems,
        "ElemsIsBinaryLit": None,
        "Array": False,
    }


def column(cid, name, offset, ft, *, state=5, origin_default=None, default=None, generated="", stored=False):
    return {
        "id": cid,
        "name": ci(name),
        "offset": offset,
        "origin_default": origin_default,
        "origin_default_bit": None,
        "default": default,
        "default_bit": None,
        "default_is_expr": False,
        "generated_expr_string": generated,
        "generated_stored": stored,
        "dependences": None,
        "type": ft,
        "state": state,
        "comment": "",
        "hidden": False,
        "change_state_info": None,
        "version": 2,
    }


def index(iid, name, table, cols, *, unique=False, primary=False):
    return {
        "id": iid,
        "idx_name": ci(name),
        "tbl_name": ci(table),
        "idx_cols": [{"name": ci(n), "offset": o, "length": -1} for n, o in cols],
        "state": 5,
        "backfill_state": 0,
        "comment": "",
        "index_type": 1,
        "is_unique": unique,
        "is_primary": primary,
        "is_invisible": False,
        "is_global": False,
        "mv_index": False,
    }


def table(tid, name, cols, indices=(), *, pk_is_handle=False, common=False, partition=None):
    return {
        "id": tid,
        "name": ci(name),
        "charset": "utf8mb4",
        "collate": "utf8mb4_bin",
        "cols": list(cols),
        "index_info": list(indices) or None,
        "constraint_info": None,
        "fk_info": None,
        "state": 5,
        "pk_is_handle": pk_is_handle,
        "is_common_handle": common,
        "common_handle_version": 1 if common else 0,
        "comment": "",
        "auto_inc_id": 0,
        "auto_id_cache": 0,
        "auto_rand_id": 0,
        "max_col_id": max(c["id"] for c in cols),
        "max_idx_id": max((i["id"] for i in indices), default=0),
        "max_fk_id": 0,
        "max_cst_id": 0,
        "update_timestamp": 447000000000000000,
        "ShardRowIDBits": 0,
        "max_shard_row_id_bits": 0,
        "auto_random_bits": 0,
        "auto_random_range_bits": 0,
        "pre_split_regions": 0,
        "partition": partition,
        "compression": "",
        "view": None,
        "sequence": None,
        "Lock": None,
        "version": 5,
        "tiflash_replica": None,
        "is_columnar": False,
        "temp_table_type": 0,
        "cache_table_status": 0,
        "policy_ref_info": None,
        "stats_options": None,
        "exchange_partition_info": None,
        "ttl_info": None,
        "revision": 1,
    }


def database(did, name):
    return {
        "id": did,
        "db_name": ci(name),
        "charset": "utf8mb4",
        "collate": "utf8mb4_bin",
        "state": 5,
        "policy_ref_info": None,
        "Deprecated": {},
    }


def job(jid, action, schema_id, table_id, query, *, state=6, table_info=None, db_info=None, finished_ts=0, multi=None):
    return {
        "id": jid,
        "type": action,
        "schema_id": schema_id,
        "table_id": table_id,
        "schema_name": "shop",
        "table_name": table_info["name"]["O"] if table_info else "",
        "state": state,
        "warning": None,
        "err": None,
        "err_count": 0,
        "row_count": 0,
        "raw_args": None,
        "schema_state": 5,
        "snapshot_ver": 0,
        "real_start_ts": finished_ts - 10,
        "start_ts": finished_ts - 20,
        "dependency_id": 0,
        "query": query,
        "binlog": {
            "SchemaVersion": jid + 100,
            "DBInfo": db_info,
            "TableInfo": table_info,
            "FinishedTS": finished_ts,
            "MultipleTableInfos": multi,
        },
        "version": 1,
        "reorg_meta": None,
        "multi_schema_info": None,
        "priority": 0,
        "seq_num": jid,
        "charset": "utf8mb4",
        "collate": "utf8mb4_bin",
        "admin_operator": 0,
        "trace_info": None,
        "bdr_role": "",
        "cdc_write_source": 0,
        "local_mode": False,
        "sql_mode": 1436549152,
    }


# MySQL flags
NOT_NULL, PRI, UNIQ, MULT, UNSIGNED, BINARY = 1, 2, 4, 8, 32, 128
UTF8 = {"charset": "utf8mb4", "collate": "utf8mb4_bin"}
BIN = {"charset": "binary", "collate": "binary"}


def users_table(tid=100, *, with_email=True):
    """shop.users: id bigint PK (handle), name varchar(64) NOT NULL, score decimal(10,2),
    ts timestamp(3), [email varchar(128) UNIQUE NOT NULL default 'none'] added later."""
    cols = [
        column(1, "id", 0, field_type(8, NOT_NULL | PRI, 20, 0, "binary", "binary")),
        column(2, "name", 1, field_type(15, NOT_NULL | MULT, 64, 0, **UTF8)),
        column(3, "score", 2, field_type(246, 0, 10, 2, "binary", "binary")),
        column(4, "ts", 3, field_type(7, 0, 23, 3, "binary", "binary")),
    ]
    indices = [index(1, "k_name", "users", [("name", 1)])]
    if with_email:
        cols.append(
            column(
                5,
                "email",
                4,
                field_type(15, NOT_NULL | UNIQ, 128, 0, **UTF8),
                origin_default="none",
                default="none",
            )
        )
        indices.append(index(2, "u_email", "users", [("email", 4)], unique=True))
    return table(tid, "users", cols, indices, pk_is_handle=True)
