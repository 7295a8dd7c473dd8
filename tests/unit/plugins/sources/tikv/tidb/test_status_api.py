"""The status-API client and SchemaStore.load against a real HTTP server that
answers like TiDB: one-space-indented JSON on 200, plain-text 400s with the
schema error codes, /ddl/history newest first with limit/start_job_id rules."""

import asyncio
import json
import socket

import pytest
from aiohttp import web

from cdcflow.plugins.sources.tikv.tidb.schema_store import SchemaStore
from cdcflow.plugins.sources.tikv.tidb.status_api import (
    StatusAPIClient,
    StatusAPIUnavailableError,
    TiDBObjectNotFoundError,
)

from . import tidb_json as tj

BIG_TS = 450_000_000_000_000_123  # > 2^53: must survive JSON parsing exactly


class FakeTiDB:
    """The handlers of TiDB's status port that cdcflow uses, over a small catalogue."""

    def __init__(self):
        self.dbs = [tj.database(1, "shop"), tj.database((1 << 62) + 1, "INFORMATION_SCHEMA")]
        users_v1 = tj.users_table(with_email=False)
        users_v2 = tj.users_table()
        users_v2["update_timestamp"] = BIG_TS
        self.tables = {"shop": [users_v2, tj.users_table(101) | {"name": tj.ci("orders")}]}
        self.jobs = [
            tj.job(
                i, 3, 1, 90 + i, f"CREATE TABLE t{i} (id int)", table_info=tj.users_table(90 + i), finished_ts=1000 + i
            )
            for i in range(1, 6)
        ]
        self.jobs.append(tj.job(7, 3, 1, 100, "CREATE TABLE users (...)", table_info=users_v1, finished_ts=1500))
        self.jobs.append(
            tj.job(9, 5, 1, 100, "ALTER TABLE users ADD COLUMN email ...", table_info=users_v2, finished_ts=BIG_TS)
        )
        self.jobs.append(tj.job(10, 7, 1, 100, "ALTER TABLE users ADD INDEX x", state=3, table_info=users_v2))
        self.requests = []
        self.fail_next = 0

    @staticmethod
    def ok(data):
        return web.Response(text=json.dumps(data, indent=1), content_type="application/json")

    @staticmethod
    def bad(text):
        return web.Response(status=400, text=text)

    async def schema(self, request):
        self.requests.append(str(request.rel_url))
        if self.fail_next:
            self.fail_next -= 1
            return web.Response(status=503, text="busy")
        if "table_id" in request.query:
            raw = request.query["table_id"]
            if not raw.lstrip("-").isdigit():
                return self.bad(f'strconv.ParseInt: parsing "{raw}": invalid syntax')
            for t in self.tables["shop"]:
                if t["id"] == int(raw):
                    return self.ok(t)
            return self.bad(f"[schema:1146]Table which ID = {raw} does not exist.")
        return self.ok(self.dbs)

    async def schema_db(self, request):
        db = request.match_info["db"].lower()
        if db not in self.tables:
            return self.bad(f"[schema:1049]Unknown database '{request.match_info['db']}'")
        return self.ok(self.tables[db])

    async def schema_table(self, request):
        db, name = request.match_info["db"].lower(), request.match_info["table"].lower()
        for t in self.tables.get(db, []):
            if t["name"]["L"] == name:
                return self.ok(t)
        return self.bad(f"[schema:1146]Table '{db}.{name}' doesn't exist")

    async def db_table(self, request):
        tid = int(request.match_info["id"])
        for t in self.tables["shop"]:
            if t["id"] == tid:
                return self.ok({"db_info": self.dbs[0], "table_info": t, "schema_version": 55})
        return self.bad(f"[schema:1146]Table which ID = {tid} does not exist.")

    async def history(self, request):
        self.requests.append(str(request.rel_url))
        q = request.query
        jobs = sorted(self.jobs, key=lambda j: -j["id"])
        limit = 2048
        if "limit" in q:
            limit = int(q["limit"])
            if not 0 < limit <= 2048:
                return self.bad("ddl history limit must be greater than 0 and less than or equal to 2048")
        if "start_job_id" in q:
            if "limit" not in q:
                return self.bad("when 'start_job_id' is specified, it must work with a 'limit'")
            start = int(q["start_job_id"])
            if start < 1:
                return self.bad("ddl history start_job_id must be greater than 0")
            jobs = [j for j in jobs if j["id"] <= start]
        return self.ok(jobs[:limit])

    def app(self):
        app = web.Application()
        app.router.add_get("/schema", self.schema)
        app.router.add_get("/schema/{db}", self.schema_db)
        app.router.add_get("/schema/{db}/{table}", self.schema_table)
        app.router.add_get("/db-table/{id}", self.db_table)
        app.router.add_get("/ddl/history", self.history)
        return app


