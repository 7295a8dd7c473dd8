"""The shop workload, DDL jobs in TiKV, snapshot reads and the status API of the playground."""

from __future__ import annotations

import decimal
import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.rows import decode_row_value, encode_row_value
from cdcflow.plugins.sources.playground.shop import SHOP_TABLES
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, pdpb_pb2
from cdcflow.plugins.sources.tikv.tidb.ddl_job import ddl_spans, decode_job_write
from cdcflow.plugins.sources.tikv.tidb.keys import encode_bytes, record_key, table_record_span
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBTable

from .feed_client import PD, Event, Feed, rows_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=3, seed=11, ddl_every=40, split_keys=300) as playground:
        playground.run_workload(240)
        yield playground


def get(pg: Playground, path: str) -> tuple[int, str, Any]:
    try:
        with urllib.request.urlopen(f"http://{pg.status_address}{path}") as response:
            body = response.read().decode()
            return response.status, response.headers["Content-Type"], json.loads(body)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_same_seed_same_committed_rows() -> None:
    def rows(seed: int) -> dict[str, list[dict[str, Any]]]:
        with Playground(stores=1, seed=seed, ddl_every=25) as pg:
            pg.run_workload(120)
            return {t: pg.snapshot(t) for t in SHOP_TABLES}

    first = rows(5)
    assert first == rows(5)
    assert sum(len(v) for v in first.values()) > 50


def _expected(pg: Playground, table: str) -> list[dict[str, Any]]:
    """The planner's own model of the table, in the decoded value forms."""
    definition = pg.catalog.find("shop", table)
    out = []
    for handle, row in sorted(pg.workload.planner._rows[table].items()):
        decoded: dict[str, Any] = {"id": handle}
        for column in definition.columns[1:]:
            value = row.get(column.name)
            if value is not None and column.ft.tp == TypeCode.ENUM:
                value = column.ft.elems.index(value) + 1
            if value is not None and column.ft.tp == TypeCode.JSON:
                value = json.dumps(value)
            decoded[column.name] = value
        out.append(decoded)
    return out


def _normal(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: json.loads(v) if k == "profile" and v is not None else v for k, v in r.items()} for r in rows]


def test_snapshot_equals_the_committed_state(pg: Playground) -> None:
    for table in SHOP_TABLES:
        assert _normal(pg.snapshot(table)) == _normal(_expected(pg, table)), table
    balance = pg.snapshot("customers")[0]["balance"]
    assert isinstance(balance, decimal.Decimal)


def test_snapshot_at_an_earlier_ts_does_not_see_later_writes(pg: Playground) -> None:
    before = pg.now()
    rows_before = pg.snapshot("orders", before)
    txn = pg.begin()
    table = pg.catalog.find("shop", "orders")
    handle = 10_000_000
    values = {"customer_id": 1, "product_id": 2, "quantity": 3, "amount": decimal.Decimal("4.50"), "status": "paid"}
    txn.put(record_key(table.id, handle), encode_row_value(table, values))
    txn.commit()
    assert pg.snapshot("orders", before) == rows_before
    after = {r["id"]: r for r in pg.snapshot("orders")}
    assert after[handle]["amount"] == decimal.Decimal("4.50") and after[handle]["status"] == 2
    assert after[handle]["note"] is None
    txn = pg.begin()
    txn.delete(record_key(table.id, handle))
    txn.commit()


def test_regions_split_as_tables_grow_and_transactions_span_regions(pg: Playground) -> None:
    regions = pg.regions()
    assert len(regions) > 4  # one per table at CREATE TABLE, then splits at 300 keys
    for left, right in itertools.pairwise(regions):
        assert left.end == right.start
    assert all(r.version >= 2 for r in regions)
    # A multi-table plan touches keys of several regions.
    located = {pg.cluster.regions.locate(encode_bytes(table_record_span(pg.table_id(t))[0])).id for t in SHOP_TABLES}
    assert len(located) == len(SHOP_TABLES)


