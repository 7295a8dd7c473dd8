"""The status page in a real headless browser (Debian's Chromium through its ChromeDriver,
installed by scripts/ensure-chromium.sh): a ``cdcflow server`` process, a changefeed created
and paused with ``cdcflow cli``, the page following both. Screenshots are kept under
build/artifacts/ (``status-page-running.png``, ``status-page-paused.png``)."""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcflow.core.testing import until_sync
from tests import REPO
from tests.integration.control.cluster import Server, cli, env_with_plugin

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = REPO / "build" / "artifacts"
#: Seconds the browser may take to show what the server did (a loaded machine, the 2 s poll).
SHOWN = 90


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is missing: run scripts/ensure-chromium.sh (make setup does) to install Debian's chromium"
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


#: What the page shows, read in one script (the page redraws itself every poll, so elements
#: found one by one may be replaced in between).
READ_PAGE = """
const rows = {};
for (const tr of document.querySelectorAll("#changefeeds tr[data-changefeed]")) {
  rows[tr.dataset.changefeed] = {
    state: tr.querySelector("[data-state]").textContent,
    stateClass: tr.querySelector("[data-state]").className,
    cells: [...tr.querySelectorAll("td")].map((td) => td.textContent),
  };
}
const series = (id) => [...document.querySelectorAll(`#${id} polyline`)].map((p) => p.dataset.changefeed);
return {
  loaded: document.body.dataset.loaded === "true",
  empty: !document.getElementById("no-changefeeds").hidden,
  captures: [...document.querySelectorAll("#captures tr[data-capture]")].map((tr) => tr.dataset.capture),
  spans: [...document.querySelectorAll("li[data-span]")].map((li) => li.dataset.span),
  changefeeds: rows,
  points: Number(document.getElementById("chart-rows").dataset.points || 0),
  lagSeries: series("chart-lag"),
  rowSeries: series("chart-rows"),
};
"""


def _read(driver: Any) -> dict[str, Any]:
    shown: dict[str, Any] = driver.execute_script(READ_PAGE)
    return shown


def _shown(driver: Any, what: str, predicate: Any) -> dict[str, Any]:
    """The page as read once ``predicate(page)`` holds."""

    from selenium.common.exceptions import WebDriverException

    def check() -> dict[str, Any] | None:
        try:
            page = _read(driver)
        except WebDriverException:  # the page is (re)loading: its elements are not there yet
            return None
        return page if predicate(page) else None

    return until_sync(check, timeout=SHOWN, interval=0.25, message=what, observe=lambda: _text(driver, "changefeeds"))


def test_the_page_follows_a_changefeed_created_and_paused_from_the_cli(tmp_path: Path, browser: Any) -> None:
    env = env_with_plugin(tmp_path / "plugins")
    server = Server(tmp_path, "capture", f"sqlite:///{tmp_path}/meta.db", env)
    try:
        browser.get(server.api + "/")
        page = _shown(browser, "the page to load", lambda p: p["loaded"])
        assert page["empty"] and not page["changefeeds"]
        capture_id = server.status()["id"]  # type: ignore[index]
        assert page["captures"] == [capture_id]

        config = tmp_path / "ticks.json"
        sinks = [{"type": "file", "path": str(tmp_path / "out")}]
        config.write_text(json.dumps({"source": {"type": "ticker"}, "sinks": sinks}))
        cli(server, env, "changefeed", "create", "-c", "ticks", "--config", str(config))

        def state(p: dict[str, Any]) -> str | None:
            return p["changefeeds"].get("ticks", {}).get("state")

        _shown(browser, "the changefeed, normal", lambda p: state(p) == "normal")
        # Its spans on the capture (the ticker's two tables), rows/s in the table, samples in the charts.
        _shown(browser, "the ticker's two tables on the capture", lambda p: {"ticks/1", "ticks/2"} <= set(p["spans"]))

        def flowing(p: dict[str, Any]) -> bool:
            cells = p["changefeeds"]["ticks"]["cells"]
            return cells[5] not in ("", "0") and p["points"] >= 3

        page = _shown(browser, "rows/s above zero and three samples in the chart", flowing)
        assert page["lagSeries"] == ["ticks"] and page["rowSeries"] == ["ticks"]
        assert not page["empty"] and page["changefeeds"]["ticks"]["cells"][7] == ""  # no error
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "status-page-running.png"))

        cli(server, env, "changefeed", "pause", "-c", "ticks")
        page = _shown(browser, "the changefeed, paused", lambda p: state(p) == "paused")
        assert "state-paused" in page["changefeeds"]["ticks"]["stateClass"]
        assert browser.save_screenshot(str(ARTIFACTS / "status-page-paused.png"))
    finally:
        server.terminate()


def _text(driver: Any, element_id: str) -> str:
    """The text of an element, or "" while the page (re)loads and it is not there."""
    from selenium.common.exceptions import WebDriverException

    try:
        text: str = driver.find_element("id", element_id).text
    except WebDriverException:
        return ""
    return text


def test_a_browser_logs_in_to_a_token_protected_api(tmp_path: Path, browser: Any) -> None:
    token = secrets.token_hex(16)
    env = {**env_with_plugin(tmp_path / "plugins"), "CDCFLOW_API_TOKEN": token}
    config = tmp_path / "server.yaml"
    config.write_text(yaml.safe_dump({"server": {"security": {"token-env": "CDCFLOW_API_TOKEN"}}, "connectors": []}))
    server = Server(tmp_path, "capture", f"sqlite:///{tmp_path}/meta.db", env, extra=("--config", str(config)))
    try:
        sinks = [{"type": "file", "path": str(tmp_path / "out")}]
        (tmp_path / "ticks.json").write_text(json.dumps({"source": {"type": "ticker"}, "sinks": sinks}))
        cli(server, env, "changefeed", "create", "-c", "ticks", "--config", str(tmp_path / "ticks.json"))

        browser.get(server.api + "/")
        form = browser.find_element("id", "token")  # no session: the login form
        form.send_keys("not-the-token")
        browser.find_element("id", "login").click()
        until_sync(
            lambda: "not valid" in _text(browser, "login-error"),
            timeout=SHOWN,
            interval=0.25,
            message="the login form saying the token is not valid",
        )
        browser.find_element("id", "token").clear()
        browser.find_element("id", "token").send_keys(token)
        browser.find_element("id", "login").click()
        _shown(
            browser,
            "the page after logging in, the changefeed normal",
            lambda p: p["loaded"] and p["changefeeds"].get("ticks", {}).get("state") == "normal",
        )
        [cookie] = browser.get_cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and token not in cookie["value"]
        # The session reads only: a change from the page's origin without the token is refused.
        status = browser.execute_async_script(
            "const done = arguments[0];"
            "fetch('/api/v2/changefeeds/ticks/pause', {method: 'POST'}).then((r) => done(r.status));"
        )
        assert status == 401
        assert cli(server, env, "changefeed", "query", "-c", "ticks")["state"] == "normal"
    finally:
        server.terminate()
