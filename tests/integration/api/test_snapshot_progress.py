"""An initial snapshot's progress on one capture: the REST status, ``cli changefeed query``,
the status page's document and (with Debian's Chromium) the page's bar.

A ``cdcflow server`` (SQLite, the Spark executor on ``local[1]``) copies a bulk-loaded
playground table cut into many parts (small ``snapshot-range-keys``). Once the capture
kept its plan, the stores answer ServerIsBusy to every read until the progress has been
seen with parts still to read, so the copy is caught under way; then the reads go through
and the progress moves up to every part, with the rows of the table at T, and ends
``done``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcflow.core.data.pipeline.spark_executor import changefeed_dir
from cdcflow.core.testing import until_sync
from cdcflow.plugins.sources.playground import Playground
from tests.integration.api.test_status_page_browser import ARTIFACTS, CHROMEDRIVER, CHROMIUM, _missing
from tests.integration.control.cluster import CDCFLOW, REST_POLL, Server, cli, env_with_plugin

pytestmark = pytest.mark.integration

CF = "cf-progress"
ROWS = 3000
RANGE_KEYS = 150  # about 20 parts
DONE = 240.0


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=2, seed=7, ddl_every=0, split_keys=1000) as playground:
        playground.bulk_load("customers", ROWS)
        yield playground


def _browser() -> Any:
    """A headless Chromium when the machine has it (scripts/ensure-chromium.sh), else None."""
    if _missing() is not None:
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


READ_BAR = """
const td = document.querySelector(`#changefeeds tr[data-changefeed="${arguments[0]}"] td.snapshot`);
if (!td) return null;
const bar = td.querySelector("progress");
return {state: td.dataset.snapshot, text: td.textContent, value: bar.value, max: bar.max};
"""


def test_the_progress_moves_and_ends_done_on_rest_cli_and_the_page(pg: Playground, tmp_path: Path) -> None:
    env = env_with_plugin(tmp_path / "plugins")
    settings = tmp_path / "server.yaml"
    spark = {"master": "local[1]", "conf": {"spark.sql.shuffle.partitions": 2, "spark.ui.enabled": False}}
    settings.write_text(yaml.safe_dump({"server": {"spark": spark}}))
    extra = ("--executor", "spark", "--config", str(settings))
    server = Server(tmp_path, "capture", f"sqlite:///{tmp_path}/meta.db", env, extra=extra)
    browser = _browser()
    try:
        start_ts = pg.now()
        at_t = len(pg.snapshot("customers", start_ts))
        config = tmp_path / "cf.yaml"
        source = {
            "type": "tikv",
            "playground": False,
            "pd": [pg.pd_address],
            "tidb-status": pg.status_address,
            "snapshot-range-keys": RANGE_KEYS,
        }
        sinks = [{"type": "file", "path": str(tmp_path / "out"), "protocol": "json"}]
        config.write_text(yaml.safe_dump({"source": source, "sinks": sinks, "filter": {"rules": ["shop.customers"]}}))
        created = cli(server, env, "changefeed", "create", "-c", CF, "--config", str(config),
                      "--start-ts", str(start_ts), "--initial-snapshot")  # fmt: skip
        assert created["snapshot_done"] is False and created["snapshot_progress"] is None
        if browser is not None:
            browser.get(server.api + "/")
        plan = changefeed_dir(tmp_path / "capture", CF) / "snapshot" / "plan.pkl"
        until_sync(plan.exists, timeout=DONE, interval=0.05, message="the snapshot planned",
                   observe=lambda: server.log_path.read_text(errors="replace")[-3000:])  # fmt: skip
        for store in pg.cluster.store_ids():
            pg.kv_region_error(store, "server_is_busy", 1_000_000)  # every snapshot read waits

        def progress() -> dict[str, Any] | None:
            found: dict[str, Any] | None = server.get(f"/api/v2/changefeeds/{CF}")["snapshot_progress"]
            return found

        # Reads held: the plan is known, nothing is read.
        first = until_sync(progress, timeout=DONE, interval=REST_POLL, message="the snapshot's progress",
                           observe=lambda: server.log_path.read_text(errors="replace")[-3000:])  # fmt: skip
        assert first["phase"] == "read" and first["unit"] == "range" and first["captures"] == 1
        assert first["parts_total"] >= 10 and first["parts_done"] < first["parts_total"], first
        total = first["parts_total"]
        overview = server.get("/api/v2/status/overview")
        [row] = [c for c in overview["changefeeds"] if c["id"] == CF]
        assert row["initial_snapshot"] and not row["snapshot_done"]
        assert row["snapshot_progress"]["parts_total"] == total
        query = subprocess.run([CDCFLOW, "cli", "--server", server.api, "changefeed", "query", "-c", CF],
                               capture_output=True, text=True, env=env, timeout=60, check=True)  # fmt: skip
        held = progress()
        assert held is not None and held["parts_done"] < total
        done_then = held["parts_done"]
        assert f"progress:    read, {done_then}/{total} ranges (" in query.stdout, query.stdout
        if browser is not None:

            def bar_reading() -> Any:
                # The page draws "planning…" until its next poll brings the plan's progress.
                bar = browser.execute_script(READ_BAR, CF)
                return bar if bar and bar["state"] != "planning" else None

            shown = until_sync(bar_reading, timeout=60, interval=0.25, message="the page's snapshot bar")
            assert shown["state"] == "read" and shown["value"] < total and shown["max"] == total, shown
            assert f"/{total} ranges (" in shown["text"], shown

        # Reads go through: the parts done only grow, up to all of them, with every row at T.
        pg.kv_faults.clear()
        seen = [first]

        def done() -> dict[str, Any] | None:
            now = progress()
            assert now is not None, "the progress went away while the changefeed runs"
            seen.append(now)
            return now if now["phase"] == "done" else None

        last = until_sync(done, timeout=DONE, interval=REST_POLL, message="the snapshot done")
        counts = [p["parts_done"] for p in seen]
        assert counts == sorted(counts), counts
        assert last["parts_done"] == last["parts_total"] == total and counts[0] < total
        assert last["rows_done"] == last["rows_estimate"] == at_t
        assert last["eta_seconds"] == 0 and last["rows_per_second"] > 0
        until_sync(lambda: server.get(f"/api/v2/changefeeds/{CF}")["snapshot_done"], timeout=DONE,
                   interval=REST_POLL, message="the checkpoint past T")  # fmt: skip
        if browser is not None:

            def bar_done() -> dict[str, Any] | None:
                bar: dict[str, Any] | None = browser.execute_script(READ_BAR, CF)
                return bar if bar is not None and bar["state"] == "done" else None

            shown = until_sync(bar_done, timeout=60, interval=0.25, message="the page's bar done")
            assert shown["text"].strip().startswith(f"done · {at_t:,} rows in "), shown
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(ARTIFACTS / "status-page-snapshot-done.png"))
    finally:
        pg.kv_faults.clear()
        if browser is not None:
            browser.quit()
        server.terminate()
