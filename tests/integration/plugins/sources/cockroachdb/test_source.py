"""The cockroachdb source against the CockroachDB playground over real pgwire (psycopg 3, psql)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cdcflow.core.data.events import DDLEvent, OpType, ResolvedEvent, RowChange, TableSetChange
from cdcflow.core.errors import CheckpointStaleError, ConfigInvalidError
from cdcflow.plugins.sources.cockroach_playground import CockroachPlayground
from cdcflow.plugins.sources.cockroachdb import CockroachDBSource, CockroachDBSourceConfig

pytestmark = pytest.mark.integration


@pytest.fixture
def pg() -> Iterator[CockroachPlayground]:
    with CockroachPlayground(rate=0, password="s3cret") as playground:
        yield playground


def _source(pg: CockroachPlayground, **kw: Any) -> CockroachDBSource:
    return CockroachDBSource(CockroachDBSourceConfig(dsn=pg.dsn, resolved_interval=0.1, **kw))


async def _collect(source: CockroachDBSource, table: str, start_ts: int, until: Any, timeout: float = 20) -> list[Any]:
    tables = {t.table: t for t in await source.list_tables()}
    (span,) = await source.spans_for(tables[table])
    events: list[Any] = []

    async def run() -> None:
        async with contextlib.aclosing(source.feed(span, start_ts)) as feed:
            async for event in feed:
                events.append(event)
                if until(events):
                    return

    await asyncio.wait_for(run(), timeout)
    return events


def test_plain_psycopg_and_scram(pg: CockroachPlayground) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO orders (id, customer_id, product_id, quantity, amount, status, placed_on) "
            "VALUES (%s, 1, 1, 2, %s, 'new', '2024-06-01')",
            (7, "12.50"),
        )
        assert conn.execute("SELECT id, amount FROM orders WHERE id = %s", (7,)).fetchall()[0][0] == 7
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO orders VALUES (7, 1, 1, 2, 1.0, 'x', '2024-06-01')")
    bad = pg.dsn.replace("s3cret", "wrong")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(bad)


@pytest.mark.skipif(shutil.which("psql") is None, reason="Debian's postgresql-client is not installed")
def test_psql_binary(pg: CockroachPlayground) -> None:
    out = subprocess.run(
        ["psql", pg.dsn, "-At", "-c", "SELECT count(*) FROM customers", "-c", "SELECT cluster_logical_timestamp()"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    count, ts = out.stdout.split()
    assert int(count) == 0 and "." in ts


def test_feed_rows_resolved_and_resume_after_dropped_connection(pg: CockroachPlayground) -> None:
    async def main() -> None:
        source = _source(pg)
        await source.open()
        start = await source.current_ts()
        pg.execute("INSERT INTO customers (id, name, balance, created_at) VALUES (1, 'a', 1.50, '2024-01-01 00:00:00')")
        pg.execute("UPDATE customers SET balance = balance + 1 WHERE id = 1")
        pg.execute("DELETE FROM customers WHERE id = 1")
        events = await _collect(
            source, "customers", start, lambda ev: sum(isinstance(e, ResolvedEvent) for e in ev) >= 3
        )
        rows = [e for e in events if isinstance(e, RowChange)]
        assert [r.op for r in rows] == [OpType.INSERT, OpType.UPDATE, OpType.DELETE]
        assert str(rows[1].after["balance"]) == "2.50" and rows[1].before["balance"] == rows[0].after["balance"]
        resolved = [e.ts for e in events if isinstance(e, ResolvedEvent)]
        assert resolved == sorted(resolved) and resolved[0] > start
        assert all(r.commit_ts <= resolved[-1] for r in rows)

        # Restart from the last resolved ts: only what came after it, even across a dropped connection.
        pg.execute("INSERT INTO customers (id, name, balance, created_at) VALUES (2, 'b', 0, '2024-01-01 00:00:00')")
        tables = {t.table: t for t in await source.list_tables()}
        (span,) = await source.spans_for(tables["customers"])
        seen: list[Any] = []

        async def resume() -> None:
            dropped = False
            async with contextlib.aclosing(source.feed(span, resolved[-1])) as feed:
                async for event in feed:
                    seen.append(event)
                    if isinstance(event, RowChange) and not dropped:
                        assert pg.drop_feed_connections() >= 1
                        dropped = True
                        pg.execute(
                            "INSERT INTO customers (id, name, balance, created_at) VALUES (3, 'c', 0, '2024-01-01')"
                        )
                    if {r.after["id"] for r in seen if isinstance(r, RowChange) and r.after} >= {2, 3}:
                        return

        await asyncio.wait_for(resume(), 20)
        ids = [r.after["id"] for r in seen if isinstance(r, RowChange) and r.after]
        assert 1 not in ids and set(ids) == {2, 3}
        await source.close()

    asyncio.run(main())


def test_retryable_error_reconnects(pg: CockroachPlayground) -> None:
    async def main() -> None:
        source = _source(pg)
        await source.open()
        start = await source.current_ts()
        failed = False

        def until(events: list[Any]) -> bool:
            nonlocal failed
            if not failed and any(isinstance(e, ResolvedEvent) for e in events):
                failed = pg.fail_feeds("XXUUU", "RangeFeedRetryError: REASON_SLOW_CONSUMER") == 1
                pg.execute("INSERT INTO products (id, sku, price, stock, updated_at) VALUES (9, 's', 1, 1, now())")
            return any(isinstance(e, RowChange) for e in events)

        events = await _collect(source, "products", start, until)
        assert failed and [e.after["id"] for e in events if isinstance(e, RowChange)] == [9]
        await source.close()

    asyncio.run(main())


def test_column_change_is_a_ddl_event_after_the_rows_below_it(pg: CockroachPlayground) -> None:
    async def main() -> None:
        source = _source(pg)
        await source.open()
        start = await source.current_ts()
        pg.execute("INSERT INTO orders VALUES (1, 1, 1, 1, 1.00, 'new', '2024-06-01')")
        pg.execute("ALTER TABLE orders ADD COLUMN note STRING(20)")
        pg.execute("INSERT INTO orders VALUES (2, 1, 1, 1, 1.00, 'new', '2024-06-01', 'hello')")
        events = await _collect(
            source, "orders", start, lambda ev: any(isinstance(e, RowChange) and e.after["id"] == 2 for e in ev)
        )
        kinds = [type(e).__name__ for e in events if not isinstance(e, ResolvedEvent)]
        assert kinds == ["RowChange", "DDLEvent", "RowChange"]
        ddl = next(e for e in events if isinstance(e, DDLEvent))
        assert ddl.query == "ALTER TABLE `shop`.`orders` ADD COLUMN `note` varchar(20)"
        assert ddl.schema_after is not None and ddl.schema_after.columns[-1].name == "note"
        first, second = (e for e in events if isinstance(e, RowChange))
        assert first.commit_ts < ddl.commit_ts <= second.commit_ts and second.after["note"] == "hello"
        await source.close()

    asyncio.run(main())


def test_cursor_below_gc_threshold_is_checkpoint_stale(pg: CockroachPlayground) -> None:
    async def main() -> None:
        source = _source(pg)
        await source.open()
        start = await source.current_ts()
        pg.advance_gc_threshold("orders")
        with pytest.raises(CheckpointStaleError, match=r"shop\.orders.*gc\.ttlseconds 14400"):
            await _collect(source, "orders", start, lambda ev: False)
        await source.close()

    asyncio.run(main())


def test_wrong_password_is_a_config_error_without_retry(pg: CockroachPlayground) -> None:
    async def main() -> None:
        source = CockroachDBSource(CockroachDBSourceConfig(dsn=pg.dsn.replace("s3cret", "nope")))
        await source.open()
        with pytest.raises(ConfigInvalidError) as info:
            await source.list_tables()
        assert "nope" not in str(info.value)

    asyncio.run(main())


def test_rows_a_reconnect_sends_again_are_yielded_once(pg: CockroachPlayground) -> None:
    """Rows above the last resolved row come again after a reconnect (the cursor is that resolved row)."""

    async def main() -> None:
        source = _source(pg)
        source.config = source.config.model_copy(update={"resolved_interval": 3.0})  # no resolved row in between
        await source.open()
        start = await source.current_ts()
        pg.execute("INSERT INTO customers (id, name, balance, created_at) VALUES (1, 'a', 1, '2024-01-01')")
        dropped = False

        def until(events: list[Any]) -> bool:
            nonlocal dropped
            if not dropped and any(isinstance(e, RowChange) for e in events):
                assert pg.drop_feed_connections() == 1
                dropped = True
                pg.execute("INSERT INTO customers (id, name, balance, created_at) VALUES (2, 'b', 1, '2024-01-01')")
            return sum(isinstance(e, ResolvedEvent) for e in events) >= 1 and len(ids(events)) >= 2

        def ids(events: list[Any]) -> list[int]:
            return [e.after["id"] for e in events if isinstance(e, RowChange)]

        events = await _collect(source, "customers", start, until, timeout=30)
        assert dropped and ids(events) == [1, 2]
        await source.close()

    asyncio.run(main())


def test_tables_created_and_dropped_while_running(pg: CockroachPlayground) -> None:
    """The catalog polled AS OF SYSTEM TIME: each change at the ts where tables_at changes, the
    CREATE TABLE on the trigger span, the new table's rows from its feed, the DROP TABLE on its own."""

    async def main() -> None:
        source = CockroachDBSource(CockroachDBSourceConfig(dsn=pg.dsn, resolved_interval=0.1, table_poll_interval=0.1))
        await source.open()
        start = await source.current_ts()
        assert "late" not in {t.table for t in await source.tables_at(start)}
        pg.execute("CREATE TABLE late (id INT8 PRIMARY KEY, note STRING(10))")
        pg.execute("INSERT INTO late (id, note) VALUES (1, 'a'), (2, 'b')")
        changes = source.table_changes(start)
        assert changes is not None
        async with contextlib.aclosing(changes):
            created = await anext(c async for c in changes if isinstance(c, TableSetChange))
            (late,) = created.created
            assert late.table == "late" and not created.dropped and created.commit_ts > start
            assert "late" not in {t.table for t in await source.tables_at(created.commit_ts - 1)}
            assert late in await source.tables_at(created.commit_ts)

            trigger = source.trigger_span()
            assert trigger is not None
            ddl = (await _collect_span(source, trigger, start, lambda ev: any(isinstance(e, DDLEvent) for e in ev)))[-1]
            assert ddl.commit_ts == created.commit_ts and ddl.query.startswith("CREATE TABLE `shop`.`late`")
            assert ddl.schema_after is not None and [c.name for c in ddl.schema_after.columns] == ["id", "note"]

            (span,) = await source.spans_for(late)
            rows = await _collect_span(
                source, span, created.commit_ts, lambda ev: sum(isinstance(e, RowChange) for e in ev) == 2
            )
            assert [r.after["id"] for r in rows if isinstance(r, RowChange)] == [1, 2]

            pg.execute("DROP TABLE late")
            events = await _collect_span(source, span, created.commit_ts, lambda ev: isinstance(ev[-1], DDLEvent))
            dropped = await anext(c async for c in changes if isinstance(c, TableSetChange))
            assert dropped.dropped == (late,) and not dropped.created
            assert events[-1].commit_ts == dropped.commit_ts and events[-1].query == "DROP TABLE `shop`.`late`"
            assert all(e.commit_ts <= dropped.commit_ts for e in events if isinstance(e, RowChange))
            assert late in await source.tables_at(dropped.commit_ts - 1)
            assert late not in await source.tables_at(dropped.commit_ts)
        await source.close()

    asyncio.run(main())


async def _collect_span(source: CockroachDBSource, span: Any, start_ts: int, until: Any) -> list[Any]:
    events: list[Any] = []

    async def run() -> None:
        async with contextlib.aclosing(source.feed(span, start_ts)) as feed:
            async for event in feed:
                events.append(event)
                if until(events):
                    return

    await asyncio.wait_for(run(), 20)
    return events
