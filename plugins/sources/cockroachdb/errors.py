"""CockroachDB errors as cdcflow's coded errors (issue 14, "Errors").

* retryable — connection lost, ``40001`` (serialization), ``57P01``/draining,
  ``08*`` connection exceptions, ``RangeFeedRetryError`` / slow consumer text,
  "schema change occurred" handled by the feed: the feed reconnects from the
  span's resolved ts with backoff;
* the cursor below the GC threshold → :class:`CheckpointStaleError` (5001);
* authentication and TLS failures → :class:`ConfigInvalidError` (1001), never
  retried (no retry storm against a cluster that refuses the credentials);
* anything else a changefeed reports as terminal (unknown table, privileges,
  rangefeeds disabled) → :class:`ConfigInvalidError` with CockroachDB's message.

Messages never carry the DSN's password (:func:`redact_dsn`).
"""

from __future__ import annotations

import enum
import re
from typing import Any

from cdcflow.core.errors import CdcflowError, CheckpointStaleError, ConfigInvalidError
from cdcflow.core.secrets import mask_text

__all__ = ["ErrorKind", "classify", "redact_dsn", "schema_change_ts", "to_cdcflow_error"]

_RETRY_SQLSTATES = {"40001", "40003", "57P01", "57P02", "57P03", "53200", "58C01", "XXC03"}
_RETRY_TEXT = re.compile(
    r"RangeFeedRetryError|REASON_|slow consumer|draining|connection (?:reset|refused|closed|lost)|"
    r"server closed the connection|consuming input failed|terminating connection|broken pipe|"
    r"EOF|restart transaction|result is ambiguous|node unavailable|rpc error",
    re.IGNORECASE,
)
_AUTH_SQLSTATES = {"28000", "28P01"}
_AUTH_TEXT = re.compile(r"password authentication failed|SSL|TLS|certificate|authentication", re.IGNORECASE)
_GC_TEXT = re.compile(r"GC threshold|must be after replica GC|before the GC|garbage collect", re.IGNORECASE)
_SCHEMA_CHANGE = re.compile(r"schema change occurred at", re.IGNORECASE)


class ErrorKind(enum.Enum):
    """What the feed does about an error."""

    RETRY = "retry"
    SCHEMA_CHANGE = "schema_change"
    GC_STALE = "gc_stale"
    AUTH = "auth"
    FATAL = "fatal"


def redact_dsn(text: str) -> str:
    """``text`` with every DSN password masked (:func:`cdcflow.core.secrets.mask_text`)."""
    return mask_text(text)


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(exc, "sqlstate", None) or getattr(getattr(exc, "diag", None), "sqlstate", None) or "")


def classify(exc: BaseException) -> ErrorKind:
    """How the feed treats ``exc`` (a psycopg error, an OSError, or anything else)."""
    code, text = _sqlstate(exc), str(exc)
    if _SCHEMA_CHANGE.search(text):
        return ErrorKind.SCHEMA_CHANGE
    if _GC_TEXT.search(text):
        return ErrorKind.GC_STALE
    if code in _AUTH_SQLSTATES or (not code and _AUTH_TEXT.search(text) and "closed" not in text):
        return ErrorKind.AUTH
    if code in _RETRY_SQLSTATES or code.startswith("08") or _RETRY_TEXT.search(text):
        return ErrorKind.RETRY
    if isinstance(exc, (OSError, TimeoutError)) or type(exc).__name__ in ("OperationalError", "InterfaceError"):
        return ErrorKind.RETRY if not code else ErrorKind.FATAL
    return ErrorKind.FATAL


def schema_change_ts(exc: BaseException) -> str | None:
    """The timestamp text of a ``schema change occurred at <ts>`` error, else None."""
    text = str(exc)
    return text if _SCHEMA_CHANGE.search(text) else None


def to_cdcflow_error(
    exc: BaseException, *, table: str, cursor: str = "", gc_ttl_seconds: int | None = None
) -> CdcflowError:
    """The coded error for a non-retryable ``exc`` of the feed of ``table``."""
    kind = classify(exc)
    text = redact_dsn(str(exc).strip())
    detail: dict[str, Any] = {"table": table, "sqlstate": _sqlstate(exc), "upstream_error": text}
    if kind is ErrorKind.GC_STALE:
        ttl = f"{gc_ttl_seconds} s" if gc_ttl_seconds is not None else "unknown"
        return CheckpointStaleError(
            f"cockroachdb source: the cursor {cursor} of table {table} is below CockroachDB's GC threshold "
            f"(gc.ttlseconds {ttl}); the changes since are gone. Recreate the changefeed with a later start-ts, "
            "and raise the table's gc.ttlseconds above the longest outage to tolerate. CockroachDB said: " + text,
            detail={**detail, "cursor": cursor, "gc_ttl_seconds": gc_ttl_seconds},
        )
    if kind is ErrorKind.AUTH:
        return ConfigInvalidError(
            f"cockroachdb source: CockroachDB refused the connection's credentials or TLS set-up for table "
            f"{table}: {text}. Check the user, password (never logged) and sslmode/sslrootcert of `dsn`.",
            detail=detail,
        )
    return ConfigInvalidError(
        f"cockroachdb source: the changefeed of table {table} failed: {text}",
        detail=detail,
    )
