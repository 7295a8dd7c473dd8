"""The capture's sweep of its data directory, against both metastores (SQLite and a real etcd):
the files of existing changefeeds (a paused one among them) stay, a removed changefeed's go,
a directory made while the sweep runs stays, and nothing goes when the metastore cannot be read."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from pathlib import Path

import pytest

from cdcflow.core.control.changefeed import CaptureInfo, ChangeFeedInfo, ChangefeedState, ChangeFeedStatus
from cdcflow.core.control.metastore import open_metastore
from cdcflow.core.control.metastore.base import MetaStore, OwnerTerm
from cdcflow.core.control.metastore.etcd import EtcdMetaStore
from cdcflow.core.control.metastore.timed import TimedMetaStore
from cdcflow.core.control.reclaim import ChangefeedFilesSweeper
from cdcflow.core.data.pipeline.files import (
    DETACHED_PREFIX,
    OWNER_FILE,
    changefeed_dir,
    changefeeds_root,
    claim_changefeed_dir,
    discard_changefeed_data,
)
from cdcflow.core.metrics import CaptureMetrics
from tests.etcd_server import free_port


def info(cf: str, created_at: float, state: ChangefeedState = ChangefeedState.NORMAL) -> ChangeFeedInfo:
    return ChangeFeedInfo(cf, {"type": "list"}, [{"type": "list"}], state=state, created_at=created_at)


async def owner(store: MetaStore) -> OwnerTerm:
    session = await store.open_session(CaptureInfo("a", "127.0.0.1:1", "127.0.0.1:2", "0", 1, 0.0), 10)
    return await store.campaign(session)


def files_of(data_dir: Path, cf: str, created_at: float, nbytes: int = 1000) -> Path:
    """A changefeed's directory as its executor leaves it: the owner file and some store files."""
    directory = changefeed_dir(data_dir, cf)
    claim_changefeed_dir(directory, cf, created_at)
    (directory / "store").mkdir()
    (directory / "store" / "chunk-1.arrow").write_bytes(b"x" * nbytes)
    (directory / "spark-checkpoint").mkdir()
    (directory / "spark-checkpoint" / "offsets").write_text("{}")
    return directory


def test_removed_changefeeds_files_go_and_the_others_stay(metastore_url, tmp_path, caplog):
    data = tmp_path / "data"

    async def main():
        store = open_metastore(metastore_url)
        term = await owner(store)
        await store.create_changefeed(info("live", 10.0), ChangeFeedStatus(5, 5), term)
        await store.create_changefeed(info("paused", 11.0, ChangefeedState.PAUSED), ChangeFeedStatus(5, 5), term)
        await store.create_changefeed(info("gone", 12.0), ChangeFeedStatus(5, 5), term)
        await store.create_changefeed(info("again", 20.0), ChangeFeedStatus(5, 5), term)
        await store.create_changefeed(info("idle-again", 30.0), ChangeFeedStatus(5, 5), term)
        live = files_of(data, "live", 10.0)
        paused = files_of(data, "paused", 11.0)
        gone = files_of(data, "gone", 12.0, nbytes=4096)
        await store.delete_changefeed("gone", term)  # cli changefeed remove
        never = files_of(data, "never-stored", 1.0, nbytes=10)
        old_again = files_of(data, "again", 13.0, nbytes=20)  # an earlier "again", removed, created again
        busy_old = files_of(data, "idle-again", 14.0)  # the same, but an executor of it runs here
        busy_gone = files_of(data, "busy-gone", 15.0)  # removed, its executor still closing here
        no_owner = changefeed_dir(data, "no-owner-file")
        no_owner.mkdir(parents=True)  # an older version's directory of a changefeed that exists
        await store.create_changefeed(info("no-owner-file", 16.0), ChangeFeedStatus(5, 5), term)
        not_an_id = changefeeds_root(data) / "not_a_changefeed"  # not a changefeed id: left alone
        not_an_id.mkdir()
        leftover = changefeeds_root(data) / f"{DETACHED_PREFIX}old-1234abcd"  # a sweep stopped mid-delete
        (leftover / "store").mkdir(parents=True)

        metrics = CaptureMetrics()
        sweeper = ChangefeedFilesSweeper(store, data, lambda: {"idle-again", "busy-gone"}, metrics)
        with caplog.at_level(logging.INFO, logger="cdcflow.core.control.reclaim"):
            reclaimed = await sweeper.sweep()
        by_id = {r.changefeed_id: r for r in reclaimed}
        assert sorted(by_id) == ["again", "gone", "never-stored"]
        assert by_id["gone"].reason == "removed" and by_id["gone"].path == gone
        assert by_id["gone"].bytes_freed >= 4096 + 2  # the chunk and the offsets file (+ the owner file)
        assert by_id["again"].reason == "replaced"
        assert not gone.exists() and not never.exists() and not old_again.exists() and not leftover.exists()
        for kept in (live, paused, busy_old, busy_gone, no_owner, not_an_id):
            assert kept.exists(), kept
        assert (live / "store" / "chunk-1.arrow").read_bytes() == b"x" * 1000
        assert json.loads((paused / OWNER_FILE).read_text())["created_at"] == 11.0
        assert sorted(p.name for p in changefeeds_root(data).iterdir()) == sorted(
            ["live", "paused", "idle-again", "busy-gone", "no-owner-file", "not_a_changefeed"]
        )
        lines = [r.getMessage() for r in caplog.records if r.name == "cdcflow.core.control.reclaim"]
        [line] = [m for m in lines if "changefeed gone:" in m]
        assert str(gone) in line and f"({by_id['gone'].bytes_freed} bytes freed)" in line
        assert metrics.reclaimed_dirs._value.get() == 3
        assert metrics.reclaimed_bytes._value.get() == sum(r.bytes_freed for r in reclaimed)

        # Nothing more to do: the next sweep deletes nothing; once the executor here is gone, it goes.
        assert await sweeper.sweep() == []
        sweeper.busy = set
        assert sorted(r.changefeed_id for r in await sweeper.sweep()) == ["busy-gone", "idle-again"]
        assert live.exists() and paused.exists() and no_owner.exists()
        await store.close()

    asyncio.run(main())


