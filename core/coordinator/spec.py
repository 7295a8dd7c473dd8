"""Changefeed declarations: from API requests and connectors.yaml entries to
:class:`~cdcflow.core.model.ChangeFeedInfo`, and back to validated plugins.

Validation goes through the same code as ``cdcflow validate`` (each plugin's
own config model), so an invalid sink or source is a 1001 naming the field.
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from cdcflow.core.config.loader import Connector, validate_text
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue
from cdcflow.core.events import tso_from_ms
from cdcflow.core.model import ChangeFeedInfo
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["connector_for", "info_from_connector", "section_from_request", "validate_section"]


def section_from_request(body: dict[str, Any]) -> dict[str, Any]:
    """A connectors.yaml entry from a create/update request (TiCDC's field names accepted)."""
    section: dict[str, Any] = {"name": body.get("changefeed_id") or body.get("id") or body.get("name")}
    if section["name"] is None:
        raise ConfigInvalidError(
            "changefeed_id is required", [ConfigIssue("required field is missing", path="changefeed_id")]
        )
    for key in ("source", "sinks", "scheduler", "filter", "description"):
        if body.get(key) is not None:
            section[key] = body[key]
    if body.get("sink_uri") and "sinks" not in section:
        section["sinks"] = [{"uri": body["sink_uri"]}]
    if body.get("start_ts") not in (None, 0):
        section["start-ts"] = body["start_ts"]
    if body.get("target_ts"):
        section["target-ts"] = body["target_ts"]
    if body.get("error_stuck_duration") is not None:
        section["error-stuck-duration"] = body["error_stuck_duration"]
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
    sections are kept as the user wrote them (``section``), so they validate again."""
    now = time.time() if now is None else now
    s = connector.settings
    start_ts = tso_from_ms(int(now * 1000)) if s.start_ts == "now" else int(s.start_ts)
    return ChangeFeedInfo(
        id=s.name,
        source=dict(section["source"]),
        sinks=[dict(sink) for sink in section["sinks"]],
        scheduler=dict(section["scheduler"]) if section.get("scheduler") else None,
        filter_rules=list(s.filter.rules),
        start_ts=start_ts,
        target_ts=s.target_ts,
        created_at=now,
        state_changed_at=now,
        error_stuck_duration=float(s.error_stuck_duration),
        description=s.description,
        memory_quota=int(s.memory_quota),
        spill_disk_quota=int(s.spill_disk_quota),
    )


def connector_for(info: ChangeFeedInfo, plugins: PluginManager | None = None) -> Connector:
    """The validated plugins of a stored changefeed."""
    section: dict[str, Any] = {
        "name": info.id,
        "source": info.source,
        "sinks": info.sinks,
        "filter": {"rules": info.filter_rules},
        "start-ts": info.start_ts,
        "target-ts": info.target_ts,
        "memory-quota": info.memory_quota,
        "spill-disk-quota": info.spill_disk_quota,
    }
    if info.scheduler is not None:
        section["scheduler"] = info.scheduler
    return validate_section(section, plugins)
