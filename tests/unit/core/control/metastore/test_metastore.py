"""One suite, run against both metastores: SQLite and a real etcd."""

from __future__ import annotations

import asyncio

import pytest

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo, ChangeFeedStatus
from cdcflow.core.control.metastore import MetaStoreConflictError, NotOwnerError, open_metastore
from cdcflow.core.errors import DuplicateChangefeedIDError, MetaStoreIOError


def capture(cid: str) -> CaptureInfo:
    return CaptureInfo(cid, "127.0.0.1:1", "127.0.0.1:2", "0", 1, 0.0)


def info(cid: str = "cf-1", version: int = 1) -> ChangeFeedInfo:
    return ChangeFeedInfo(cid, {"type": "list"}, [{"type": "list"}], version=version)


def test_sessions_owner_and_fencing(metastore_url):
    async def main():
        store = open_metastore(metastore_url)
        a = await store.open_session(capture("a"), 2)
        b = await store.open_session(capture("b"), 2)
        assert [c.id for c in await store.list_captures()] == ["a", "b"]
        term_a = await store.campaign(a)
        assert term_a.capture_id == "a"
        assert (await store.get_owner()) == term_a
        campaign_b = asyncio.create_task(store.campaign(b))
        # Time passes on purpose (not a wait on a condition): b's campaign must not win while a owns.
        await asyncio.sleep(0.5)
        assert not campaign_b.done()  # only one owner at a time
        await store.create_changefeed(info(), ChangeFeedStatus(5, 5), term_a)
        await a.close()  # the owner's session ends: b wins, and a's writes are refused
        term_b = await asyncio.wait_for(campaign_b, 10)
        assert term_b.capture_id == "b" and term_b.term != term_a.term
        with pytest.raises(NotOwnerError):
            await store.update_checkpoints({"cf-1": ChangeFeedStatus(9, 9)}, term_a)
        assert [c.id for c in await store.list_captures()] == ["b"]
        await store.resign(term_b)
        assert await store.get_owner() is None
        await b.close()
        await store.close()

    asyncio.run(main())


def test_changefeed_records(metastore_url):
    async def main():
        store = open_metastore(metastore_url)
        s = await store.open_session(capture("a"), 5)
        term = await store.campaign(s)
        await store.create_changefeed(info(), ChangeFeedStatus(10, 10), term)
        with pytest.raises(DuplicateChangefeedIDError):
            await store.create_changefeed(info(), ChangeFeedStatus(10, 10), term)
        await store.update_changefeed(info(version=2), term)
        with pytest.raises(MetaStoreConflictError):
            await store.update_changefeed(info(version=2), term)  # stale writer: version 1 was read
        written = await store.update_checkpoints(
            {"cf-1": ChangeFeedStatus(20, 25), "gone": ChangeFeedStatus(1, 1)}, term
        )
        assert written == {"cf-1": 20}
        assert await store.update_checkpoints({"cf-1": ChangeFeedStatus(15, 15)}, term) == {}  # never backwards
        got = await store.get_changefeed("cf-1")
        assert got is not None and got[0].version == 2 and got[1].checkpoint_ts == 20 and got[1].resolved_ts == 25
        assert [i.id for i, _ in await store.list_changefeeds()] == ["cf-1"]
        await store.delete_changefeed("cf-1", term)
        assert await store.get_changefeed("cf-1") is None
        await s.close()
        await store.close()

    asyncio.run(main())


def test_snapshot_records(metastore_url):
    async def main():
        store = open_metastore(metastore_url)
        s = await store.open_session(capture("a"), 5)
        term = await store.campaign(s)
        await store.save_snapshot_record("cf-1", {"ts": 10}, term)  # no such changefeed: not kept
        assert await store.list_snapshot_records() == {}
        await store.create_changefeed(info(), ChangeFeedStatus(10, 10), term)
        await store.create_changefeed(info("cf-2"), ChangeFeedStatus(10, 10), term)
        await store.save_snapshot_record("cf-1", {"ts": 10, "done": [[5, "61", "62"]]}, term)
        await store.save_snapshot_record("cf-1", {"ts": 10, "done": [[5, "61", ""]], "complete": True}, term)
        await store.save_snapshot_record("cf-2", {"ts": 10}, term)
        assert await store.list_snapshot_records() == {
            "cf-1": {"ts": 10, "done": [[5, "61", ""]], "complete": True},
            "cf-2": {"ts": 10},
        }
        await store.delete_changefeed("cf-1", term)
        assert await store.list_snapshot_records() == {"cf-2": {"ts": 10}}
        await store.resign(term)
        with pytest.raises(NotOwnerError):
            await store.save_snapshot_record("cf-2", {"ts": 11}, term)
        assert await store.list_snapshot_records() == {"cf-2": {"ts": 10}}
        await s.close()
        await store.close()

    asyncio.run(main())


def test_session_expiry_is_noticed(metastore_url):
    async def main():
        store = open_metastore(metastore_url)
        watcher = store.watch_captures()
        assert await anext(watcher) == []
        s = await store.open_session(capture("a"), 1)
        assert [c.id for c in await asyncio.wait_for(anext(watcher), 5)] == ["a"]
        s._task.cancel()  # keepalive stops, as in a frozen process
        assert await asyncio.wait_for(anext(watcher), 10) == []
        await watcher.aclose()
        await store.close()

    asyncio.run(main())


def test_unavailable_metastore_is_3002():
    async def main():
        store = open_metastore("etcd://127.0.0.1:1/x")
        store._retries = 2
        with pytest.raises(MetaStoreIOError) as err:
            await store.list_captures()
        assert err.value.code == 3002
        await store.close()

    asyncio.run(main())
