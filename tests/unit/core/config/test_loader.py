import textwrap

import pytest

from cdcflow.core.config import load_deployment, validate_text
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin import PluginManager
from tests import REPO


@pytest.fixture(scope="module")
def pm():
    return PluginManager.default(autoload=False)


def check(text, pm, env=None):
    deployment, issues = validate_text(textwrap.dedent(text), "c.yaml", pm, env or {})
    return deployment, [str(i) for i in issues]


def test_committed_connectors_yaml_is_valid(pm):
    deployment = load_deployment(REPO / "connectors.yaml", pm)
    assert deployment.connectors
    for connector in deployment.connectors:
        assert connector.sinks


GOOD = """
server:
  metastore: sqlite:///tmp/m.db
connectors:
  - name: orders-feed
    source: {type: tikv, pd: ["10.0.0.1:2379"]}
    sinks:
      - uri: file:///tmp/out?protocol=json&fsync=false
      - type: file
        path: /tmp/other
"""


def test_valid_file_gives_typed_plugin_configs(pm):
    deployment, issues = check(GOOD, pm)
    assert issues == []
    cf = deployment.connector("orders-feed")
    assert cf.source.type_name == "tikv"
    assert cf.source.config.pd == ["10.0.0.1:2379"]
    assert [s.type_name for s in cf.sinks] == ["file", "file"]
    assert cf.sinks[0].config.fsync is False
    assert cf.sinks[0].config.uri.startswith("file:///tmp/out")
    assert cf.scheduler.type_name == "two-phase"
    assert cf.settings.memory_quota == 1024**3
    assert cf.settings.error_stuck_duration == 1800


def test_a_sink_whose_uri_expands_to_nothing_is_left_out(pm):
    text = """
    connectors:
      - name: cf
        source: {type: tikv, pd: ["10.0.0.1:2379"]}
        sinks:
          - uri: file:///tmp/out
          - uri: ${MYSQL_URL:-}
    """
    deployment, issues = check(text, pm)
    assert issues == [] and [s.type_name for s in deployment.connector("cf").sinks] == ["file"]
    deployment, issues = check(text, pm, {"MYSQL_URL": "mysql://root@db:3306/"})
    assert issues == [] and [s.type_name for s in deployment.connector("cf").sinks] == ["file", "mysql"]


def test_unknown_field_names_line_path_and_allowed(pm):
    _, issues = check(
        """
        connectors:
          - name: a
            source: {type: tikv}
            sinks: [{type: file, colour: red}]
        """,
        pm,
    )
    assert len(issues) == 1
    assert issues[0].startswith("c.yaml:5:")
    assert "connectors[0].sinks[0].colour" in issues[0]
    assert "unknown field 'colour'; allowed: fsync, path, protocol, uri" in issues[0]


def test_wrong_type_is_located(pm):
    _, issues = check(
        """
        connectors:
          - name: a
            source:
              type: tikv
              pd: 5
            sinks: [{type: file}]
        """,
        pm,
    )
    assert issues == ["c.yaml:6:7: connectors[0].source.pd: Input should be a valid list (got 5)"]


def test_unknown_plugin_type_lists_known(pm):
    _, issues = check(
        """
        connectors:
          - name: a
            source: {type: oracle}
            sinks: [{type: file}]
        """,
        pm,
    )
    assert len(issues) == 1
    assert "connectors[0].source.type: unknown source type 'oracle'; known: cockroachdb, tikv" in issues[0]
    assert issues[0].startswith("c.yaml:4:")


def test_unknown_uri_scheme(pm):
    _, issues = check(
        """
        connectors:
          - name: a
            source: {type: tikv}
            sinks: [{uri: "pulsar://x/y"}]
        """,
        pm,
    )
    assert len(issues) == 1
    assert "no sink handles URI scheme 'pulsar://'; known: file://" in issues[0]


def test_duplicate_connector_name_points_at_first(pm):
    _, issues = check(
        """
        connectors:
          - name: a
            source: {type: tikv}
            sinks: [{type: file}]
          - name: a
            source: {type: tikv}
            sinks: [{type: file}]
        """,
        pm,
    )
    assert issues == [
        "c.yaml:6:5: connectors[1].name: duplicate connector name 'a' (first defined on line 3); "
        "names are changefeed ids and must be unique"
    ]


def test_duplicate_yaml_key_is_rejected(pm):
    _, issues = check(
        """
        server:
          api-addr: 127.0.0.1:1
          api-addr: 127.0.0.1:2
        """,
        pm,
    )
    assert len(issues) == 1
    assert "duplicate key 'api-addr' (first given on line 3)" in issues[0]


def test_env_references(pm):
    text = """
        connectors:
          - name: a
            source: {type: tikv, pd: ["${PD_ADDR}"], tidb-status: "${STATUS:-h:1}"}
            sinks: [{type: file}]
        """
    deployment, issues = check(text, pm, env={"PD_ADDR": "pd:2379"})
    assert issues == []
    assert deployment.connectors[0].source.config.pd == ["pd:2379"]
    assert deployment.connectors[0].source.config.tidb_status == "h:1"
    _, issues = check(text, pm, env={})
    assert len(issues) == 1
    assert "environment variable PD_ADDR is not set" in issues[0]


def test_uri_option_errors_point_at_uri(pm):
    _, issues = check(
        """
        connectors:
          - name: a
            source: {type: tikv}
            sinks: [{uri: "file:///x?fsync=maybe"}]
        """,
        pm,
    )
    assert len(issues) == 1
    assert "connectors[0].sinks[0].uri: in the uri, 'fsync'" in issues[0]


