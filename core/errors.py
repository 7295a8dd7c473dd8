"""The cdcflow error hierarchy.

Every error cdcflow raises on purpose derives from :class:`CdcflowError` and
carries the fields of seed 000's error model, so that the coordinator can turn
any failure into a changefeed state transition without guessing:

``code``
    The numeric error code (1001 ErrConfigInvalid … 6001 ErrUnsupportedProtocol).
``message``
    A human-readable summary with the key context (changefeed id, parameter).
``detail``
    Structured detail: sub-module, retry count, last TSO, file and line …
``severity``
    INFO / WARN / ERROR / FATAL, for alerting and handling.
``retryable``
    NONE / RETRY / LATER: whether the coordinator retries automatically.

Subclasses fix ``code``, the default ``severity`` and the default
``retryable``; callers may override the latter two per instance.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, ClassVar

from cdcflow.core.secrets import mask_text

__all__ = [
    "BackPressureError",
    "CdcflowError",
    "CheckpointStaleError",
    "ConfigInvalidError",
    "ConfigIssue",
    "DDLBlockedError",
    "DownstreamUnavailableError",
    "DuplicateChangefeedIDError",
    "ErrorCode",
    "HeartbeatTimeoutError",
    "MaintainerCrashError",
    "MetaStoreIOError",
    "NotAvailableError",
    "PDUnavailableError",
    "PluginConflictError",
    "PluginValidationError",
    "Retryable",
    "Severity",
    "UnsupportedProtocolError",
    "error_for_code",
]


class ErrorCode(enum.IntEnum):
    """Error codes of seed 000 ("状态枚举与错误码")."""

    ErrConfigInvalid = 1001
    ErrDuplicateChangefeedID = 1002
    ErrDownstreamUnavailable = 2001
    ErrBackPressure = 2002
    ErrDDLBlocked = 2003
    ErrPDUnavailable = 3001
    ErrMetaStoreIO = 3002
    ErrMaintainerCrash = 4001
    ErrHeartbeatTimeout = 4002
    ErrCheckpointStale = 5001
    ErrUnsupportedProtocol = 6001


class Severity(enum.Enum):
    """How bad an error is, for alerting and handling."""

    INFO = "INFO"
    WARN = "WARN"
    ERROR = "ERROR"
    FATAL = "FATAL"


class Retryable(enum.Enum):
    """Whether the coordinator should retry automatically.

    ``RETRY`` means back off and retry now; ``LATER`` means the condition may
    clear by itself (or by an operator) and a later attempt may succeed;
    ``NONE`` means retrying cannot help.
    """

    NONE = "NONE"
    RETRY = "RETRY"
    LATER = "LATER"


class CdcflowError(Exception):
    """Root of every error cdcflow raises on purpose."""

    code: ClassVar[ErrorCode | None] = None
    default_severity: ClassVar[Severity] = Severity.ERROR
    default_retryable: ClassVar[Retryable] = Retryable.NONE

    def __init__(
        self,
        message: str,
        *,
        detail: Mapping[str, Any] | None = None,
        severity: Severity | None = None,
        retryable: Retryable | None = None,
    ) -> None:
        message = mask_text(message)  # a URI's password or a secret option never reaches a log or an API answer
        super().__init__(message)
        self.message = message
        self.detail: dict[str, Any] = dict(detail or {})
        self.severity = severity if severity is not None else self.default_severity
        self.retryable = retryable if retryable is not None else self.default_retryable

    @property
    def code_name(self) -> str:
        """The symbolic code, e.g. ``ErrConfigInvalid`` (``ErrInternal`` if none)."""
        return self.code.name if self.code is not None else "ErrInternal"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form, as stored in ChangeFeedInfo.error and sent by the API."""
        return {
            "code": int(self.code) if self.code is not None else 0,
            "code_name": self.code_name,
            "message": self.message,
            "detail": self.detail,
            "severity": self.severity.value,
            "retryable": self.retryable.value,
        }

    def __str__(self) -> str:
        if self.code is None:
            return self.message
        return f"[{self.code_name} {int(self.code)}] {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (raised in a Spark task, handled by the
        # capture): keep every field, whatever the subclass's constructor takes.
        return (_rebuild_error, (type(self), self.args), self.__dict__)


def _rebuild_error(cls: type[CdcflowError], args: tuple[Any, ...]) -> CdcflowError:
    error = cls.__new__(cls)
    error.args = args
    return error


