"""Configuration files written by mistake or by an attacker: every one is a coded
config error naming file, line and field, within bounded time and memory."""

import textwrap
import time

import pytest

from cdcflow.core.cli import main as cli_main
from cdcflow.core.cli._common import EXIT_CONFIG
from cdcflow.core.config import load_deployment, validate_text
from cdcflow.core.config.yamlsrc import MAX_NODES
from cdcflow.core.errors import ConfigInvalidError, ErrorCode
from cdcflow.core.plugin import PluginManager


@pytest.fixture(scope="module")
def pm():
    return PluginManager.default(autoload=False)


def issues_of(text, pm):
    deployment, issues = validate_text(textwrap.dedent(text), "c.yaml", pm, {})
    assert deployment is None
    return issues


def connector(extra="", name="cf", uri="file:///tmp/out"):
    return f"""
connectors:
  - name: {name}
    source: {{type: tikv, pd: ["10.0.0.1:2379"]}}
    sinks: [{{uri: "{uri}"}}]
    {extra}
"""


# -- anchors and aliases ------------------------------------------------------------------


def billion_laughs(levels=9):
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * 9) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\nconnectors: *l9\n"


def test_nested_aliases_are_refused_quickly_at_their_line(pm):
    started = time.monotonic()
    issues = issues_of(billion_laughs(), pm)
    assert time.monotonic() - started < 10
    assert len(issues) == 1
    assert f"expands to more than {MAX_NODES} values" in issues[0].message
    assert issues[0].file == "c.yaml" and issues[0].line is not None


def test_ordinary_aliases_still_work(pm):
    text = """
    sink: &files {uri: "file:///tmp/out"}
    """
    # an unknown top-level key is reported, but the alias itself expands
    deployment, issues = validate_text(
        textwrap.dedent(
            """
            connectors:
              - name: a
                source: &src {type: tikv, pd: ["10.0.0.1:2379"]}
                sinks: &sinks [{uri: "file:///tmp/out"}]
              - name: b
                source: *src
                sinks: *sinks
            """
        ),
        "c.yaml",
        pm,
        {},
    )
    assert issues == [] and [c.name for c in deployment.connectors] == ["a", "b"]
    assert text


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("server: &s\n  spark: *s\n", "server.spark"),
        ("connectors: &c [*c]\n", "connectors[0]"),
    ],
)
def test_a_self_referencing_anchor_is_a_located_issue(pm, text, path):
    issues = issues_of(text, pm)
    cycle = [i for i in issues if "cycle" in i.message]
    assert len(cycle) == 1
    assert (cycle[0].line, cycle[0].path) == (1, path)


def test_deep_nesting_is_a_located_issue(pm):
    issues = issues_of("connectors: " + "[" * 5000 + "]" * 5000 + "\n", pm)
    assert len(issues) == 1 and "nested more than" in issues[0].message
    assert issues[0].line == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server: !!python/name:os.system ''\n", "not a plain value"),
        ("server: {gc-ttl: !!float 'x'}\n", "is not a valid float"),
        ("connectors: 2001-13-45\n", "is not a valid timestamp"),
        ("server: {api-addr: \x07}\n", "is not allowed in a YAML file"),
    ],
)
def test_values_yaml_cannot_build_are_located_issues(pm, text, message):
    issues = issues_of(text, pm)
    hits = [i for i in issues if message in i.message]
    assert len(hits) == 1, [str(i) for i in issues]
    assert hits[0].line == 1


# -- values out of range --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "uri", "path", "message"),
    [
        ("start-ts: 100000000000000000000000000000000000", None, "start-ts", "at most 9223372036854775807"),
        ("target-ts: 100000000000000000000000000000000000", None, "target-ts", "less than or equal to"),
        ("memory-quota: 1000000000000000000000000000000000000000GiB", None, "memory-quota", "largest size"),
        ("memory-quota: " + "9" * 400 + "GiB", None, "memory-quota", "is not a size"),
        ("error-stuck-duration: 1.0e+400", None, "error-stuck-duration", "at most 100 years"),
        ("error-stuck-duration: " + "9" * 400 + "h", None, "error-stuck-duration", "at most 100 years"),
        ("", "kafka://broker:99999/topic", "sinks[0].uri", "port in 1..65535"),
        ("", "kafka://a:9092,b:x/topic", "sinks[0].uri", "port in 1..65535"),
        ("", "kafka://[::1/topic", "sinks[0].uri", "not a valid URI"),
        ("", "mysql://root@db:99999/", "sinks[0].uri", "port"),
    ],
)
def test_out_of_range_values_are_refused_by_validate(pm, extra, uri, path, message):
    issues = issues_of(connector(extra, uri=uri or "file:///tmp/out"), pm)
    assert len(issues) == 1, [str(i) for i in issues]
    assert issues[0].path == f"connectors[0].{path}"
    assert message in issues[0].message and issues[0].line is not None


def test_ipv6_brokers_with_ports_are_valid(pm):
    deployment, issues = validate_text(connector(uri="kafka://[::1]:9092,[fe80::1]:9093/t"), "c.yaml", pm, {})
    assert issues == [] and deployment is not None


# -- what can be known before starting ------------------------------------------------------


def test_a_connector_name_too_long_for_a_file_name_is_refused(pm):
    issues = issues_of(connector(name="a" * 300), pm)
    assert len(issues) == 1 and "at most 128" in issues[0].message
    assert issues[0].path == "connectors[0].name" and issues[0].line == 3
    deployment, issues = validate_text(connector(name="a" * 128), "c.yaml", pm, {})
    assert issues == [] and deployment is not None


@pytest.mark.parametrize(
    ("extra", "path", "message"),
    [
        ("memory-quota: 16KiB", "memory-quota", "at least 1MiB"),
        ("memory-quota: 16MiB\n    spill-disk-quota: 1KiB", "spill-disk-quota", "below memory-quota"),
    ],
)
def test_quotas_that_could_never_make_progress_are_refused(pm, extra, path, message):
    issues = issues_of(connector(extra), pm)
    assert len(issues) == 1, [str(i) for i in issues]
    assert issues[0].path == f"connectors[0].{path}" and message in issues[0].message


def test_quotas_at_their_minimums_are_valid(pm):
    text = connector("memory-quota: 1MiB\n    spill-disk-quota: 1MiB")
    deployment, issues = validate_text(text, "c.yaml", pm, {})
    assert issues == [] and deployment is not None


# -- files that are not text, and the exit code of run and server ----------------------------


def test_a_file_that_is_not_utf8_is_a_located_config_error(pm, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"connectors:\n  - name: caf\xe9\n")
    with pytest.raises(ConfigInvalidError) as info:
        load_deployment(path, pm)
    assert info.value.code == ErrorCode.ErrConfigInvalid
    (issue,) = info.value.issues
    assert (issue.file, issue.line, issue.column) == (str(path), 2, 14)
    assert "0xe9 is not UTF-8" in issue.message


@pytest.mark.parametrize("content", [b"server: {api-addr: \xff}\n", b"server: {api-adr: x}\n"])
@pytest.mark.parametrize("command", ["validate", "run", "server"])
def test_every_command_exits_3_on_an_invalid_file(capsys, tmp_path, command, content):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    argv = [command, str(path)] if command != "server" else [command, "--config", str(path)]
    assert cli_main.main(argv) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"{path}:1:" in err and "Traceback" not in err
