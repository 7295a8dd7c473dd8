"""``initial-snapshot``: accepted for sources that can read a table as of one ts, refused
(a located issue, 1001 through the API) for the others."""

from __future__ import annotations

import pytest

from cdcflow.core.config.loader import validate_text
from cdcflow.core.control.coordinator.spec import section_from_request, validate_section
from cdcflow.core.data.events import ColumnInfo, TableName, TableSchema
from cdcflow.core.data.pipeline.runtime import create_table_ddl
from cdcflow.core.errors import ConfigInvalidError


def _file(source: str) -> str:
    return f"""connectors:
  - name: feed
    source: {source}
    sinks: [{{type: file, path: /tmp/out}}]
    initial-snapshot: true
"""


def test_tikv_takes_it() -> None:
    deployment, issues = validate_text(_file("{type: tikv}"), "c.yaml")
    assert not issues and deployment is not None
    assert deployment.connectors[0].settings.initial_snapshot is True


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("{type: tikv, kv-api: rawkv, key-spans: [['00', 'ff']]}", "rawkv keeps no versions"),
        ("{type: cockroachdb, dsn: 'postgresql://root@localhost:26257/db'}", "initial_scan"),
    ],
)
def test_sources_that_cannot_are_refused_at_the_option_line(source: str, why: str) -> None:
    _, issues = validate_text(_file(source), "c.yaml")
    assert len(issues) == 1
    issue = issues[0]
    assert (issue.file, issue.line) == ("c.yaml", 5)
    assert "initial-snapshot" in issue.path and why in issue.message


def test_the_api_refuses_it_with_1001() -> None:
    body = {"changefeed_id": "feed", "source": {"type": "cockroachdb", "dsn": "postgresql://x@y:1/d"}}
    body |= {"sinks": [{"type": "file", "path": "/tmp/out"}], "initial_snapshot": True}
    with pytest.raises(ConfigInvalidError) as raised:
        validate_section(section_from_request(body))
    assert raised.value.code == 1001 and "initial-snapshot" in str(raised.value.issues[0].path)


def test_create_table_ddl_has_the_columns_and_the_handle_key() -> None:
    schema = TableSchema(
        TableName("shop", "or`ders", 7, 8),
        (
            ColumnInfo("id", 8, ColumnInfo.HANDLE_KEY, "bigint(20)", nullable=False),
            ColumnInfo("note", 15, 0, "varchar(255)"),
        ),
    )
    ddl = create_table_ddl(schema, 41)
    assert ddl.query == (
        "CREATE TABLE IF NOT EXISTS `shop`.`or``ders` (`id` bigint(20) NOT NULL, `note` varchar(255), "
        "PRIMARY KEY (`id`))"
    )
    assert (ddl.commit_ts, ddl.action_type, ddl.schema_after) == (41, 3, schema)
    assert ddl.table == TableName("shop", "or`ders", 7)
