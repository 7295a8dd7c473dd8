"""``transforms:`` in connectors.yaml: validation with lines, and a plugin package's transform."""

from __future__ import annotations

import pickle
import textwrap
from importlib import metadata
from pathlib import Path

from cdcflow.core.config.loader import validate_text
from cdcflow.core.plugin.manager import PluginManager
from tests.unit.plugins.transforms.conftest import row, schema

EXAMPLE = Path(__file__).parents[4] / "docs" / "how-to" / "examples" / "cdcflow-redact"

HEAD = """\
connectors:
  - name: shop
    source: {type: tikv, playground: true}
    sinks: [{type: file, path: /tmp/out}]
    transforms:
"""


def issues_of(transforms: str, plugins: PluginManager | None = None) -> list[str]:
    text = HEAD + textwrap.indent(textwrap.dedent(transforms), "      ")
    _, issues = validate_text(text, "connectors.yaml", plugins or PluginManager.default(autoload=False))
    return [str(i) for i in issues]


def test_a_valid_chain_validates():
    assert issues_of("""\
        - type: filter
          tables: ["shop.orders"]
          where: "amount > 100 OR _op = 'delete'"
        - type: project
          drop: [note]
          computed: [{name: big, expr: "amount * 2", type: bigint}]
        - type: mask
          columns: [email]
        - type: route
          routes: [{source: 'shard_(\\d+)\\.users', target: all.users}]
          source-column: _src
    """) == []  # fmt: skip


def test_errors_name_file_line_connector_transform_and_field(monkeypatch):
    monkeypatch.delenv("CDCFLOW_MASK_SALT")
    found = issues_of("""\
        - type: filter
          where: "amount >> 3"
        - type: project
          computed: [{name: x, expr: "upper(a", type: varchar(9)}]
        - type: mask
          columns: [email]
        - type: route
          routes: [{source: 'shard_(\\d+', target: all.x}]
        - type: nope
        - type: filter
          tables: ["shop.`orders"]
          where: "a = 1"
    """)  # fmt: skip
    joined = "\n".join(found)
    assert "connectors.yaml:7:" in joined and "connectors[0].transforms[0].where" in joined
    assert "connector shop, transforms[0] (filter): expected a value, found '>'" in joined
    assert "connectors.yaml:9:" in joined and "transforms[1] (project)" in joined and "computed[0].expr" in joined
    assert "transforms[2] (mask)" in joined and "salt-env" in joined and "CDCFLOW_MASK_SALT is not set" in joined
    assert "transforms[3].routes[0].source" in joined and "not a regular expression" in joined
    assert "unknown transform type 'nope'" in joined and "filter, mask, project, python, route" in joined
    assert "connectors.yaml:16:" in joined and "transforms[5].tables" in joined


def test_a_transform_from_an_entry_point_package(monkeypatch):
    """The how-to's example package, loaded through the entry-point group like an installed one."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    entry_point = metadata.EntryPoint(name="redact", value="cdcflow_redact", group="cdcflow")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [entry_point] if group == "cdcflow" else [])
    plugins = PluginManager.default(autoload=True)
    assert plugins.transforms.get("redact-email").origin.kind == "entry-point"
    text = HEAD + textwrap.indent(
        "- {type: redact-email, tables: [shop.orders]}\n- {type: python, function: 'cdcflow_redact:domains'}\n",
        "      ",
    )
    deployment, issues = validate_text(text, "connectors.yaml", plugins)
    assert issues == [] and deployment is not None
    chain = pickle.loads(pickle.dumps(deployment.connectors[0].transform_chain()))
    s = schema()
    out = chain.apply([row(s, "insert", {"id": 1, "amount": 1, "email": "ann@example.com"})])
    assert out[0].after == {"id": 1, "amount": 1, "email": "example.com"}
