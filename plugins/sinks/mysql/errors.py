"""Errors of the MySQL sink.

Both are ``ErrDownstreamUnavailable`` (2001) so that the changefeed goes
Warning and the runtime restarts it from its checkpoint; the restart replays
the unfinished batch in safe mode (REPLACE), which is how a duplicate key
left by a crash clears by itself.
"""

from __future__ import annotations

from cdcflow.core.errors import DownstreamUnavailableError, Retryable

__all__ = ["ConstraintViolationError", "DownstreamRejectedError"]


class DownstreamRejectedError(DownstreamUnavailableError):
    """The downstream refused a statement or DDL (missing table, bad type …).

    Retrying the same statement cannot help; an operator (or a later DDL)
    must fix the downstream first.
    """

    default_retryable = Retryable.LATER


class ConstraintViolationError(DownstreamRejectedError):
    """A duplicate key or another constraint failed outside safe mode.

    ``detail`` names the table, the key values and the row's commit ts. The
    downstream transaction that failed was rolled back whole.
    """

    default_retryable = Retryable.RETRY
