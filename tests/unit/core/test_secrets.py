"""Secrets are masked by one function wherever a configuration is shown."""

import os

import pytest
from pydantic import SecretStr

from cdcflow.core.config import validate_text
from cdcflow.core.control.metastore.sqlite import SQLiteMetaStore
from cdcflow.core.errors import ConfigInvalidError, DownstreamUnavailableError
from cdcflow.core.plugin import PluginManager
from cdcflow.core.secrets import MASK, mask_text, mask_uri, redact, secret_keys


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("mysql://u:secret@pw4@h:3306/", "mysql://u:******@h:3306/"),
        ("mysql://u:p%40ss@h/?safe-mode=true", "mysql://u:******@h/?safe-mode=true"),
        ("mysql://root@h:3306/", "mysql://root@h:3306/"),
        ("file:///tmp/out?protocol=json", "file:///tmp/out?protocol=json"),
        (
            "kafka://b:9092/t?sasl-user=u&sasl-password=hunter2&sasl-mechanism=PLAIN",
            "kafka://b:9092/t?sasl-user=u&sasl-password=******&sasl-mechanism=PLAIN",
        ),
        (
            "kafka://b/t?ssl-key-password=k&Password=p&token=t",
            "kafka://b/t?ssl-key-password=******&Password=******&token=******",
        ),
        (
            "kafka://b/t?protocol=avro&schema-registry=https://reg:s3cret@registry:8081",
            "kafka://b/t?protocol=avro&schema-registry=https://reg:******@registry:8081",
        ),
        (
            "kafka://b/t?schema-registry=https%3A%2F%2Freg%3As3cret%40registry%3A8081&x=1",
            "kafka://b/t?schema-registry=https://reg:******@registry:8081&x=1",
        ),
    ],
)
def test_uris_lose_their_secrets_and_keep_everything_else(uri, shown):
    assert mask_uri(uri) == shown
    assert redact({"uri": uri}) == {"uri": shown}


def test_the_api_uses_the_one_masking_function():
    from cdcflow.core.api import server

    assert server.redact is redact
    assert server.redact(["mysql://u:secret@pw4@h/"]) == ["mysql://u:******@h/"]


def test_fields_plugins_declare_secret_are_masked_by_name_and_alias():
    PluginManager.default(autoload=False)  # loads the built-in plugins' configs
    assert {"password", "sasl-password"} <= secret_keys()
    sink = {"type": "kafka", "sasl_password": "a", "sasl-password": "b", "sasl-user": "u"}
    shown = redact({"sinks": [sink], "x": SecretStr("s")})
    assert shown == {"sinks": [{**sink, "sasl_password": MASK, "sasl-password": MASK}], "x": MASK}


def test_error_messages_and_issues_never_carry_a_secret():
    uri = "kafka://b:9092/t?sasl-password=hunter2"
    for error in (ConfigInvalidError(f"bad {uri!r}"), DownstreamUnavailableError("mysql://u:secret@pw4@h/ down")):
        assert "hunter2" not in str(error) and "secret" not in str(error) and "pw4" not in str(error)
        assert "hunter2" not in repr(error.to_dict()) and "pw4" not in repr(error.to_dict())
    assert mask_text("host=h password=pw user=u") == "host=h password=****** user=u"


def test_validate_does_not_echo_a_secret_it_refuses():
    text = """
connectors:
  - name: cf
    source: {type: tikv, pd: ["10.0.0.1:2379"]}
    sinks:
      - uri: "kafka://b:9092/t?sasl-password=hunter2&brokers=x"
      - {type: mysql, password: [1, 2]}
      - {type: kafka, uri: "kafka://b:99999/t?sasl-password=hunter2"}
"""
    _, issues = validate_text(text, "c.yaml", PluginManager.default(autoload=False), {})
    assert len(issues) == 3, [str(i) for i in issues]
    assert not any("hunter2" in str(i) for i in issues)


def test_the_sqlite_metastore_is_readable_by_its_owner_only(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "meta.db"
        store = SQLiteMetaStore(str(path))
        store._db.execute("CREATE TABLE IF NOT EXISTS probe (x)")  # writes through the WAL
        for name in ("meta.db", "meta.db-wal", "meta.db-shm"):
            assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
        store._db.close()
        # One an older version left world-readable is tightened when opened.
        os.chmod(path, 0o644)
        SQLiteMetaStore(str(path))._db.close()
        assert path.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
