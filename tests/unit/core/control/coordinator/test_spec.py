"""A changefeed's settings survive the metastore: connectors.yaml → ChangeFeedInfo → the executor's connector."""

from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.control.coordinator.spec import connector_for, info_from_connector, validate_section
from cdcflow.core.plugin.manager import PluginManager

PLUGINS = {
    "source": {"type": "tikv", "pd": ["127.0.0.1:2379"]},
    "sinks": [{"uri": "file:///tmp/cdcflow-spec-test?protocol=json"}],
}


def test_memory_and_disk_quotas_reach_the_connector_the_executor_builds() -> None:
    plugins = PluginManager.default(autoload=False)
    section = {
        "name": "quota-kept",
        **PLUGINS,
        "memory-quota": "64MiB",
        "spill-disk-quota": "2GiB",
    }
    info = info_from_connector(validate_section(section, plugins), section, now=1_700_000_000.0)
    stored = ChangeFeedInfo.from_json(info.to_json())  # what the metastore gives back
    settings = connector_for(stored, plugins).settings
    assert (settings.memory_quota, settings.spill_disk_quota) == (64 * 2**20, 2 * 2**30)


def test_a_record_stored_without_quotas_gets_the_defaults() -> None:
    plugins = PluginManager.default(autoload=False)
    old = {"id": "older", **PLUGINS, "state": "normal"}
    settings = connector_for(ChangeFeedInfo.from_json(old), plugins).settings
    assert (settings.memory_quota, settings.spill_disk_quota) == (1024**3, 0)


def test_every_filter_option_and_the_stuck_duration_survive_the_metastore() -> None:
    plugins = PluginManager.default(autoload=False)
    section = {
        "name": "filter-kept",
        "description": "orders only",
        **PLUGINS,
        "filter": {
            "rules": ["Shop.*", "!Shop.audit"],
            "case-sensitive": True,
            "ignore-txn-start-ts": [42],
            "column-selectors": [{"matcher": ["Shop.orders"], "columns": ["id", "total"]}],
        },
        "error-stuck-duration": "10m",
    }
    declared = validate_section(section, plugins).settings
    info = info_from_connector(validate_section(section, plugins), section, now=1_700_000_000.0)
    settings = connector_for(ChangeFeedInfo.from_json(info.to_json()), plugins).settings
    assert settings.filter == declared.filter
    assert settings.filter.case_sensitive and settings.filter.ignore_txn_start_ts == [42]
    assert [s.columns for s in settings.filter.column_selectors] == [["id", "total"]]
    assert (settings.error_stuck_duration, settings.description) == (600.0, "orders only")


def test_a_record_stored_with_filter_rules_alone_keeps_its_rules() -> None:
    plugins = PluginManager.default(autoload=False)
    old = {"id": "older", **PLUGINS, "state": "normal", "filter_rules": ["shop.*"]}
    settings = connector_for(ChangeFeedInfo.from_json(old), plugins).settings
    assert settings.filter.rules == ["shop.*"] and not settings.filter.case_sensitive
