"""The control plane's records: changefeeds, their progress, and captures.

``ChangeFeedInfo`` is what a user declared plus its lifecycle state;
``ChangeFeedStatus`` is its progress. Both are stored in the metastore as
JSON. The state machine is exactly seed 000's ("状态迁移约束"):

* Normal ↔ Paused (pause / resume);
* any state but Failed, Finished and Removed → Warning on a recoverable
  error, Warning → Normal when it clears;
* Normal / Warning → Failed on a fatal error (Warning → Failed also when the
  retries have not succeeded within the error-stuck duration);
* Normal / Warning → Finished when the target ts is reached;
* every state → Removed (remove); Failed only to Removed.

A forbidden transition raises :class:`InvalidTransitionError`; nothing is
ever applied silently.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cdcflow.core.config.settings import CONNECTOR_OPTIONS, ConnectorSettings
from cdcflow.core.data.filter import DEFAULT_FILTER_RULES
from cdcflow.core.errors import CdcflowError

__all__ = [
    "ALLOWED_TRANSITIONS",
    "CaptureInfo",
    "ChangeFeedInfo",
    "ChangeFeedStatus",
    "ChangefeedNotFoundError",
    "ChangefeedState",
    "InvalidTransitionError",
    "check_transition",
]


class ChangefeedState(enum.Enum):
    """A changefeed's lifecycle state (seed 000 "状态枚举")."""

    NORMAL = "normal"
    PAUSED = "paused"
    WARNING = "warning"
    FAILED = "failed"
    FINISHED = "finished"
    REMOVED = "removed"

    @property
    def runs(self) -> bool:
        """Whether a maintainer should be running for it."""
        return self in (ChangefeedState.NORMAL, ChangefeedState.WARNING)


_S = ChangefeedState

#: Every allowed transition ``old → new``. Staying in the same state is not a
#: transition (callers treat it as a no-op before asking).
ALLOWED_TRANSITIONS: frozenset[tuple[ChangefeedState, ChangefeedState]] = frozenset(
    {
        (_S.NORMAL, _S.PAUSED),
        (_S.WARNING, _S.PAUSED),
        (_S.PAUSED, _S.NORMAL),
        (_S.NORMAL, _S.WARNING),
        (_S.PAUSED, _S.WARNING),
        (_S.WARNING, _S.NORMAL),
        (_S.WARNING, _S.FAILED),
        (_S.NORMAL, _S.FAILED),
        (_S.NORMAL, _S.FINISHED),
        (_S.WARNING, _S.FINISHED),
        *((s, _S.REMOVED) for s in _S if s is not _S.REMOVED),
    }
)


class InvalidTransitionError(CdcflowError):
    """A lifecycle request that the changefeed's current state does not allow."""

    @property
    def code_name(self) -> str:
        return "ErrChangefeedStateTransition"


class ChangefeedNotFoundError(CdcflowError):
    """No changefeed has this id."""

    @property
    def code_name(self) -> str:
        return "ErrChangefeedNotExists"


def check_transition(changefeed_id: str, old: ChangefeedState, new: ChangefeedState, reason: str = "") -> None:
    """Raise :class:`InvalidTransitionError` unless ``old → new`` is allowed."""
    if (old, new) in ALLOWED_TRANSITIONS:
        return
    why = f" ({reason})" if reason else ""
    hint = ""
    if old is _S.FAILED:
        hint = "; a failed changefeed can only be removed and created again"
    elif old is _S.REMOVED:
        hint = "; the changefeed has been removed"
    raise InvalidTransitionError(
        f"changefeed {changefeed_id}: cannot go from {old.value} to {new.value}{why}{hint}",
        detail={"changefeed_id": changefeed_id, "from": old.value, "to": new.value},
    )


def _option_default(name: str) -> Any:
    """The default of the connector option ``name``, as its pydantic field declares it."""
    return ConnectorSettings.model_fields[name].get_default(call_default_factory=True)


@dataclass(frozen=True, slots=True)
class ChangeFeedInfo:
    """A changefeed as declared, with its lifecycle state.

    ``source`` and ``sinks`` are the plugin sections as in connectors.yaml
    (``type`` plus options). ``epoch`` changes each time the changefeed's
    maintainer is (re)started, so messages of an older incarnation can be
    told apart; ``version`` is bumped by every persisted change of this
    record and is what optimistic concurrency checks.

    Each of the connector's own options (:data:`~cdcflow.core.config.settings.CONNECTOR_OPTIONS`)
    is a field of the same name whose default is the connector's (records
    written before the option was kept get it); importing this module fails if
    one is missing. The stored JSON has one key per field; :meth:`options`
    gives the options back as declared.
    """

    id: str
    source: dict[str, Any]
    sinks: list[dict[str, Any]]
    scheduler: dict[str, Any] | None = None
    filter_rules: list[str] = field(default_factory=lambda: list(DEFAULT_FILTER_RULES))
    start_ts: int = 0
    target_ts: int = _option_default("target_ts")
    #: The connector's ``initial-snapshot``: copy the tables as of ``start_ts`` first.
    initial_snapshot: bool = _option_default("initial_snapshot")
    state: ChangefeedState = ChangefeedState.NORMAL
    error: dict[str, Any] | None = None
    epoch: int = 1
    version: int = 1
    created_at: float = 0.0
    warning_since: float | None = None
    state_changed_at: float = 0.0
    error_stuck_duration: float = _option_default("error_stuck_duration")
    description: str = _option_default("description")
    #: The connector's ``memory-quota`` and ``spill-disk-quota`` (bytes), which each
    #: capture's executor applies.
    memory_quota: int = _option_default("memory_quota")
    spill_disk_quota: int = _option_default("spill_disk_quota")
    #: The connector's ``filter`` section as written (rules, case-sensitive,
    #: ignore-txn-start-ts, column-selectors); None in records written before it
    #: was kept, which had ``filter_rules`` alone.
    filter: dict[str, Any] | None = None
    #: The connector's ``transforms`` list as written (each a plugin section).
    transforms: list[dict[str, Any]] = field(default_factory=list)

    def with_changes(self, **changes: Any) -> ChangeFeedInfo:
        return replace(self, **changes)

    def filter_section(self) -> dict[str, Any]:
        """The ``filter`` section that validates into this changefeed's filter."""
        return dict(self.filter) if self.filter is not None else {"rules": list(self.filter_rules)}

    def options(self) -> dict[str, Any]:
        """The connector's own options by field name, in declaration order: the kept
        values (bytes, seconds, ...), the filter as its section."""
        return {name: self.filter_section() if name == "filter" else getattr(self, name) for name in CONNECTOR_OPTIONS}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChangeFeedInfo:
        values = dict(data)
        values["state"] = ChangefeedState(values["state"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in values.items() if k in known})


def _check_options_kept() -> None:
    missing = [name for name in CONNECTOR_OPTIONS if name not in ChangeFeedInfo.__dataclass_fields__]
    if missing:
        raise TypeError(f"ChangeFeedInfo has no field for the connector option(s) {', '.join(missing)}")


_check_options_kept()


@dataclass(frozen=True, slots=True)
class ChangeFeedStatus:
    """A changefeed's persisted progress. Neither ts ever goes backwards."""

    checkpoint_ts: int
    resolved_ts: int
    version: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChangeFeedStatus:
        return cls(int(data["checkpoint_ts"]), int(data["resolved_ts"]), int(data.get("version", 0)))


@dataclass(frozen=True, slots=True)
class CaptureInfo:
    """A live capture, registered under its session."""

    id: str
    advertise_addr: str
    api_addr: str
    version: str
    pid: int
    started_at: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaptureInfo:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})
