"""The CREATE CHANGEFEED statement and the mapping of CockroachDB errors onto coded errors."""

from __future__ import annotations

import pytest

from cdcflow.core.errors import CheckpointStaleError, ConfigInvalidError, ErrorCode
from cdcflow.plugins.sources.cockroachdb.errors import ErrorKind, classify, redact_dsn, to_cdcflow_error
from cdcflow.plugins.sources.cockroachdb.hlc import HLC
from cdcflow.plugins.sources.cockroachdb.options import changefeed_statement


def test_statement_has_every_option() -> None:
    sql = changefeed_statement("orders", HLC(1536242855577149065, 0), resolved_seconds=1.5)
    assert sql.startswith('CREATE CHANGEFEED FOR TABLE "public"."orders" WITH ')
    for option in (
        "updated",
        "mvcc_timestamp",
        "diff",
        "resolved = '1500ms'",
        "min_checkpoint_frequency = '1500ms'",
        "cursor = '1536242855577149065.0000000000'",
        "initial_scan = 'no'",
        "envelope = 'wrapped'",
        "format = 'json'",
        "schema_change_policy = 'stop'",
        "schema_change_events = 'column_changes'",
    ):
        assert option in sql
    assert " INTO " not in sql


class _PgError(Exception):
    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class OperationalError(Exception):
    """Stands for psycopg.OperationalError (a connection lost, no SQLSTATE)."""


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_PgError("40001", "restart transaction"), ErrorKind.RETRY),
        (_PgError("57P01", "server is draining"), ErrorKind.RETRY),
        (_PgError("XXUUU", "RangeFeedRetryError: REASON_SLOW_CONSUMER"), ErrorKind.RETRY),
        (OperationalError("consuming input failed: server closed the connection unexpectedly"), ErrorKind.RETRY),
        (ConnectionResetError("reset"), ErrorKind.RETRY),
        (_PgError("XXUUU", "schema change occurred at 1536242855.577149065,0"), ErrorKind.SCHEMA_CHANGE),
        (
            _PgError("XXUUU", "batch timestamp 1.000000000,0 must be after replica GC threshold 2.0,0"),
            ErrorKind.GC_STALE,
        ),
        (_PgError("28P01", "password authentication failed for user cdc"), ErrorKind.AUTH),
        (OperationalError("SSL error: certificate verify failed"), ErrorKind.AUTH),
        (_PgError("42P01", 'relation "nope" does not exist'), ErrorKind.FATAL),
    ],
)
def test_classify(exc: Exception, kind: ErrorKind) -> None:
    assert classify(exc) is kind


def test_gc_error_names_table_cursor_and_ttl() -> None:
    exc = _PgError("XXUUU", "batch timestamp 1.000000000,0 must be after replica GC threshold 2.000000000,0")
    err = to_cdcflow_error(exc, table="shop.orders", cursor="1000000000.0000000000", gc_ttl_seconds=14400)
    assert isinstance(err, CheckpointStaleError) and err.code is ErrorCode.ErrCheckpointStale
    assert "shop.orders" in err.message and "1000000000.0000000000" in err.message and "14400" in err.message


def test_auth_error_is_config_invalid_without_the_password() -> None:
    exc = OperationalError(
        "connection to postgresql://cdc:hunter2@db:26257/shop failed: password authentication failed"
    )
    err = to_cdcflow_error(exc, table="shop.orders")
    assert isinstance(err, ConfigInvalidError) and "hunter2" not in str(err)


def test_redact_dsn() -> None:
    assert redact_dsn("postgresql://u:pw@h:1/db") == "postgresql://u:******@h:1/db"
    assert redact_dsn("host=h password=pw user=u") == "host=h password=****** user=u"
    assert redact_dsn("postgresql://u:p@w@h:1/db?sslpassword=k") == "postgresql://u:******@h:1/db?sslpassword=******"
