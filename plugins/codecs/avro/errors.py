"""Errors of the avro codec and its schema registry client."""

from __future__ import annotations

from cdcflow.core.errors import (
    DownstreamUnavailableError,
    Retryable,
    Severity,
    UnsupportedProtocolError,
)

__all__ = [
    "AvroEncodeError",
    "AvroFormatError",
    "SchemaIncompatibleError",
    "SchemaNotFoundError",
    "SchemaRegistryError",
]


class SchemaRegistryError(DownstreamUnavailableError):
    """The schema registry cannot be reached, refused the credentials, or answered an error (2001)."""


class SchemaIncompatibleError(SchemaRegistryError):
    """The registry refused a new schema version (HTTP 409): it breaks the subject's compatibility rule.

    Retrying cannot help until an operator changes the subject's compatibility
    level or the table's schema; the changefeed stops with this error, as
    TiCDC's does.
    """

    default_severity = Severity.ERROR
    default_retryable = Retryable.LATER


class SchemaNotFoundError(SchemaRegistryError):
    """The registry has no schema with the id a message names (HTTP 404, error code 40403)."""

    default_severity = Severity.ERROR
    default_retryable = Retryable.NONE


class AvroEncodeError(UnsupportedProtocolError):
    """A value that the column's Avro type cannot hold (names table, column and value)."""


class AvroFormatError(UnsupportedProtocolError):
    """Bytes that are not a message of the avro protocol (wrong magic byte, truncated body)."""
