"""The status page's server side: the page and its files, the overview document with the
owner's history, and how a browser authenticates against a token-protected API."""

from __future__ import annotations

import http.cookiejar
import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from cdcflow.core.api.status_page import ASSETS, SESSION_COOKIE, asset, session_value, snapshot_progress_json
from cdcflow.core.config.settings import SecuritySettings
from cdcflow.core.testing import until_sync
from tests.unit.core.api.live import LiveApi

TOKEN = "status-page-token-0123456789"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def fetch(url: str, *, method: str = "GET", data: bytes | None = None, headers: dict[str, str] | None = None,
          opener: urllib.request.OpenerDirector | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with (opener or urllib.request.build_opener()).open(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def create(api: LiveApi, cf: str, token: str | None = None) -> None:
    sinks = [{"type": "file", "path": str(api.tmp / cf)}]
    body = {"changefeed_id": cf, "source": {"type": "ticker", "interval": 0.05}, "sinks": sinks}
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    status, _, raw = fetch(f"{api.url}/api/v2/changefeeds", method="POST", data=json.dumps(body).encode(),
                           headers=headers)  # fmt: skip
    assert status == 201, raw


def test_the_page_its_files_and_the_overview(tmp_path):
    with LiveApi(tmp_path) as api:
        status, headers, page = fetch(f"{api.url}/")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b'<script src="/status/status.js"' in page
        for name in ASSETS:  # nothing is loaded from elsewhere (the SVG namespace is a name, not a fetch)
            text = asset(name).replace("http://www.w3.org/2000/svg", "")
            assert "//" not in text.replace("// ", ""), name
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        for name, kind in ASSETS.items():
            if not name.endswith(".html"):
                status, headers, body = fetch(f"{api.url}/status/{name}")
                assert status == 200 and headers["Content-Type"].startswith(kind) and body
        assert fetch(f"{api.url}/status/..%2Fserver.py")[0] == 404
        assert fetch(f"{api.url}/status/login.html")[0] == 404  # pages are served at their paths only

        create(api, "cf-page")
        history = api.server.status_history

        def flowed() -> dict[str, Any] | None:
            doc = json.loads(fetch(f"{api.url}/api/v2/status/overview")[2])
            api.call(history.sample())  # the owner's sampler, sooner than its interval
            feeds = [s["changefeeds"].get("cf-page", {}) for s in doc["history"]["samples"]]
            return doc if any(f.get("rows_per_second", 0) > 0 for f in feeds) else None

        doc = until_sync(flowed, timeout=60, interval=0.2, message="rows to flow into the history")
        me = doc["served_by"]
        assert doc["owner"] == me
        [cf] = doc["changefeeds"]
        assert cf["id"] == "cf-page" and cf["state"] == "normal" and cf["error"] is None
        assert cf["checkpoint_tso"] > 0 and cf["checkpoint_lag"] >= 0
        [capture] = doc["captures"]
        assert capture["id"] == me and capture["is_owner"]
        tables = {s["table_id"] for s in capture["spans"] if s["changefeed_id"] == "cf-page"}
        assert tables == {1, 2}  # the ticker's two tables, both on the only capture
        assert all(s["role"] == "primary" and s["state"] == "replicating" for s in capture["spans"])
        samples = doc["history"]["samples"]
        assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)
        assert doc["history"]["horizon_seconds"] == 3600

        local = json.loads(fetch(f"{api.url}/api/v2/status/local")[2])
        assert local["capture_id"] == me and local["flushed"]["cf-page"]["rows"] > 0


def test_the_ring_keeps_one_hour_of_samples(tmp_path):
    with LiveApi(tmp_path) as api:
        history = api.server.status_history
        capacity = history.samples.maxlen
        assert capacity == int(history.horizon / history.interval) + 1
        start = 1_000_000.0
        for i in range(capacity + 50):
            api.call(history.sample(now=start + i * history.interval))
        assert len(history.samples) == capacity
        assert history.samples[0]["t"] == start + 50 * history.interval  # the oldest fell out


def test_a_browser_logs_in_with_the_token_and_gets_a_read_only_session(tmp_path):
    security = SecuritySettings(token_env="CDCFLOW_API_TOKEN")
    with LiveApi(tmp_path, security, {"CDCFLOW_API_TOKEN": TOKEN}) as api:
        create(api, "cf-auth", TOKEN)
        # Without credentials: the page answers with the login form, the JSON with 401.
        status, _, page = fetch(f"{api.url}/")
        assert status == 401 and b'<form method="post" action="/login">' in page
        assert fetch(f"{api.url}/api/v2/status/overview")[0] == 401
        assert fetch(f"{api.url}/status/status.js")[0] == 401
        # A wrong token is refused, and sets nothing.
        wrong = urllib.parse.urlencode({"token": "nope"}).encode()
        status, headers, page = fetch(
            f"{api.url}/login", method="POST", data=wrong, opener=urllib.request.build_opener(NoRedirect)
        )
        assert status == 401 and b"not valid" in page and "Set-Cookie" not in headers
        # The right one: a session cookie (an HMAC of the token, not the token), HttpOnly and SameSite=Strict.
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        status, _, page = fetch(
            f"{api.url}/login", method="POST", data=urllib.parse.urlencode({"token": TOKEN}).encode(), opener=opener
        )
        assert status == 200 and b'<table id="changefeeds">' in page  # redirected to the page
        [cookie] = list(jar)
        assert cookie.name == SESSION_COOKIE and cookie.value == session_value(TOKEN) and TOKEN not in cookie.value
        assert cookie.has_nonstandard_attr("HttpOnly") and cookie.get_nonstandard_attr("SameSite") == "Strict"
        status, _, raw = fetch(f"{api.url}/api/v2/status/overview", opener=opener)
        assert status == 200 and [c["id"] for c in json.loads(raw)["changefeeds"]] == ["cf-auth"]
        # The session only reads: a change still needs the bearer token.
        status, _, raw = fetch(f"{api.url}/api/v2/changefeeds/cf-auth/pause", method="POST", opener=opener)
        assert status == 401 and json.loads(raw)["error_code"] == "ErrUnauthenticated"
        # The cookie's value is no bearer token.
        cookie_as_token = {"Authorization": f"Bearer {session_value(TOKEN)}"}
        assert fetch(f"{api.url}/api/v2/changefeeds", headers=cookie_as_token)[0] == 401
        # Logging out ends the session.
        fetch(f"{api.url}/logout", opener=opener)
        assert fetch(f"{api.url}/api/v2/status/overview", opener=opener)[0] == 401


RAW_PROGRESS = {
    "unit": "region",
    "phase": "read",
    "parts_done": 12,
    "parts_total": 48,
    "rows_done": 30_000,
    "rows_estimate": 120_000,
    "fraction": 0.25,
    "captures": 2,
    "started_at": 1_000.0,
    "finished_at": None,
}


def test_the_snapshot_progress_of_the_rest_status_and_the_page():
    shown = snapshot_progress_json(RAW_PROGRESS, now=1_060.0)
    assert shown is not None
    assert (shown["parts_done"], shown["parts_total"], shown["rows_done"], shown["rows_estimate"]) == (
        12, 48, 30_000, 120_000,
    )  # fmt: skip
    # A quarter read in 60 s: 180 s to go at that pace, 500 rows/s.
    assert shown["eta_seconds"] == 180.0 and shown["rows_per_second"] == 500.0 and shown["elapsed_seconds"] == 60.0
    assert shown["started"] == "1970-01-01 00:16:40" and shown["captures"] == 2
    assert snapshot_progress_json({**RAW_PROGRESS, "parts_done": 0, "fraction": 0.0}, 1_060.0)["eta_seconds"] is None  # type: ignore[index]
    done = snapshot_progress_json({**RAW_PROGRESS, "phase": "done", "finished_at": 1_100.0}, now=5_000.0)
    assert done is not None and done["eta_seconds"] == 0 and done["elapsed_seconds"] == 100.0
    assert snapshot_progress_json(None, 1_060.0) is None


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js runs the page's script here")
def test_the_page_draws_the_snapshot_bar_from_the_document():
    """status.js's own snapshotSummary (the bar's value, max and text), run by Node.js."""
    cases = {
        "none": {"initial_snapshot": False},
        "planning": {"initial_snapshot": True, "snapshot_done": False, "snapshot_progress": None},
        "reading": {
            "initial_snapshot": True,
            "snapshot_done": False,
            "snapshot_progress": snapshot_progress_json(RAW_PROGRESS, now=1_060.0),
        },
        "done": {
            "initial_snapshot": True,
            "snapshot_done": True,
            "snapshot_progress": snapshot_progress_json(
                {**RAW_PROGRESS, "phase": "done", "rows_done": 119_000, "finished_at": 1_090.0}, now=2_000.0
            ),
        },
        "done-earlier": {"initial_snapshot": True, "snapshot_done": True, "snapshot_progress": None},
    }
    script = (
        asset("status.js")
        + "\nconst cases = JSON.parse(require('fs').readFileSync(0, 'utf-8'));"
        + "\nconst out = {}; for (const [k, v] of Object.entries(cases)) out[k] = module.exports.snapshotSummary(v);"
        + "\nprocess.stdout.write(JSON.stringify(out));"
    )
    result = subprocess.run(["node", "-e", script], input=json.dumps(cases), capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["none"] is None
    assert got["planning"] == {"state": "planning", "value": 0, "max": 1, "text": "planning…"}
    assert got["reading"] == {
        "state": "read",
        "value": 12,
        "max": 48,
        "text": "12/48 regions (25%) · 30,000/~120,000 rows · 500 rows/s · ETA 3.0 min",
    }
    assert got["done"] == {"state": "done", "value": 1, "max": 1, "text": "done · 119,000 rows in 1.5 min"}
    assert got["done-earlier"]["text"] == "done"
