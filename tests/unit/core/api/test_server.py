"""The REST API server's own behaviour, apart from the capture behind it."""

from cdcflow.core.api.server import redact


def test_the_api_never_shows_secrets():
    shown = redact(
        [{"uri": "mysql://root:hunter2@db:3306/?x=1", "password": "hunter2", "sasl-password": "p", "user": "u"}]
    )
    assert shown == [
        {"uri": "mysql://root:******@db:3306/?x=1", "password": "******", "sasl-password": "******", "user": "u"}
    ]