class ConfigIssue:
    """One problem found in a configuration: where it is and what is wrong."""

    __slots__ = ("column", "file", "line", "message", "path")

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
        path: str = "",
    ) -> None:
        self.message = mask_text(message)
        self.file = file
        self.line = line
        self.column = column
        self.path = path

    def location(self) -> str:
        """``file:line:column`` as far as it is known."""
        parts = [self.file or "<config>"]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)

    def __str__(self) -> str:
        where = self.location()
        field = f" {self.path}:" if self.path else ""
        return f"{where}:{field} {self.message}"

    def __repr__(self) -> str:
        return f"ConfigIssue({str(self)!r})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": self.path,
            "message": self.message,
        }


class ConfigInvalidError(CdcflowError):
    """A configuration is invalid (target endpoint, filter rule, protocol …).

    ``issues`` lists every problem found, each with file, line and field path,
    so that one run of ``cdcflow validate`` reports them all.
    """

    code = ErrorCode.ErrConfigInvalid

    def __init__(self, message: str, issues: list[ConfigIssue] | None = None, **kw: Any) -> None:
        self.issues = list(issues or [])
        detail = dict(kw.pop("detail", None) or {})
        if self.issues:
            detail.setdefault("issues", [i.to_dict() for i in self.issues])
        super().__init__(message, detail=detail, **kw)

    def __str__(self) -> str:
        head = super().__str__()
        if not self.issues:
            return head
        return head + "\n" + "\n".join(f"  {issue}" for issue in self.issues)


class PluginConflictError(ConfigInvalidError):
    """Two plugins claim the same ``type_name`` for the same kind."""


class PluginValidationError(ConfigInvalidError):
    """A plugin's hook implementation matches no hook specification: a misspelled
    hook name, or an argument the hook does not provide. The message names the
    plugin (module, entry point and distribution) and the hook."""


class DuplicateChangefeedIDError(CdcflowError):
    """A changefeed with this id already exists."""

    code = ErrorCode.ErrDuplicateChangefeedID


class DownstreamUnavailableError(CdcflowError):
    """The downstream cannot be reached (network, authentication, permission)."""

    code = ErrorCode.ErrDownstreamUnavailable
    default_severity = Severity.WARN
    default_retryable = Retryable.RETRY


class BackPressureError(CdcflowError):
    """The downstream pushes back; progress is stalled."""

    code = ErrorCode.ErrBackPressure
    default_severity = Severity.WARN
    default_retryable = Retryable.LATER


class DDLBlockedError(CdcflowError):
    """A DDL event blocks progress (waiting for schema consistency)."""

    code = ErrorCode.ErrDDLBlocked
    default_severity = Severity.WARN
    default_retryable = Retryable.LATER


class PDUnavailableError(CdcflowError):
    """PD (or the upstream metadata service) is unavailable: no TSO, no safepoint."""

    code = ErrorCode.ErrPDUnavailable
    default_severity = Severity.WARN
    default_retryable = Retryable.RETRY


class MetaStoreIOError(CdcflowError):
    """The metastore failed a read, a write or a transaction."""

    code = ErrorCode.ErrMetaStoreIO
    default_retryable = Retryable.RETRY


class MaintainerCrashError(CdcflowError):
    """A maintainer crashed or exited abnormally."""

    code = ErrorCode.ErrMaintainerCrash
    default_retryable = Retryable.RETRY


class HeartbeatTimeoutError(CdcflowError):
    """A maintainer's heartbeat did not arrive in time; it is considered lost."""

    code = ErrorCode.ErrHeartbeatTimeout
    default_severity = Severity.WARN
    default_retryable = Retryable.RETRY


class CheckpointStaleError(CdcflowError):
    """A checkpoint fell behind the upstream GC safepoint; data may be lost."""

    code = ErrorCode.ErrCheckpointStale
    default_severity = Severity.FATAL


class UnsupportedProtocolError(CdcflowError):
    """A protocol or version is not supported."""

    code = ErrorCode.ErrUnsupportedProtocol


class NotAvailableError(CdcflowError):
    """A command or feature exists but is not available in this build."""


_BY_CODE: dict[ErrorCode, type[CdcflowError]] = {
    cls.code: cls
    for cls in (
        ConfigInvalidError,
        DuplicateChangefeedIDError,
        DownstreamUnavailableError,
        BackPressureError,
        DDLBlockedError,
        PDUnavailableError,
        MetaStoreIOError,
        MaintainerCrashError,
        HeartbeatTimeoutError,
        CheckpointStaleError,
        UnsupportedProtocolError,
    )
    if cls.code is not None
}


def error_for_code(code: int | ErrorCode) -> type[CdcflowError]:
    """The error class that carries ``code`` (for rebuilding errors from JSON)."""
    return _BY_CODE[ErrorCode(code)]