def test_option_both_in_uri_and_mapping(pm):
    _, issues = check(
        """
        connectors:
          - name: a
            source: {type: tikv}
            sinks: [{uri: "file:///x?protocol=json", protocol: json}]
        """,
        pm,
    )
    assert any("'protocol' is given both here and in the uri" in i for i in issues)


def test_plugin_check_config_runs(pm):
    _, issues = check(
        """
        connectors:
          - name: a
            source: {type: tikv}
            sinks: [{type: file, protocol: avro-ish}]
        """,
        pm,
    )
    assert len(issues) == 1
    assert "unknown protocol 'avro-ish'; known codecs: " in issues[0] and "json" in issues[0]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("start-ts", "-1", "start-ts must be a TSO"),
        ("memory-quota", "12XB", "is not a size"),
        ("error-stuck-duration", "soon", "is not a duration"),
        ("filter", "{rules: ['noschema']}", "not of the form schema.table"),
    ],
)
def test_connector_field_errors(pm, field, value, message):
    _, issues = check(
        f"""
        connectors:
          - name: ok
            source: {{type: tikv}}
            sinks: [{{type: file}}]
            {field}: {value}
        """,
        pm,
    )
    assert len(issues) == 1, issues
    assert message in issues[0]
    assert f"connectors[0].{field}" in issues[0]


def test_bad_connector_name(pm):
    _, issues = check(
        """
        connectors:
          - name: bad_name
            source: {type: tikv}
            sinks: [{type: file}]
        """,
        pm,
    )
    assert len(issues) == 1
    assert "c.yaml:3:5: connectors[0].name: 'bad_name' is not a valid connector name" in issues[0]


def test_syntax_error_has_line(pm):
    _, issues = check("server:\n  metastore: [unclosed\n", pm)
    assert len(issues) == 1
    assert issues[0].startswith("c.yaml:3:")
    assert "not valid YAML" in issues[0]


def test_unknown_top_level_section(pm):
    _, issues = check("servers: {}\n", pm)
    assert issues == ["c.yaml:1:1: servers: unknown section 'servers'; allowed: server, connectors"]


def test_load_deployment_raises_with_all_issues(tmp_path, pm):
    path = tmp_path / "c.yaml"
    path.write_text("server: {metastore: mysql://x, bogus: 1}\n")
    with pytest.raises(ConfigInvalidError) as info:
        load_deployment(path, pm)
    assert len(info.value.issues) == 2
    assert info.value.code == 1001


def test_missing_file(tmp_path, pm):
    with pytest.raises(ConfigInvalidError, match="cannot read"):
        load_deployment(tmp_path / "nope.yaml", pm)


@pytest.mark.parametrize(
    ("env", "sinks"),
    [
        ({}, ["kafka", "file", "spark"]),
        ({"MYSQL_URL": "mysql://root:pw@db.example:3307/"}, ["kafka", "file", "spark", "mysql"]),
    ],
)
def test_committed_connectors_yaml_writes_spark_tables_and_mysql_only_with_mysql_url(pm, env, sinks):
    """What `make run` runs: Spark tables by default, the MySQL sink too once MYSQL_URL is set."""
    deployment = load_deployment(REPO / "connectors.yaml", pm, env)
    (connector,) = deployment.connectors
    assert [s.type_name for s in connector.sinks] == sinks
    if "mysql" in sinks:
        assert connector.sinks[-1].config.uri == env["MYSQL_URL"]


def test_make_run_runs_the_committed_connectors_yaml():
    recipe = (REPO / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "validate connectors.yaml" in recipe and "run connectors.yaml" in recipe


def test_spark_keep_workers_is_a_duration_0_turns_it_off(pm):
    deployment, issues = check(GOOD, pm)
    assert issues == [] and deployment.server.spark.keep_workers == 40.0
    deployment, issues = check(GOOD.replace("server:\n", "server:\n  spark: {keep-workers: 30s}\n"), pm)
    assert issues == [] and deployment.server.spark.keep_workers == 30.0
    deployment, issues = check(GOOD.replace("server:\n", "server:\n  spark: {keep-workers: 0}\n"), pm)
    assert issues == [] and deployment.server.spark.keep_workers == 0
    _, issues = check(GOOD.replace("server:\n", "server:\n  spark: {keep-workers: -5s}\n"), pm)
    assert len(issues) == 1 and "server.spark.keep-workers" in issues[0], issues


def test_spark_jit_is_auto_quick_or_full(pm):
    deployment, issues = check(GOOD, pm)
    assert issues == [] and deployment.server.spark.jit == "auto"
    deployment, issues = check(GOOD.replace("server:\n", "server:\n  spark: {jit: quick}\n"), pm)
    assert issues == [] and deployment.server.spark.jit == "quick"
    _, issues = check(GOOD.replace("server:\n", "server:\n  spark: {jit: fast}\n"), pm)
    assert len(issues) == 1 and "server.spark.jit" in issues[0], issues


def test_spark_snapshot_read_ahead_is_on_unless_turned_off(pm):
    deployment, issues = check(GOOD, pm)
    assert issues == [] and deployment.server.spark.snapshot_read_ahead is True
    deployment, issues = check(GOOD.replace("server:\n", "server:\n  spark: {snapshot-read-ahead: false}\n"), pm)
    assert issues == [] and deployment.server.spark.snapshot_read_ahead is False
    _, issues = check(GOOD.replace("server:\n", "server:\n  spark: {snapshot-read-ahead: sometimes}\n"), pm)
    assert len(issues) == 1 and "server.spark.snapshot-read-ahead" in issues[0], issues
