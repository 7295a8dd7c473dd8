import pytest

from cdcflow.core import errors
from cdcflow.core.errors import (
    CdcflowError,
    ConfigInvalidError,
    ConfigIssue,
    DownstreamUnavailableError,
    ErrorCode,
    Retryable,
    Severity,
    error_for_code,
)

SEED_CODES = {
    "ErrConfigInvalid": 1001,
    "ErrDuplicateChangefeedID": 1002,
    "ErrDownstreamUnavailable": 2001,
    "ErrBackPressure": 2002,
    "ErrDDLBlocked": 2003,
    "ErrPDUnavailable": 3001,
    "ErrMetaStoreIO": 3002,
    "ErrMaintainerCrash": 4001,
    "ErrHeartbeatTimeout": 4002,
    "ErrCheckpointStale": 5001,
    "ErrUnsupportedProtocol": 6001,
}


def test_codes_are_exactly_those_of_the_seed():
    assert {c.name: int(c) for c in ErrorCode} == SEED_CODES


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_code_has_one_error_class(code):
    cls = error_for_code(int(code))
    assert issubclass(cls, CdcflowError)
    assert cls.code is code
    err = cls("boom")
    assert err.to_dict()["code"] == int(code)
    assert str(err).startswith(f"[{code.name} {int(code)}]")


def test_error_carries_message_detail_severity_retryable():
    err = DownstreamUnavailableError("mysql down", detail={"host": "db"})
    assert err.message == "mysql down"
    assert err.detail == {"host": "db"}
    assert err.severity is Severity.WARN
    assert err.retryable is Retryable.RETRY
    override = DownstreamUnavailableError("auth", retryable=Retryable.NONE, severity=Severity.ERROR)
    assert override.retryable is Retryable.NONE
    assert override.severity is Severity.ERROR


def test_config_error_lists_issues_with_location():
    issue = ConfigIssue("bad", file="c.yaml", line=3, column=5, path="connectors[0].name")
    err = ConfigInvalidError("invalid", [issue])
    assert "c.yaml:3:5: connectors[0].name: bad" in str(err)
    assert err.to_dict()["detail"]["issues"][0]["line"] == 3


def test_all_public_errors_derive_from_root():
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, CdcflowError), name