class _CreatedDuringTheSweep(TimedMetaStore):
    """The real store; a changefeed is created (record, then directory, as a capture does)
    while a sweep runs: after its scan, before its listing."""

    def __init__(self, inner: MetaStore, term: OwnerTerm, data: Path) -> None:
        super().__init__(inner, CaptureMetrics())
        self.term, self.data = term, data

    async def list_changefeeds(self):
        await self.inner.create_changefeed(info("fresh", 50.0), ChangeFeedStatus(5, 5), self.term)
        files_of(self.data, "fresh", 50.0)
        await self.inner.create_changefeed(info("reborn", 60.0), ChangeFeedStatus(5, 5), self.term)
        files_of(self.data, "reborn", 60.0)  # claimed by its executor: the old files are discarded
        listed = await self.inner.list_changefeeds()
        # One more, created once the listing is read: absent from it, its files must stay too.
        await self.inner.create_changefeed(info("late", 70.0), ChangeFeedStatus(5, 5), self.term)
        files_of(self.data, "late", 70.0)
        return listed


def test_a_changefeed_created_during_the_sweep_keeps_its_files(metastore_url, tmp_path):
    data = tmp_path / "data"

    async def main():
        inner = open_metastore(metastore_url)
        term = await owner(inner)
        old = files_of(data, "reborn", 40.0)  # a removed changefeed's, its id created again below
        sweeper = ChangefeedFilesSweeper(_CreatedDuringTheSweep(inner, term, data), data, set)
        assert await sweeper.sweep() == []
        assert (changefeed_dir(data, "fresh") / "store" / "chunk-1.arrow").exists()
        assert (changefeed_dir(data, "late") / "store" / "chunk-1.arrow").exists()
        assert json.loads((old / OWNER_FILE).read_text())["created_at"] == 60.0
        assert (old / "store" / "chunk-1.arrow").exists()
        await inner.close()

    asyncio.run(main())


def test_an_unreadable_sqlite_metastore_deletes_nothing(tmp_path, caplog):
    data = tmp_path / "data"

    async def main():
        store = open_metastore(f"sqlite:///{tmp_path}/meta.db")
        gone = files_of(data, "gone", 1.0)
        with sqlite3.connect(tmp_path / "meta.db") as db:
            db.execute("DROP TABLE changefeed")  # a metastore that cannot answer the listing
        sweeper = ChangefeedFilesSweeper(store, data, set)
        with caplog.at_level(logging.WARNING, logger="cdcflow.core.control.reclaim"):
            assert await sweeper.sweep() == []
        assert (gone / "store" / "chunk-1.arrow").exists()
        assert any("cannot list the changefeeds" in r.getMessage() for r in caplog.records)
        await store.close()

    asyncio.run(main())


@pytest.mark.integration
def test_an_unreachable_etcd_deletes_nothing(tmp_path, caplog):
    data = tmp_path / "data"

    async def main():
        store = EtcdMetaStore([f"127.0.0.1:{free_port()}"], timeout=1.0, retries=2)  # no etcd listens there
        gone = files_of(data, "gone", 1.0)
        sweeper = ChangefeedFilesSweeper(store, data, set)
        with caplog.at_level(logging.WARNING, logger="cdcflow.core.control.reclaim"):
            assert await sweeper.sweep() == []
        assert (gone / "store" / "chunk-1.arrow").exists()
        assert any("cannot list the changefeeds" in r.getMessage() for r in caplog.records)
        await store.close()

    asyncio.run(main())


def test_discard_deletes_at_once_and_an_absent_directory_is_no_error(tmp_path):
    directory = files_of(tmp_path, "cf", 1.0, nbytes=100)
    assert discard_changefeed_data(tmp_path, "cf") >= 100
    assert not directory.exists() and list(changefeeds_root(tmp_path).iterdir()) == []
    assert discard_changefeed_data(tmp_path, "cf") == 0
