"""What the transform check against the source does without asking it."""

from __future__ import annotations

import asyncio

from cdcflow.core.config.loader import validate_text
from cdcflow.core.config.sourcecheck import check_transforms
from cdcflow.core.plugin.manager import PluginManager

TEXT = """\
connectors:
  - name: shop
    source: {{type: tikv, playground: true}}
    sinks: [{{uri: "file:///tmp/out"}}]
{transforms}
"""


def connector(transforms: str):
    deployment, issues = validate_text(
        TEXT.format(transforms=transforms), "c.yaml", PluginManager.default(autoload=False), env={}
    )
    assert not issues and deployment is not None, issues
    return deployment.connectors[0]


def test_a_connector_without_transforms_needs_no_source():
    check = asyncio.run(check_transforms(connector("")))
    assert check.problems == [] and check.note is None and check.tables == 0


def test_the_embedded_playground_is_not_started_to_check_columns():
    transforms = "    transforms: [{type: filter, where: 'id > 0'}]"
    check = asyncio.run(check_transforms(connector(transforms), timeout=0.5))
    assert check.problems == []
    assert check.note == (
        "connector shop: transform columns and routes were not checked against the source: "
        "its upstream is the embedded playground, which starts with the capture"
    )
