"""The ``tikv`` source in TiDB mode against the playground: tables, feeds, mounting, GC.

Rows replayed from the feeds (mounted, deduplicated by key and commit ts,
applied in commit-ts order) must equal the playground's consistent snapshot
of every table at the last commit.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest

from cdcflow.core.data.events import DDLEvent, RawKVEvent, ResolvedEvent, Span, TableName, TableSetChange
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import CheckpointStaleError
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, Flag

pytestmark = pytest.mark.integration

VARCHAR = FieldType(tp=int(TypeCode.VARCHAR), flen=32, charset="utf8mb4", collate="utf8mb4_bin")
BIGINT_PK = FieldType(
    tp=int(TypeCode.LONGLONG), flag=int(Flag.NOT_NULL | Flag.PRI_KEY), flen=20, charset="binary", collate="binary"
)


async def _collect(
    source: TiKVSource,
    span: Span,
    start: int,
    out: list[RawKVEvent],
    resolved: dict[Span, int],
    ddl: list[DDLEvent] | None = None,
) -> None:
    async for ev in source.feed(span, start):
        if isinstance(ev, ResolvedEvent):
            resolved[span] = ev.ts
        elif isinstance(ev, DDLEvent):
            # The barrier: a table's DDL comes before its feed resolves past the DDL.
            assert ev.commit_ts > resolved.get(span, start), (ev, resolved.get(span))
            assert ddl is not None
            ddl.append(ev)
        else:
            assert isinstance(ev, RawKVEvent)
            out.append(ev)


async def _wait_resolved(resolved: dict[Span, int], spans: list[Span], ts: int, timeout: float = 60.0) -> None:
    await until(
        lambda: all(resolved.get(s, 0) >= ts for s in spans),
        timeout=timeout,
        message=f"every span resolved to {ts}",
        observe=lambda: {s: resolved.get(s, 0) for s in spans},
    )


def test_feeds_of_every_table_replay_to_the_snapshot() -> None:
    async def body() -> None:
        async with Playground(stores=3, split_keys=150, resolved_ts_interval=0.05, ddl_every=0, seed=3) as pg:
            source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await source.open()
            tasks: list[asyncio.Task[None]] = []
            try:
                await asyncio.to_thread(pg.run_workload, 60)
                start = await source.current_ts()
                tables = [t for t in await source.list_tables() if t.schema == "shop"]
                assert tables, "the playground's shop tables are listed"
                await asyncio.to_thread(pg.run_workload, 80)  # reaches the feeds through the incremental scan
                events: list[RawKVEvent] = []
                resolved: dict[Span, int] = {}
                spans = [span for t in tables for span in await source.spans_for(t)]
                for span in spans:
                    tasks.append(asyncio.create_task(_collect(source, span, start, events, resolved)))
                stats = await asyncio.to_thread(pg.run_workload, 150)  # live
                last = stats.last_commit_ts
                await _wait_resolved(resolved, spans, last)

                mounter = source.mounter()
                assert mounter is not None
                state: dict[str, dict[bytes, dict[str, Any]]] = defaultdict(dict)
                for t in tables:
                    for row in await asyncio.to_thread(pg.snapshot, t.table, start):
                        schema = await source.table_schema(t, start)
                        pk = schema.handle_key_columns()
                        state[t.table][tuple(row[c] for c in pk)] = row  # type: ignore[index]
                unique = {(ev.key, ev.commit_ts): ev for ev in events if ev.commit_ts <= last}
                for ev in sorted(unique.values(), key=lambda e: e.sort_key()):
                    change = await mounter.mount(ev)
                    assert change is not None and change.schema is not None
                    pk = change.schema.handle_key_columns()
                    image = change.image()
                    k = tuple(image[c] for c in pk)
                    if change.after is None:
                        state[change.table.table].pop(k, None)  # type: ignore[arg-type]
                    else:
                        state[change.table.table][k] = dict(change.after)  # type: ignore[index]
                for t in tables:
                    expected = await asyncio.to_thread(pg.snapshot, t.table, last)
                    got = [state[t.table][k] for k in sorted(state[t.table])]
                    assert got == expected, t

                keeper = source.gc_safepoint_keeper()
                assert await keeper.update("cdcflow-test", last, ttl=60) == last
                assert await asyncio.to_thread(pg.advance_gc, last + 1000) == last  # held by the service safepoint
                assert await keeper.current() == last
                with pytest.raises(CheckpointStaleError):
                    await anext(aiter(source.feed(spans[0], start)))
                with pytest.raises(CheckpointStaleError):
                    await keeper.update("cdcflow-test", start, ttl=60)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 240))


def test_a_hash_partitioned_table_has_a_span_per_partition_and_rows_name_their_partition() -> None:
    async def body() -> None:
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
            from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key

            source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await source.open()
            columns = [("id", BIGINT_PK), ("v", VARCHAR)]
            parted = await asyncio.to_thread(pg.ddl.create_table, "shop", "parted", columns, partitions=3)
            tasks: list[asyncio.Task[None]] = []
            try:
                table = next(t for t in await source.list_tables() if t.table == "parted")
                spans = await source.spans_for(table)
                assert [s.table_id for s in spans] == list(parted.partitions)
                start = await source.current_ts()
                events: list[RawKVEvent] = []
                resolved: dict[Span, int] = {}
                tasks = [asyncio.create_task(_collect(source, span, start, events, resolved)) for span in spans]
                txn = pg.begin()
                for i in range(1, 10):
                    txn.put(row_key(parted, i), encode_row_value(parted, {"v": f"v{i}"}))
                last = await asyncio.to_thread(txn.commit)
                await _wait_resolved(resolved, spans, last)
                mounter = source.mounter()
                assert mounter is not None
                rows = [await mounter.mount(ev) for ev in sorted(events, key=lambda e: e.sort_key())]
                got = {}
                for row in rows:
                    assert row is not None and row.after is not None
                    assert (row.table.schema, row.table.table, row.table.table_id) == ("shop", "parted", parted.id)
                    assert row.table.partition_id == parted.partitions[row.after["id"] % 3]
                    got[row.after["id"]] = row.after["v"]
                assert got == {r["id"]: r["v"] for r in await asyncio.to_thread(pg.snapshot, "parted", last)}
                assert len(got) == 9
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 120))


@pytest.mark.parametrize("faults", [False, True], ids=["steady", "faults"])
def test_rows_across_ddl_decode_with_the_schema_at_their_commit_ts(faults: bool) -> None:
    async def body() -> None:
        async with Playground(stores=2, split_keys=80, resolved_ts_interval=0.05, ddl_every=15, seed=5) as pg:
            source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await source.open()
            tasks: list[asyncio.Task[None]] = []
            try:
                start = await source.current_ts()
                ddls_before = pg.workload.stats.ddls
                tables = [t for t in await source.list_tables() if t.schema == "shop"]
                spans = [span for t in tables for span in await source.spans_for(t)]
                events: list[RawKVEvent] = []
                ddl_events: list[DDLEvent] = []
                resolved: dict[Span, int] = {}
                for span in spans:
                    tasks.append(asyncio.create_task(_collect(source, span, start, events, resolved, ddl_events)))
                for _ in range(6):
                    stats = await asyncio.to_thread(pg.run_workload, 20)
                    if faults:  # leader moves and stream resets hit table and DDL feeds alike
                        region = max(pg.regions(), key=lambda r: r.start)
                        await asyncio.to_thread(pg.transfer_leader, region.id)
                        await asyncio.to_thread(pg.reset_streams, min(pg.store_addresses))
                last = await source.current_ts()  # above every commit, DML or DDL
                await _wait_resolved(resolved, spans, last)

                mounter = source.mounter()
                assert mounter is not None
                base = {t.table: await source.table_schema(t, start) for t in tables}
                state: dict[str, dict[tuple[Any, ...], tuple[int, dict[str, Any]]]] = defaultdict(dict)
                for t in tables:
                    pk = base[t.table].handle_key_columns()
                    for row in await asyncio.to_thread(pg.snapshot, t.table, start):
                        state[t.table][tuple(row[c] for c in pk)] = (start, row)
                last_ddl: dict[str, int] = defaultdict(int)
                for d in ddl_events:
                    assert d.table is not None
                    last_ddl[d.table.table] = max(last_ddl[d.table.table], d.commit_ts)
                unique = {(ev.key, ev.commit_ts): ev for ev in events if ev.commit_ts <= last}
                for ev in sorted(unique.values(), key=lambda e: e.sort_key()):
                    change = await mounter.mount(ev)
                    assert change is not None and change.schema is not None
                    # Decoded with the schema valid just below its commit ts: exactly its columns.
                    image = change.image()
                    assert set(image) == {c.name for c in change.schema.columns}
                    k = tuple(image[c] for c in change.schema.handle_key_columns())
                    if change.after is None:
                        state[change.table.table].pop(k, None)
                    else:
                        state[change.table.table][k] = (change.commit_ts, dict(change.after))
                assert len({d.commit_ts for d in ddl_events}) == stats.ddls - ddls_before > 0
                for t in tables:
                    expected = await asyncio.to_thread(pg.snapshot, t.table, last)
                    pk = base[t.table].handle_key_columns()
                    got = state[t.table]
                    assert len(got) == len(expected), t
                    original = [c.name for c in base[t.table].columns]
                    for row in expected:
                        ts, image = got[tuple(row[c] for c in pk)]
                        if ts > last_ddl[t.table]:
                            assert image == row  # written after the table's last DDL: the final schema
                        else:
                            assert {c: image[c] for c in original} == {c: row[c] for c in original}
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 240))


def test_txnkv_mode_key_span_as_key_value_rows() -> None:
    async def body() -> None:
        async with Playground(stores=2, split_keys=0, resolved_ts_interval=0.05, create_tables=False) as pg:
            cfg = TiKVSourceConfig(pd=[pg.pd_address], kv_api="txnkv", key_spans=[[b"app/".hex(), b"app0".hex()]])
            source = TiKVSource(cfg)
            await source.open()
            try:
                (table,) = await source.list_tables()
                (span,) = await source.spans_for(table)
                start = await source.current_ts()

                def write() -> int:
                    txn = pg.begin()
                    txn.put(b"app/a", b"1")
                    txn.put(b"app/b", b"2")
                    txn.put(b"other", b"x")  # outside the span
                    txn.commit()
                    txn = pg.begin()
                    txn.put(b"app/a", b"3")
                    txn.delete(b"app/b")
                    return txn.commit()

                last = await asyncio.to_thread(write)
                events: list[RawKVEvent] = []
                resolved: dict[Span, int] = {}
                task = asyncio.create_task(_collect(source, span, start, events, resolved))
                await _wait_resolved(resolved, [span], last)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                mounter = source.mounter()
                assert mounter is not None
                rows = [await mounter.mount(ev) for ev in sorted(events, key=lambda e: e.sort_key())]
                got = [(r.op.value, r.before, r.after) for r in rows if r is not None]
                assert got == [
                    ("insert", None, {"key": b"app/a", "value": b"1"}),
                    ("insert", None, {"key": b"app/b", "value": b"2"}),
                    ("update", {"key": b"app/a", "value": b"1"}, {"key": b"app/a", "value": b"3"}),
                    ("delete", {"key": b"app/b", "value": b"2"}, None),
                ]
            finally:
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_a_feed_below_the_schema_load_ts_gets_the_ddl_in_between() -> None:
    async def body() -> None:
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
            source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await source.open()
            try:
                start = await source.current_ts()
                await asyncio.to_thread(pg.ddl.add_column, "shop", "orders", "note", VARCHAR, None)
                # Listing tables loads the schema store now, above the ADD COLUMN.
                orders = next(t for t in await source.list_tables() if t.table == "orders")
                (span,) = await source.spans_for(orders)
                resolved: dict[Span, int] = {}
                ddl: list[DDLEvent] = []
                task = asyncio.create_task(_collect(source, span, start, [], resolved, ddl))
                try:
                    await _wait_resolved(resolved, [span], await source.current_ts())
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                assert [d.query for d in ddl] == ["ALTER TABLE `shop`.`orders` ADD COLUMN `note` varchar(32)"]
            finally:
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_a_mounter_prepared_below_a_ddl_decodes_each_row_with_the_schema_of_its_commit_ts() -> None:
    """As after a restart: events stored from ``start`` on are mounted by a new source
    that feeds nothing below the published ts. Prepared at ``start``, its mounter decodes
    rows before the ADD COLUMN without the column, and waits for the DDL tracker so that
    rows after it use the version at the DDL's exact commit ts (not the status API's
    FinishedTS estimate)."""

    async def body() -> None:
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
            first = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await first.open()
            try:
                orders = next(t for t in await first.list_tables() if t.table == "orders")
                (span,) = await first.spans_for(orders)
                start = await first.current_ts()
                await asyncio.to_thread(pg.run_workload, 30)
                await asyncio.to_thread(pg.ddl.add_column, "shop", "orders", "extra", VARCHAR, "n/a")
                last = (await asyncio.to_thread(pg.run_workload, 30)).last_commit_ts
                events: list[RawKVEvent] = []
                resolved: dict[Span, int] = {}
                ddl: list[DDLEvent] = []
                task = asyncio.create_task(_collect(first, span, start, events, resolved, ddl))
                try:
                    await _wait_resolved(resolved, [span], last)
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            finally:
                await first.close()
            [add] = ddl

            second = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await second.open()
            try:
                await second.prepare_mounter(start)
                mounter = second.mounter()
                assert mounter is not None
                rows = [await mounter.mount(ev) for ev in sorted(events, key=lambda e: e.sort_key())]
                before = [r for r in rows if r is not None and r.commit_ts < add.commit_ts]
                after = [r for r in rows if r is not None and r.commit_ts > add.commit_ts]
                assert before and after
                assert all("extra" not in r.image() for r in before)
                assert all("extra" in r.image() for r in after)
                version = second.catalog.schemas.table_for_row(orders.table_id, after[0].commit_ts)
                assert version is not None and version.exact and version.ts == add.commit_ts
            finally:
                await second.close()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_the_ddl_span_feed_yields_the_ddl_no_table_feed_carries() -> None:
    async def body() -> None:
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
            source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await source.open()
            try:
                start = await source.current_ts()
                first, second = source.ddl_spans()
                resolved: dict[Span, int] = {}
                ddl: list[DDLEvent] = []
                other: list[DDLEvent] = []
                tasks = [
                    asyncio.create_task(_collect(source, first, start, [], resolved, ddl)),
                    asyncio.create_task(_collect(source, second, start, [], resolved, other)),
                ]
                try:
                    await asyncio.to_thread(pg.ddl.create_table, "newdb", "fresh", [("id", BIGINT_PK)])
                    await asyncio.to_thread(pg.ddl.add_column, "shop", "orders", "note", VARCHAR, None)
                    await _wait_resolved(resolved, [first, second], await source.current_ts())
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                # CREATE TABLE names a table no feed can have yet; ALTER goes to the table's feeds.
                assert [(d.query, d.table and d.table.table) for d in ddl] == [
                    ("CREATE TABLE `newdb`.`fresh` (`id` bigint NOT NULL, PRIMARY KEY (`id`))", "fresh")
                ]
                assert other == []
            finally:
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_a_renamed_tables_feed_carries_the_rename_with_the_old_name() -> None:
    async def body() -> None:
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
            source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await source.open()
            try:
                orders = next(t for t in await source.list_tables() if (t.schema, t.table) == ("shop", "orders"))
                (span,) = await source.spans_for(orders)
                start = await source.current_ts()
                resolved: dict[Span, int] = {}
                ddl: list[DDLEvent] = []
                task = asyncio.create_task(_collect(source, span, start, [], resolved, ddl))
                try:
                    await asyncio.to_thread(pg.ddl.add_column, "shop", "orders", "note", VARCHAR, None)
                    renamed = await asyncio.to_thread(pg.ddl.rename_table, "shop", "orders", "purchases")
                    await _wait_resolved(resolved, [span], await source.current_ts())
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                add, rename = ddl
                assert add.renamed_from is None
                assert rename.commit_ts == renamed.valid_from and rename.action_type == 14
                assert rename.query == "RENAME TABLE `shop`.`orders` TO `shop`.`purchases`"
                assert rename.table == TableName("shop", "purchases", orders.table_id)
                assert rename.renamed_from == TableName("shop", "orders", orders.table_id)
                assert rename.schema_after is not None and "note" in [c.name for c in rename.schema_after.columns]
            finally:
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_table_changes_and_tables_at_follow_create_truncate_rename_and_drop_table() -> None:
    async def body() -> None:
        async with Playground(stores=1, split_keys=0, resolved_ts_interval=0.05, ddl_every=0) as pg:
            source = TiKVSource(TiKVSourceConfig(pd=[pg.pd_address], tidb_status=pg.status_address))
            await source.open()
            try:
                start = await source.current_ts()
                stream = source.table_changes(start)
                assert stream is not None and source.trigger_span() == source.ddl_spans()[0]
                fresh = await asyncio.to_thread(pg.ddl.create_table, "newdb", "fresh", [("id", BIGINT_PK)])
                await asyncio.to_thread(pg.ddl.add_column, "shop", "orders", "note", VARCHAR, None)
                after = await source.current_ts()
                truncated = await asyncio.to_thread(pg.ddl.truncate_table, "newdb", "fresh")
                renamed = await asyncio.to_thread(pg.ddl.rename_table, "newdb", "fresh", "fresher")
                dropped = await asyncio.to_thread(pg.ddl.drop_table, "newdb", "fresher")
                last = await source.current_ts()
                events: list[TableSetChange | ResolvedEvent] = []
                async for event in stream:
                    events.append(event)
                    if isinstance(event, ResolvedEvent) and event.ts >= last:
                        break
                await stream.aclose()
                changes = [e for e in events if isinstance(e, TableSetChange)]
                table = TableName("newdb", "fresh", fresh.id)
                renewed = TableName("newdb", "fresh", truncated.id)
                moved = TableName("newdb", "fresher", truncated.id)
                # Each at the exact commit ts of its job write; the ADD COLUMN is no change.
                assert [(c.commit_ts, c.created, c.dropped) for c in changes] == [
                    (fresh.valid_from, (table,), ()),
                    (truncated.valid_from, (renewed,), (table,)),  # TRUNCATE: a new table id
                    (renamed.valid_from, (moved,), (renewed,)),  # RENAME: the same id, a new name
                    (dropped.valid_from, (), (moved,)),
                ]
                resolved = [e.ts for e in events if isinstance(e, ResolvedEvent)]
                assert resolved == sorted(resolved) and {e.span for e in events if isinstance(e, ResolvedEvent)} == {
                    source.trigger_span()
                }
                for i, change in enumerate(events):  # no change at or below a resolved ts already given
                    if isinstance(change, TableSetChange):
                        assert all(r.ts < change.commit_ts for r in events[:i] if isinstance(r, ResolvedEvent))
                at_start = await source.tables_at(start)
                assert {t.table for t in at_start if t.schema == "shop"} == {"customers", "products", "orders"}
                assert table not in at_start and table in await source.tables_at(after)
                assert renewed in await source.tables_at(truncated.valid_from)
                assert moved in await source.tables_at(renamed.valid_from)
                assert renewed not in await source.tables_at(renamed.valid_from)
                assert not {t for t in await source.tables_at(last) if t.schema == "newdb"}
            finally:
                await source.close()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_playground_option_embeds_the_upstream() -> None:
    from cdcflow.plugins.sources.playground.embedded import embedded_playground, stop_embedded_playground

    async def body() -> None:
        config = TiKVSourceConfig.model_validate(
            {"pd": ["127.0.0.1:1"], "tidb-status": "127.0.0.1:1", "playground": {"stores": 1, "rate": 0, "seed": 4}}
        )
        # Made as the runtime makes it: the playground plugin provides the upstream.
        source = TiKVSource.create(config, PluginManager.default(autoload=False))
        await source.open()
        try:
            pg = embedded_playground()  # the one the source started
            assert source.pd.cluster_id == pg.cluster_id
            tables = [t for t in await source.list_tables() if t.schema == "shop"]
            assert {t.table for t in tables} == {"customers", "products", "orders"}
            orders = next(t for t in tables if t.table == "orders")
            (span,) = await source.spans_for(orders)
            start = await source.current_ts()
            stats = await asyncio.to_thread(pg.run_workload, 10)
            events: list[RawKVEvent] = []
            resolved: dict[Span, int] = {}
            task = asyncio.create_task(_collect(source, span, start, events, resolved, []))
            try:
                await _wait_resolved(resolved, [span], stats.last_commit_ts)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            mounter = source.mounter()
            assert mounter is not None
            expected = await asyncio.to_thread(pg.snapshot, "orders", stats.last_commit_ts)
            state: dict[Any, dict[str, Any]] = {}
            unique = {(ev.key, ev.commit_ts): ev for ev in events if ev.commit_ts <= stats.last_commit_ts}
            for ev in sorted(unique.values(), key=lambda e: e.sort_key()):
                change = await mounter.mount(ev)
                assert change is not None
                if change.after is None:
                    assert change.before is not None
                    state.pop(change.before["id"], None)
                else:
                    state[change.after["id"]] = dict(change.after)
            assert events and sorted(state) == sorted(row["id"] for row in expected)
        finally:
            await source.close()
            await asyncio.to_thread(stop_embedded_playground)

    asyncio.run(asyncio.wait_for(body(), 120))