async def with_server(fake, body):
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with StatusAPIClient(f"127.0.0.1:{port}") as client:
            return await body(client)
    finally:
        await runner.cleanup()


def run(fake, body):
    return asyncio.run(with_server(fake, body))


def test_schemas():
    async def body(client):
        dbs = await client.databases()
        assert [d.name for d in dbs] == ["shop", "INFORMATION_SCHEMA"]
        assert dbs[1].is_memory_schema
        tables = await client.tables("SHOP")
        assert [t.name for t in tables] == ["users", "orders"]
        assert tables[0].update_timestamp == BIG_TS
        assert (await client.table("shop", "Users")).id == 100
        assert await client.table("shop", "nope") is None
        assert await client.table("nodb", "users") is None
        assert (await client.table_by_id(101)).name == "orders"
        assert await client.table_by_id(5) is None
        db, t = await client.db_table(101)
        assert (db.name, t.name) == ("shop", "orders")
        assert await client.db_table(6) is None
        with pytest.raises(TiDBObjectNotFoundError):
            await client.tables("nodb")

    run(FakeTiDB(), body)


def test_ddl_history_paging_and_params():
    fake = FakeTiDB()

    async def body(client):
        page = await client.ddl_history(limit=2)
        assert [j.id for j in page] == [10, 9]
        assert page[1].finished_ts == BIG_TS
        assert [j.id for j in await client.ddl_history(limit=3, start_job_id=6)] == [5, 4, 3]
        fake.requests.clear()
        jobs = await client.ddl_jobs_since(2, page=2)
        assert [j.id for j in jobs] == [3, 4, 5, 7, 9, 10]
        assert fake.requests == [
            "/ddl/history?limit=2",
            "/ddl/history?limit=2&start_job_id=8",
            "/ddl/history?limit=2&start_job_id=4",
        ]
        with pytest.raises(ValueError):
            await client.ddl_history(limit=0)
        with pytest.raises(ValueError):
            await client.ddl_history(start_job_id=3)

    run(fake, body)


def test_server_errors_are_unavailable_not_missing():
    async def body(client):
        with pytest.raises(StatusAPIUnavailableError) as info:
            await client._get("/schema", {"table_id": "abc"})
        assert "400" in info.value.message

    run(FakeTiDB(), body)


def test_unreachable_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def body():
        async with StatusAPIClient(f"127.0.0.1:{port}", timeout=5) as client:
            with pytest.raises(StatusAPIUnavailableError) as info:
                await client.databases()
            assert info.value.retryable.value == "RETRY"

    asyncio.run(body())


def test_schema_store_load_then_exact_ddl_ts():
    fake = FakeTiDB()

    async def body(client):
        store = SchemaStore()
        await store.load(client, start_ts=2000)
        return store

    store = run(fake, body)
    # before the ADD COLUMN (finished after the start ts) users has no email column
    v = store.table_for_row(100, 2001)
    assert v.db_name == "shop" and "email" not in [c.name for c in v.table.columns]
    assert not v.exact
    # provisional version at FinishedTS
    assert "email" in [c.name for c in store.table_for_row(100, BIG_TS + 1).table.columns]
    # the job's write observed in TiKV moves the version to the exact commit ts
    from cdcflow.plugins.sources.tikv.tidb.ddl_job import DDLJob

    job = DDLJob.from_json(fake.jobs[6])
    assert store.apply_job(job, 3000)
    assert "email" in [c.name for c in store.table_for_row(100, 3001).table.columns]
    assert "email" not in [c.name for c in store.table_for_row(100, 3000).table.columns]
    assert store.table_for_row(100, 3001).exact
    assert not store.apply_job(job, 3000)
    assert store.table_for_row(101, 10).table.name == "orders"
    assert store.table_for_row((1 << 62) + 1, 10) is None
    # the range around a ts with the same version: from that version's ts to the next one's
    for ts in (2000, 2999, 3000, 3001, 10**6):
        version, low, high = store.table_between(100, ts)
        assert version is store.table_at(100, ts) and low <= ts < high
        assert store.table_at(100, low) is version and store.table_at(100, high - 1) is version
        assert high == 1 << 64 or store.table_at(100, high) is not version
    assert store.table_between((1 << 62) + 1, 10) == (None, 10, 11)
    names = [(v.db_name, v.table.name) for v in store.live_tables(5000)]
    assert ("shop", "users") in names and ("shop", "orders") in names


def test_schema_store_settles_jobs_whose_write_precedes_the_start():
    fake = FakeTiDB()

    async def body(client):
        store = SchemaStore()
        await store.load(client, start_ts=2000)
        return store

    store = run(fake, body)
    assert "email" not in [c.name for c in store.table_for_row(100, 2001).table.columns]
    assert store.settle(BIG_TS - 1) == 0  # the write may still come
    assert store.settle(BIG_TS) == 1  # resolved past FinishedTS without it: it was at or below 2000
    version = store.table_for_row(100, 2001)
    assert version.exact and "email" in [c.name for c in version.table.columns]
    assert store.settle(BIG_TS + 5) == 0