def test_ddl_jobs_are_rows_in_tikv_with_the_exact_commit_ts(pg: Playground) -> None:
    """The TiKV source's own DDL-job reader finds every DDL at the commit ts its schema went live."""
    found: dict[int, Any] = {}
    pd = PD(pg)
    try:
        for start, end in ddl_spans():
            region = pd.region(start).region
            feed = Feed(pd.store_address(pd.region(start).leader.store_id))
            try:
                feed.send(
                    cdcpb_pb2.ChangeDataRequest(
                        header=cdcpb_pb2.Header(cluster_id=pg.cluster_id),
                        region_id=region.id,
                        region_epoch=region.region_epoch,
                        checkpoint_ts=0,
                        start_key=max(region.start_key, encode_bytes(start)),
                        end_key=encode_bytes(end),
                        request_id=1,
                    )
                )
                feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
                for row in rows_of(feed.messages, Event.COMMITTED):
                    value = row.value if row.op_type == Event.Row.PUT else b""
                    job = decode_job_write(row.key, value, start_ts=row.start_ts, commit_ts=row.commit_ts)
                    if job is not None:
                        found.setdefault(job.id, job)  # the first write of a job is the one that counts
            finally:
                feed.close()
    finally:
        pd.close()
    assert len(found) == len(pg.catalog.jobs) >= 3 + 240 // 40
    history = {j["id"]: j for j in get(pg, "/ddl/history")[2]}
    for recorded in pg.catalog.jobs:
        job = found[recorded.id]
        assert job.finished_ts == recorded.commit_ts  # stamped by the reader with the write's commit ts
        assert job.table_info is not None and job.table_info.id == recorded.table_id
        assert history[recorded.id]["binlog"]["FinishedTS"] > recorded.commit_ts  # as in TiDB: not exact
        # The new schema is in force from exactly the job's commit ts.
        assert pg.catalog.version_at(recorded.table_id, recorded.commit_ts).schema_version == recorded.schema_version
        if recorded.type != 3:
            before = pg.catalog.version_at(recorded.table_id, recorded.commit_ts - 1)
            assert before is not None and before.schema_version < recorded.schema_version


def test_the_tikv_source_parses_the_served_schemas(pg: Playground) -> None:
    tables = {t["name"]["O"]: TiDBTable.from_json(t) for t in get(pg, "/schema/shop")[2]}
    customers = tables["customers"]
    assert customers.pk_is_handle and customers.primary_index() is not None
    definition = pg.catalog.find("shop", "customers")
    assert [(c.id, c.name, c.type) for c in customers.columns] == [(c.id, c.name, c.ft) for c in definition.columns]
    schema = customers.table_schema("shop")
    assert schema.handle_key_columns() == ("id",)


def test_feed_replay_equals_the_snapshot(pg: Playground) -> None:
    """Every committed change of a table, read through EventFeed, rebuilds the snapshot."""
    table = pg.catalog.find("shop", "customers")
    start, end = (encode_bytes(k) for k in table_record_span(table.id))
    ts = pg.now()
    latest: dict[bytes, tuple[int, bytes]] = {}
    pd = PD(pg)
    try:
        for region in pg.cluster.regions.overlapping(start, end):
            meta = pd.stub.GetRegionByID(pdpb_pb2.GetRegionByIDRequest(header=pd.header, region_id=region.id))
            feed = Feed(pd.store_address(meta.leader.store_id))
            try:
                feed.send(
                    cdcpb_pb2.ChangeDataRequest(
                        header=cdcpb_pb2.Header(cluster_id=pg.cluster_id),
                        region_id=region.id,
                        region_epoch=meta.region.region_epoch,
                        checkpoint_ts=0,
                        start_key=max(start, region.start),
                        end_key=min(end, region.end) if region.end else end,
                        request_id=1,
                    )
                )
                feed.wait_for(lambda m: rows_of(m, Event.INITIALIZED))
                for row in rows_of(feed.messages, Event.COMMITTED):
                    if row.commit_ts <= ts and row.commit_ts > latest.get(row.key, (0, b""))[0]:
                        latest[row.key] = (row.commit_ts, row.value if row.op_type == Event.Row.PUT else b"")
            finally:
                feed.close()
    finally:
        pd.close()
    replayed = [
        decode_row_value(pg.catalog.find("shop", "customers", ts), key, value)
        for key, (_, value) in sorted(latest.items())
        if value
    ]
    assert replayed == pg.snapshot("customers", ts)


