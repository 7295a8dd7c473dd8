"""Transforms checked against the source's tables at ``cdcflow validate`` and
``POST /api/v2/verify_config``: the tikv source on a playground lists its tables and
schemas, so an unknown column or a route merging tables of different columns is a
problem naming the line, the connector, the transform and the field; a source that
does not answer leaves a note instead."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from cdcflow.core.cli import main as cli_main
from cdcflow.core.cli._common import EXIT_CONFIG, EXIT_OK
from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.playground.shop import SHOP_TABLES
from tests.unit.core.api.live import LiveApi
from tests.unit.core.cli.test_cli_input import _get

pytestmark = pytest.mark.integration

BAD = """\
connectors:
  - name: shop
    source: {{type: tikv, pd: ["{pd}"], tidb-status: "{status}"}}
    sinks: [{{uri: "file://{out}"}}]
    transforms:
      - type: filter
        tables: [shop.orders]
        where: "quantity > 3 AND no_such_column = 1"
      - type: project
        tables: [shop.customers]
        drop: [email]
      - type: route
        routes: [{{source: 'shop\\.users_(\\d+)', target: shop.users}}]
"""

GOOD = """\
connectors:
  - name: shop
    source: {{type: tikv, pd: ["{pd}"], tidb-status: "{status}"}}
    sinks: [{{uri: "file://{out}"}}]
    transforms:
      - type: filter
        tables: [shop.orders]
        where: "quantity > 3"
      - type: project
        tables: [shop.users_*]
        columns: [id, name]
      - type: route
        routes: [{{source: 'shop\\.users_(\\d+)', target: shop.users}}]
"""


@pytest.fixture(scope="module")
def pg() -> Iterator[Playground]:
    with Playground(stores=1, ddl_every=0) as pg:
        name = SHOP_TABLES["customers"][1][1]
        key = SHOP_TABLES["orders"][0][1]
        pg.ddl.create_table("shop", "users_0", [("id", key), ("name", name)])
        pg.ddl.create_table("shop", "users_1", [("id", key), ("name", name), ("nickname", name)])
        yield pg


def free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def validate(capsys: Any, tmp_path: Any, text: str, *args: str) -> tuple[int, str, str]:
    path = tmp_path / "connectors.yaml"
    path.write_text(text)
    capsys.readouterr()
    code = cli_main.main(["validate", *args, str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_unknown_columns_and_route_conflicts_are_problems_with_their_lines(capsys, tmp_path, pg):
    text = BAD.format(pd=pg.pd_address, status=pg.status_address, out=tmp_path)
    code, _, err = validate(capsys, tmp_path, text)
    assert code == EXIT_CONFIG, err
    lines = [line for line in err.splitlines() if "connectors.yaml:" in line and "invalid (" not in line]
    assert len(lines) == 2, err
    # Line 8: the filter's where names a column shop.orders does not have.
    assert ":8:" in lines[0] and "connectors[0].transforms[0].where" in lines[0]
    assert "connector shop, transforms[0] (filter): table shop.orders" in lines[0] and "no_such_column" in lines[0]
    # Line 13: the route sends users_0 and users_1, of different columns, into one table.
    assert ":13:" in lines[1] and "connectors[0].transforms[2].routes" in lines[1]
    assert "transforms[2] (route)" in lines[1] and "shop.users_0 and shop.users_1 both go to shop.users" in lines[1]

    code, out, _ = validate(capsys, tmp_path, text, "--json")
    assert code == EXIT_CONFIG
    issues = json.loads(out)["error"]["detail"]["issues"]
    assert [(i["line"], i["path"]) for i in issues] == [
        (8, "connectors[0].transforms[0].where"),
        (13, "connectors[0].transforms[2].routes"),
    ]


def test_transforms_that_fit_the_source_are_valid_without_a_note(capsys, tmp_path, pg):
    text = GOOD.format(pd=pg.pd_address, status=pg.status_address, out=tmp_path)
    code, out, err = validate(capsys, tmp_path, text)
    assert code == EXIT_OK, err
    assert "note:" not in out and "valid (1 connector(s): shop)" in out


def test_a_source_that_does_not_answer_is_a_note_not_an_error(capsys, tmp_path):
    address = free_address()  # nothing listens there
    text = BAD.format(pd=address, status=address, out=tmp_path)
    code, out, err = validate(capsys, tmp_path, text, "--source-timeout", "3")
    assert code == EXIT_OK, err
    assert "note: connector shop: transform columns and routes were not checked against the source" in out
    code, out, _ = validate(capsys, tmp_path, text, "--offline")
    assert code == EXIT_OK and "(--offline): shop" in out


def test_verify_config_checks_transforms_against_the_source(tmp_path, pg):
    def body(transforms: list[dict[str, Any]], pd: str = pg.pd_address, status: str = pg.status_address) -> bytes:
        source = {"type": "tikv", "pd": [pd], "tidb-status": status}
        doc = {"changefeed_id": "v", "source": source, "sink_uri": f"file://{tmp_path}", "transforms": transforms}
        return json.dumps(doc).encode()

    masked = [{"type": "mask", "tables": ["shop.customers"], "columns": ["email", "phone"]}]
    with LiveApi(tmp_path) as api, pytest.MonkeyPatch.context() as env:
        env.setenv("CDCFLOW_MASK_SALT", "s")
        url = f"{api.url}/api/v2/verify_config"
        status, answer = _get(url, body(masked), "POST")
        assert status == 400 and answer["code"] == 1001, answer
        [issue] = answer["issues"]
        assert issue["path"] == "transforms[0].columns" and "unknown column(s) phone" in issue["message"]
        assert "connector v, transforms[0] (mask): table shop.customers" in issue["message"]

        masked[0]["columns"] = ["email"]
        assert _get(url, body(masked), "POST") == (200, {"valid": True, "notes": []})

        status, answer = _get(url, body(masked, free_address(), free_address()), "POST")
        assert status == 200 and answer["valid"] and "not checked against the source" in answer["notes"][0]