def test_5xx_is_retried_then_raised():
    fake = FakeTiDB()

    async def body(client):
        fake.fail_next = 2
        assert (await client.databases())[0].name == "shop"  # the third attempt gets an answer
        fake.fail_next = 3
        with pytest.raises(StatusAPIUnavailableError) as info:
            await client.databases()
        assert info.value.detail["status"] == 503

    run(fake, body)


def test_schema_store_resolves_an_unknown_id():
    async def body(client):
        store = SchemaStore()
        assert await store.resolve(client, 101)
        assert store.table_for_row(101, 5).table.name == "orders"
        assert store.database_name(1) == "shop"
        assert not await store.resolve(client, 4040)

    run(FakeTiDB(), body)


def test_schema_store_load_lists_tables_as_they_were_at_the_start():
    """A table created after the start ts did not exist then (no base version); one dropped
    after it did (its last version before the start, from the history)."""
    from cdcflow.core.data.events import DDLEvent, TableName, TableSetChange
    from cdcflow.plugins.sources.tikv.catalog import TiDBCatalog
    from cdcflow.plugins.sources.tikv.tidb.ddl_job import DDLJob

    fake = FakeTiDB()
    late = tj.users_table(300) | {"name": tj.ci("late")}
    gone = tj.users_table(301) | {"name": tj.ci("gone")}
    fake.tables["shop"].append(late)
    create = tj.job(20, 3, 1, 300, "CREATE TABLE late (...)", table_info=late, finished_ts=2600)
    drop = tj.job(22, 4, 1, 301, "DROP TABLE gone", table_info=gone, finished_ts=2700)
    fake.jobs += [create, tj.job(21, 3, 1, 301, "CREATE TABLE gone (...)", table_info=gone, finished_ts=1800), drop]

    async def body(client):
        store = SchemaStore()
        await store.load(client, start_ts=2000)
        return store

    store = run(fake, body)

    def names(ts):
        return {v.table.name for v in store.live_tables(ts)}

    assert "late" not in names(2000) and "gone" in names(2000)
    assert "late" in names(2600) and "gone" not in names(2700)  # provisionally, at FinishedTS

    # The jobs' writes seen at their exact commit ts: the table set changes there.
    assert store.apply_job(DDLJob.from_json(create), 2400)
    assert store.apply_job(DDLJob.from_json(drop), 2450)
    assert store.tables_changed_at(2400) == ({}, {300: (TableName("shop", "late", 300), (300,))})
    assert store.tables_changed_at(2450) == ({301: (TableName("shop", "gone", 301), (301,))}, {})
    assert store.tables_changed_at(2401) == ({}, {})

    async def changes():
        catalog = TiDBCatalog("127.0.0.1:1")
        catalog.schemas = store
        try:
            return [catalog.table_set_change(DDLEvent(ts, q)) for ts, q in ((2400, "c"), (2450, "d"), (2401, "x"))]
        finally:
            await catalog.close()

    assert asyncio.run(changes()) == [
        TableSetChange(2400, created=(TableName("shop", "late", 300),), query="c"),
        TableSetChange(2450, dropped=(TableName("shop", "gone", 301),), query="d"),
        None,
    ]


def test_truncate_and_rename_change_the_table_set_add_column_does_not():
    from cdcflow.core.data.events import TableName
    from cdcflow.plugins.sources.tikv.tidb.ddl_job import DDLJob

    fake = FakeTiDB()
    users = tj.users_table()
    truncated = tj.users_table(400)
    renamed = tj.users_table(400) | {"name": tj.ci("people")}

    async def body(client):
        store = SchemaStore()
        await store.load(client, start_ts=BIG_TS + 10)
        return store

    store = run(fake, body)
    add_column = DDLJob.from_json(tj.job(30, 5, 1, 100, "ALTER TABLE users ADD x", table_info=users))
    truncate = DDLJob.from_json(tj.job(31, 11, 1, 100, "TRUNCATE TABLE users", table_info=truncated))
    rename = DDLJob.from_json(tj.job(32, 14, 1, 400, "RENAME TABLE users TO people", table_info=renamed))
    for ts, job in ((BIG_TS + 20, add_column), (BIG_TS + 30, truncate), (BIG_TS + 40, rename)):
        assert store.apply_job(job, ts)
    before, after = store.tables_changed_at(BIG_TS + 20)
    assert before == after  # a new version of the same table
    assert store.tables_changed_at(BIG_TS + 30) == (
        {100: (TableName("shop", "users", 100), (100,))},
        {400: (TableName("shop", "users", 400), (400,))},
    )
    assert store.tables_changed_at(BIG_TS + 40) == (
        {400: (TableName("shop", "users", 400), (400,))},
        {400: (TableName("shop", "people", 400), (400,))},
    )
