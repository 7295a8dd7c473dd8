"""Changefeed declarations: from API requests and connectors.yaml entries to
:class:`~cdcflow.core.control.changefeed.ChangeFeedInfo`, and back to validated plugins.

Validation goes through the same code as ``cdcflow validate`` (each plugin's
own config model), so an invalid sink or source is a 1001 naming the field.
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from cdcflow.core.config.loader import Connector, validate_text
from cdcflow.core.config.settings import CONNECTOR_OPTIONS, ConnectorSettings
from cdcflow.core.control.changefeed import ChangeFeedInfo
from cdcflow.core.data.events import tso_from_ms
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue
from cdcflow.core.plugin.manager import PluginManager

__all__ = [
    "DECLARED_FIELDS",
    "connector_for",
    "declaration_changes",
    "info_from_connector",
    "section_from_request",
    "section_of",
    "validate_section",
]


def _key(name: str) -> str:
    """The connectors.yaml key of the connector field ``name``."""
    return ConnectorSettings.model_fields[name].alias or name


def section_from_request(body: dict[str, Any]) -> dict[str, Any]:
    """A connectors.yaml entry from a create/update request: the connector's fields by
    their Python names (TiCDC's ``changefeed_id``, ``sink_uri`` and 0 for no
    ``start_ts`` / ``target_ts`` accepted)."""
    section: dict[str, Any] = {"name": body.get("changefeed_id") or body.get("id") or body.get("name")}
    if section["name"] is None:
        raise ConfigInvalidError(
            "changefeed_id is required", [ConfigIssue("required field is missing", path="changefeed_id")]
        )
    for key in ("source", "sinks", "scheduler"):
        if body.get(key) is not None:
            section[key] = body[key]
    if body.get("sink_uri") and "sinks" not in section:
        section["sinks"] = [{"uri": body["sink_uri"]}]
    if body.get("start_ts") not in (None, 0):
        section["start-ts"] = body["start_ts"]
    if body.get("target_ts"):
        section["target-ts"] = body["target_ts"]
    for name in CONNECTOR_OPTIONS:
        if name != "target_ts" and body.get(name) is not None:
            section[_key(name)] = body[name]
    return section


def validate_section(section: dict[str, Any], plugins: PluginManager | None = None) -> Connector:
    """Validate one connector section; ConfigInvalidError (1001) naming each bad field."""
    text = yaml.safe_dump({"connectors": [section]}, sort_keys=False)
    deployment, issues = validate_text(text, "<request>", plugins, env={})
    if issues or deployment is None or not deployment.connectors:
        fixed = [
            ConfigIssue(i.message, path=i.path.removeprefix("connectors.0.").removeprefix("connectors[0].").strip("."))
            for i in issues
        ]
        fields = ", ".join(i.path or "<root>" for i in fixed)
        raise ConfigInvalidError(f"invalid changefeed configuration ({fields})", fixed)
    return deployment.connectors[0]


def info_from_connector(connector: Connector, section: dict[str, Any], now: float | None = None) -> ChangeFeedInfo:
    """A new ChangeFeedInfo (state Normal) for a validated connector; the plugin
    sections and the filter are kept as the user wrote them (``section``), so they
    validate again, the other options as validated (bytes, seconds, ...)."""
    now = time.time() if now is None else now
    s = connector.settings
    start_ts = tso_from_ms(int(now * 1000)) if s.start_ts == "now" else int(s.start_ts)
    options = s.model_dump(mode="json", include=set(CONNECTOR_OPTIONS) - {"filter"})
    return ChangeFeedInfo(
        id=s.name,
        source=dict(section["source"]),
        sinks=[dict(sink) for sink in section["sinks"]],
        scheduler=dict(section["scheduler"]) if section.get("scheduler") else None,
        filter_rules=list(s.filter.rules),
        start_ts=start_ts,
        created_at=now,
        state_changed_at=now,
        filter=dict(section["filter"]) if section.get("filter") else None,
        **options,
    )


def section_of(info: ChangeFeedInfo) -> dict[str, Any]:
    """The connectors.yaml entry a stored changefeed was declared with: every
    setting a capture applies (filter options and quotas included), so that a
    restart or an update runs it as declared."""
    section: dict[str, Any] = {"name": info.id, "source": info.source, "sinks": info.sinks, "start-ts": info.start_ts}
    section.update((_key(name), value) for name, value in info.options().items())
    if info.scheduler is not None:
        section["scheduler"] = info.scheduler
    return section


def connector_for(info: ChangeFeedInfo, plugins: PluginManager | None = None) -> Connector:
    """The validated plugins of a stored changefeed."""
    return validate_section(section_of(info), plugins)


#: What a changefeed's declaration consists of: the connector's fields an update may
#: change, in declaration order (``start_ts`` is where it began and stays; the name is
#: its id; state and progress are not declared).
DECLARED_FIELDS: tuple[str, ...] = tuple(
    name for name in ConnectorSettings.model_fields if name not in {"name", "start_ts"}
)


def declaration_changes(stored: ChangeFeedInfo, declared: ChangeFeedInfo) -> list[str]:
    """The declared fields in which ``declared`` differs from ``stored`` (empty: the same)."""

    def declaration(info: ChangeFeedInfo) -> dict[str, Any]:
        return {"source": info.source, "sinks": info.sinks, "scheduler": info.scheduler, **info.options()}

    old, new = declaration(stored), declaration(declared)
    return [name for name in DECLARED_FIELDS if old[name] != new[name]]
