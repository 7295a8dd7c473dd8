"""The pipeline's one retry policy for sink work: a batch's delivery, a checkpoint
write and the pipeline's start (opening the sinks) are retried while the error is
a retryable :class:`~cdcflow.core.errors.CdcflowError`, after pauses that double
from :data:`FIRST_RETRY_DELAY` up to :data:`MAX_RETRY_DELAY` seconds."""

from __future__ import annotations

from cdcflow.core.errors import CdcflowError, Retryable

__all__ = ["FIRST_RETRY_DELAY", "MAX_RETRY_DELAY", "is_retryable", "retry_delay"]

FIRST_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 30.0


def retry_delay(attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (counting from 0)."""
    return float(min(MAX_RETRY_DELAY, FIRST_RETRY_DELAY * 2**attempt))


def is_retryable(exc: BaseException) -> bool:
    """Whether ``exc`` is an error the pipeline retries (a CdcflowError that says so)."""
    return isinstance(exc, CdcflowError) and exc.retryable is not Retryable.NONE