def test_status_api_shapes(pg: Playground) -> None:
    status, ctype, dbs = get(pg, "/schema")
    assert status == 200 and ctype == "application/json"
    assert [(d["db_name"]["O"], d["state"]) for d in dbs] == [("shop", 5)]
    status, _, tables = get(pg, "/schema/SHOP")  # names match case-insensitively
    assert status == 200 and {t["name"]["L"] for t in tables} == set(SHOP_TABLES)
    customers = next(t for t in tables if t["name"]["O"] == "customers")
    assert customers["pk_is_handle"] is True and customers["is_common_handle"] is False
    assert customers["index_info"][0]["is_primary"] is True and "primary" not in customers["index_info"][0]
    col = customers["cols"][3]
    assert set(col["type"]) >= {"Tp", "Flag", "Flen", "Decimal", "Charset", "Collate", "Elems"}
    assert (col["name"]["O"], col["type"]["Tp"], col["type"]["Decimal"]) == ("balance", 246, 2)
    assert [c["offset"] for c in customers["cols"]] == list(range(len(customers["cols"])))
    assert customers["max_col_id"] == max(c["id"] for c in customers["cols"])

    assert get(pg, "/schema/shop/Customers")[2] == customers
    assert get(pg, f"/schema?table_id={customers['id']}")[2] == customers
    db_table = get(pg, f"/db-table/{customers['id']}")[2]
    assert db_table["db_info"]["db_name"]["L"] == "shop" and db_table["table_info"] == customers

    assert get(pg, "/schema/nope") == (400, "text/plain", "[schema:1049]Unknown database 'nope'")
    assert get(pg, "/schema/shop/nope")[0::2] == (400, "[schema:1146]Table 'shop.nope' doesn't exist")
    assert get(pg, "/schema?table_id=999999")[0::2] == (400, "[schema:1146]Table which ID = 999999 does not exist.")
    assert get(pg, "/no/such/path")[0] == 404


def test_ddl_history_is_newest_first_with_paging(pg: Playground) -> None:
    status, _, jobs = get(pg, "/ddl/history")
    assert status == 200
    ids = [j["id"] for j in jobs]
    assert ids == sorted(ids, reverse=True) and len(ids) == len(pg.catalog.jobs)
    assert {"id", "type", "schema_id", "table_id", "state", "query", "binlog", "start_ts"} <= set(jobs[0])
    assert set(jobs[0]["binlog"]) == {"SchemaVersion", "DBInfo", "TableInfo", "FinishedTS", "MultipleTableInfos"}
    page = get(pg, f"/ddl/history?start_job_id={ids[1]}&limit=2")[2]
    assert [j["id"] for j in page] == ids[1:3]
    assert get(pg, "/ddl/history?limit=0")[0] == 400
    assert get(pg, "/ddl/history?start_job_id=5")[0::2] == (
        400,
        "when 'start_job_id' is specified, it must work with a 'limit'",
    )
    creates = [j for j in jobs if j["type"] == 3]
    assert {j["table_name"] for j in creates} == set(SHOP_TABLES)


def test_workload_runs_at_a_rate_in_the_background() -> None:
    with Playground(stores=1, seed=1, rate=200) as pg:
        deadline = pg.now()
        while pg.workload.stats.transactions < 20:
            pg.workload._stop.wait(0.05)
        stats = pg.stop_workload()
        assert stats.transactions >= 20 and stats.last_commit_ts > deadline
        assert not pg.workload.running


def test_regions_split_by_size_too() -> None:
    with Playground(stores=1, seed=2, split_keys=100_000, split_bytes=20_000, ddl_every=0) as pg:
        before = len(pg.regions())
        pg.run_workload(150)
        assert len(pg.regions()) > before
        for table in SHOP_TABLES:  # splits move no data
            assert _normal(pg.snapshot(table)) == _normal(_expected(pg, table))


def test_the_tikv_sources_status_client_reads_the_playground(pg: Playground) -> None:
    import asyncio

    from cdcflow.plugins.sources.tikv.tidb.status_api import StatusAPIClient, TiDBObjectNotFoundError

    async def read() -> None:
        async with StatusAPIClient(pg.status_address) as client:
            assert [d.name for d in await client.databases()] == ["shop"]
            tables = {t.name: t for t in await client.tables("shop")}
            assert set(tables) == set(SHOP_TABLES)
            orders = await client.table("shop", "orders")
            assert orders is not None and orders.id == pg.table_id("orders")
            assert await client.table("shop", "missing") is None
            assert (await client.table_by_id(orders.id)) == orders
            with pytest.raises(TiDBObjectNotFoundError):
                await client.tables("nope")
            jobs = await client.ddl_jobs_since(0, page=2)
            assert [j.id for j in jobs] == sorted(j.id for j in pg.catalog.jobs)
            assert all(j.is_done for j in jobs)

    asyncio.run(read())
