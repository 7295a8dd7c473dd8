"""MySQL sink options from URIs, and their validation."""

from __future__ import annotations

import datetime as dt

import pytest

from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from cdcflow.plugins.sinks.mysql.config import describe_issues, session_zone, session_zone_sql, target_of


def config_of(uri: str) -> MySQLSinkConfig:
    return MySQLSinkConfig(**MySQLSink.options_from_uri(uri))


def test_uri_gives_address_credentials_and_options() -> None:
    cfg = config_of("mysql+ssl://app:p%40ss@db.example:3307/?worker-count=4&safe-mode=true&max-txn-row=64")
    target = target_of(cfg)
    assert (target.host, target.port, target.user, target.password, target.tls) == (
        "db.example",
        3307,
        "app",
        "p@ss",
        True,
    )
    assert (cfg.worker_count, cfg.safe_mode, cfg.max_txn_row) == (4, True, 64)
    assert "p@ss" not in repr(target)


def test_tidb_scheme_selects_the_same_sink() -> None:
    pm = PluginManager.default(autoload=False)
    assert pm.sinks["mysql"] is MySQLSink
    assert "tidb" in MySQLSink.uri_schemes and target_of(config_of("tidb://root@h:4000/")).port == 4000


def test_bad_options_are_reported_with_their_field() -> None:
    with pytest.raises(ConfigInvalidError):
        target_of(config_of("mysql:///nohost"))
    issues = dict(describe_issues(config_of("mysql://h/?time-zone=Mars/Olympus&ssl-cert=/c.pem")))
    assert set(issues) == {"time-zone", "ssl-cert"}
    with pytest.raises(ValueError):
        config_of("mysql://h/?worker-count=0")


def test_time_zones() -> None:
    assert session_zone("UTC") is dt.UTC
    zone = session_zone("-05:30")
    assert session_zone_sql("-05:30", zone) == "-05:30"
    assert session_zone_sql("Asia/Tokyo", session_zone("Asia/Tokyo")) == "Asia/Tokyo"
