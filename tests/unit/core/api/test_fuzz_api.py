"""Fuzzing the REST API's request bodies and ``cdcflow cli``'s argument lists.

Every body posted to a real running server gets a JSON answer with a 2xx or
4xx status (never a 500); every argument list ends in a message and a
documented exit status (never a traceback). Example counts are bounded so the
suite runs in CI.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.cli import main as cli_main
from tests.unit.core.api.live import LiveApi

EXAMPLES = 150
#: Fields a create, update or verify body names, so that generated objects reach the validators.
FIELDS = (
    "changefeed_id", "id", "name", "source", "sinks", "sink_uri", "scheduler", "filter", "start_ts", "target_ts",
    "memory_quota", "spill_disk_quota", "error_stuck_duration", "description", "type", "uri", "path", "rules",
    "overwrite_checkpoint_ts",
)  # fmt: skip

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner),
    max_leaves=20,
)
deep = st.integers(0, 3000).map(lambda n: "[" * n + "]" * n) | st.integers(0, 3000).map(
    lambda n: '{"changefeed_id": "cf-x", "source": ' + '{"a": ' * n + "0" + "}" * n + "}"
)
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(FIELDS), json_values).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    deep.map(str.encode),
)
ENDPOINTS = [
    ("POST", "/api/v2/changefeeds"),
    ("PUT", "/api/v2/changefeeds/cf-fuzz"),
    ("POST", "/api/v2/changefeeds/cf-fuzz/resume"),
    ("POST", "/api/v2/verify_config"),
]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz-api")
    with LiveApi(tmp) as live:
        create = {
            "changefeed_id": "cf-fuzz",
            "source": {"type": "ticker"},
            "sinks": [{"type": "file", "path": str(tmp)}],
        }
        assert send(live.url, "POST", "/api/v2/changefeeds", json.dumps(create).encode())[0] == 201
        assert send(live.url, "POST", "/api/v2/changefeeds/cf-fuzz/pause", b"")[0] == 200
        yield live


def send(base: str, method: str, path: str, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(
        base + path, data=body, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        assert exc.headers.get_content_type() == "application/json", (exc.code, raw[:300])
        return exc.code, json.loads(raw)


@settings(max_examples=EXAMPLES, deadline=None)
@given(endpoint=st.sampled_from(ENDPOINTS), body=bodies)
def test_every_body_gets_a_json_2xx_or_4xx(api, endpoint, body):
    method, path = endpoint
    status, answer = send(api.url, method, path, body)
    assert status < 500, (method, path, body[:300], answer)
    assert isinstance(answer, dict)
    if status >= 400:
        assert answer["error_code"].startswith("Err") and answer["error_msg"], answer
    elif path.endswith("/resume"):  # a valid resume: pause again, so the next examples meet a paused changefeed
        assert send(api.url, "POST", "/api/v2/changefeeds/cf-fuzz/pause", b"")[0] == 200


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CLOSED = _closed_port()
WORDS = [
    "changefeed", "capture", "create", "pause", "resume", "remove", "update", "list", "query", "move-table",
    "list-tables", "-c", "--changefeed-id", "--server", "--json", "--sink-uri", "--config", "--start-ts",
    "--target-ts", "--overwrite-checkpoint-ts", "-a", "--all", "--table-id", "--target-capture", "--ca", "--cert",
    "--key", "--token-env", "cf-1", "a b", "x?y", "not a url", f"127.0.0.1:{CLOSED}", f"http://127.0.0.1:{CLOSED}",
    "https://h:1", "-1", "99999999999999999999", "/nonexistent.yaml", "file:///tmp/x", "", "=",
]  # fmt: skip
args = st.lists(st.sampled_from(WORDS) | st.text(max_size=12), max_size=8)


@settings(max_examples=EXAMPLES, deadline=None)
@given(argv=args)
def test_every_cli_argument_list_ends_cleanly(argv):
    out, err = io.StringIO(), io.StringIO()
    # Always a server that refuses connections: nothing fuzzed reaches a real cluster.
    full = ["cli", "--server", f"127.0.0.1:{CLOSED}", *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main.main(full)
        except SystemExit as exit_:  # argparse: usage errors (2) and --help (0)
            code = exit_.code if isinstance(exit_.code, int) else 2
    assert code in (0, 1, 2, 3), (full, code, err.getvalue())
    assert "Traceback" not in err.getvalue()
    if code != 0:
        assert err.getvalue().strip(), full
