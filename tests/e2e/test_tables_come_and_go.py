"""Tables created, truncated and dropped while a changefeed runs: the playground upstream,
``cdcflow run`` (tikv source, Spark pipeline) and a file sink.

The changefeed's filter (``newdb.*``) matches no table at its start: it must advance anyway
(its table-trigger span follows the DDL). Then, while it runs, ``newdb.fresh`` is created,
filled, truncated (a new table id) and filled again, and ``newdb.gone`` is created, filled
and dropped. Every DDL must reach the sink, every row committed after its table's CREATE
or TRUNCATE must be replicated, and no row may come in a batch that ends at or below the
DDL that created its table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcflow.core.data.types import TypeCode
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.catalog import TableDef
from cdcflow.plugins.sources.playground.rows import encode_row_value, row_key
from cdcflow.plugins.sources.tikv.tidb.fieldtype import FieldType, Flag
from tests.e2e.e2e_shop import CHANGEFEED, RunProcess, server_settings

pytestmark = pytest.mark.integration

CATCH_UP = 180.0  # seconds the capture may take to pass a ts
BIGINT_PK = FieldType(
    tp=int(TypeCode.LONGLONG), flag=int(Flag.NOT_NULL | Flag.PRI_KEY), flen=20, charset="binary", collate="binary"
)
VARCHAR = FieldType(tp=int(TypeCode.VARCHAR), flen=32, charset="utf8mb4", collate="utf8mb4_bin")


def write_connectors(tmp: Path, pg: Playground, start_ts: int, api_port: int) -> Path:
    path = tmp / "connectors.yaml"
    connector = {
        "name": CHANGEFEED,
        "source": {"type": "tikv", "playground": False, "pd": [pg.pd_address], "tidb-status": pg.status_address},
        "sinks": [{"type": "file", "path": str(tmp / "out"), "protocol": "json"}],
        "filter": {"rules": ["newdb.*"]},
        "start-ts": start_ts,
    }
    path.write_text(yaml.safe_dump({"server": server_settings(tmp, api_port), "connectors": [connector]}))
    return path


def insert(pg: Playground, table: TableDef, ids: range) -> int:
    """One transaction inserting rows ``ids`` into ``table``; returns its commit ts."""
    txn = pg.begin()
    for i in ids:
        txn.put(row_key(table, i), encode_row_value(table, {"v": f"row {i}"}))
    return txn.commit()


def read_out(out: Path, table: str) -> tuple[dict[int, str], list[dict[str, Any]]]:
    """The DDL (commit ts → query) and the rows (with their batch's end ts) of ``newdb.table``."""
    folder = out / "newdb" / table
    ddl = {}
    for f in folder.glob("ddl-*.jsonl"):
        doc = json.loads(f.read_text())
        ddl[doc["commit_ts"]] = doc["query"]
    rows = []
    for f in sorted(folder.glob("0*.jsonl")):
        end_ts = int(f.stem.split("-")[1])
        rows += [{**json.loads(line), "batch_end": end_ts} for line in f.read_text().splitlines()]
    return ddl, rows


def test_tables_created_truncated_and_dropped_while_running(tmp_path: Path) -> None:
    columns = [("id", BIGINT_PK), ("v", VARCHAR)]
    with Playground(stores=1, seed=11, ddl_every=0) as pg:
        start = pg.now()
        port = 0  # the capture takes a free port and logs it (RunProcess reads it)
        run = RunProcess(write_connectors(tmp_path, pg, start, port), port, tmp_path / "run.log")
        run.start()
        try:
            # No table matches yet: the changefeed advances on its table-trigger span alone.
            run.wait_checkpoint(pg.now(), CATCH_UP)

            fresh = pg.ddl.create_table("newdb", "fresh", columns)
            first = [insert(pg, fresh, range(1, 6)), insert(pg, fresh, range(6, 9))]
            renewed = pg.ddl.truncate_table("newdb", "fresh")
            second = [insert(pg, renewed, range(100, 104))]
            gone = pg.ddl.create_table("newdb", "gone", columns)
            third = [insert(pg, gone, range(1, 4))]
            dropped = pg.ddl.drop_table("newdb", "gone")
            run.wait_checkpoint(pg.now(), CATCH_UP)
        finally:
            run.stop()

    out = tmp_path / "out"
    ddl, rows = read_out(out, "fresh")
    assert ddl == {
        fresh.valid_from: "CREATE TABLE `newdb`.`fresh` (`id` bigint NOT NULL, `v` varchar(32), PRIMARY KEY (`id`))",
        renewed.valid_from: "TRUNCATE TABLE `newdb`.`fresh`",
    }
    got = {(r["after"]["id"], r["commit_ts"]) for r in rows}
    want = {(i, first[0]) for i in range(1, 6)} | {(i, first[1]) for i in range(6, 9)}
    want |= {(i, second[0]) for i in range(100, 104)}
    assert got == want
    # A row comes in a batch after the DDL that created its table id: never in one ending at or below it.
    for r in rows:
        created = fresh.valid_from if r["after"]["id"] < 100 else renewed.valid_from
        assert r["batch_end"] > created and r["commit_ts"] > created

    ddl, rows = read_out(out, "gone")
    assert sorted(ddl) == [gone.valid_from, dropped.valid_from]
    assert ddl[dropped.valid_from] == "DROP TABLE `newdb`.`gone`"
    assert {(r["after"]["id"], r["commit_ts"]) for r in rows} == {(i, third[0]) for i in range(1, 4)}
