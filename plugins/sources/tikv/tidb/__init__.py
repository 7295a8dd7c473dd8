"""TiDB's data format on TiKV: keys, row values, table schemas and DDL jobs.

Modules (import them directly; this package imports nothing heavy):

* :mod:`.keys` — comparable ints, record/index keys, memcomparable bytes;
* :mod:`.keydatum` — flag-prefixed datums inside keys (common handles);
* :mod:`.rowcodec` — row values (format v2 encode/decode, v1 decode);
* :mod:`.values` — one column value ↔ Python value, per column type;
* :mod:`.schema` — TableInfo / ColumnInfo / FieldType JSON models;
* :mod:`.status_api` — the TiDB status-port HTTP client;
* :mod:`.schema_store` — table schemas over time;
* :mod:`.ddl_job` — DDL job writes in TiKV (the exact DDL commit ts);
* :mod:`.mounter` — raw key-value events → row changes and DDL events.
"""
