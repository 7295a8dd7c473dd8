"""Authentication of the REST API (bearer tokens, TLS client certificates with a CN
allow-list), the bind rule, and the sinks an API client may create."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest

from cdcflow.core.api.security import ApiSecurity
from cdcflow.core.cli import main as cli_main
from cdcflow.core.cli._common import EXIT_CONFIG
from cdcflow.core.config.settings import SecuritySettings, ServerSettings
from cdcflow.core.control.capture import CaptureOptions
from cdcflow.core.control.messaging.grpc import TLSConfig
from cdcflow.core.errors import ConfigInvalidError
from tests.fixtures.certs import make_certs
from tests.unit.core.api.live import LiveApi

TOKEN = "s3cret-token-0123456789"


def request(
    url: str, method: str = "GET", body: Any = None, *, token: str | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def client_context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def test_a_token_is_required_and_compared(tmp_path):
    security = SecuritySettings(token_env="CDCFLOW_API_TOKEN")
    with LiveApi(tmp_path, security, {"CDCFLOW_API_TOKEN": TOKEN}) as api:
        status, body = request(f"{api.url}/api/v2/changefeeds")
        assert status == 401 and body["error_code"] == "ErrUnauthenticated" and "bearer token" in body["error_msg"]
        status, body = request(f"{api.url}/api/v2/changefeeds", token="wrong")
        assert status == 401 and body["error_code"] == "ErrUnauthenticated"
        status, body = request(f"{api.url}/api/v2/changefeeds", token=TOKEN[:-1])
        assert status == 401
        # Not even a path that does not exist tells an unauthenticated client anything.
        assert request(f"{api.url}/api/v2/nothing-here")[0] == 401
        status, body = request(f"{api.url}/api/v2/changefeeds", token=TOKEN)
        assert status == 200 and body == {"total": 0, "items": []}


def test_a_token_env_that_is_not_set_stops_the_server():
    with pytest.raises(ConfigInvalidError, match="CDCFLOW_API_TOKEN, which is not set"):
        ApiSecurity.from_settings(SecuritySettings(token_env="CDCFLOW_API_TOKEN"), {})


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path)


def tls_settings(certs, **more: Any) -> SecuritySettings:
    return SecuritySettings(ca=certs.ca, cert=certs.server.cert, key=certs.server.key, **more)


def test_tls_client_certificates_and_the_cn_allow_list(tmp_path, certs):
    with LiveApi(tmp_path, tls_settings(certs, cert_allowed_cn=["ops"])) as api:
        assert api.url.startswith("https://")
        ops, intruder = certs.clients["ops"], certs.clients["intruder"]
        status, body = request(f"{api.url}/api/v2/changefeeds", context=client_context(certs.ca, ops.cert, ops.key))
        assert status == 200 and body["total"] == 0
        status, body = request(
            f"{api.url}/api/v2/changefeeds", context=client_context(certs.ca, intruder.cert, intruder.key)
        )
        assert status == 403 and body["error_code"] == "ErrForbidden" and "intruder" in body["error_msg"]
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            request(f"{api.url}/api/v2/changefeeds", context=client_context(certs.ca))  # no client certificate
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            request(f"http://127.0.0.1:{api.port}/api/v2/changefeeds")  # plain HTTP is not served


def test_the_cli_against_a_tls_and_token_server(tmp_path, certs, capsys, monkeypatch):
    security = tls_settings(certs, cert_allowed_cn=["ops"], token_env="CDCFLOW_API_TOKEN")
    ops = certs.clients["ops"]
    tls_args = ["--ca", certs.ca, "--cert", ops.cert, "--key", ops.key]
    with LiveApi(tmp_path, security, {"CDCFLOW_API_TOKEN": TOKEN}) as api:
        monkeypatch.delenv("CDCFLOW_API_TOKEN", raising=False)
        code = cli_main.main(["cli", "--server", api.url, *tls_args, "changefeed", "list", "--json"])
        out, err = capsys.readouterr()
        assert code == 1 and "[ErrUnauthenticated]" in err and "Traceback" not in err

        monkeypatch.setenv("CDCFLOW_API_TOKEN", TOKEN)
        # The connection options after the verb, where TiCDC's users type them.
        code = cli_main.main(["cli", "changefeed", "list", "--server", api.url, *tls_args, "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert json.loads(out) == {"total": 0, "items": []}

        code = cli_main.main(["cli", "capture", "list", "--server", api.url, "--ca", certs.ca])
        out, err = capsys.readouterr()
        assert code == 1 and "cannot reach the cdcflow server" in err and "Traceback" not in err


def test_a_non_loopback_bind_without_authentication_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "connectors.yaml"
    config.write_text(f"server:\n  api-addr: 0.0.0.0:0\n  metastore: sqlite:///{tmp_path}/meta.db\n")
    code = cli_main.main(["server", "--config", str(config), "--executor", "in-process"])
    _, err = capsys.readouterr()
    assert code == EXIT_CONFIG
    assert "[ErrConfigInvalid 1001]" in err and "0.0.0.0 without authentication" in err
    assert "allow-insecure-bind" in err and "Traceback" not in err
    assert not (tmp_path / "meta.db").exists()  # nothing started

    ApiSecurity.from_settings(SecuritySettings()).check_bind("127.0.0.1")
    ApiSecurity.from_settings(SecuritySettings()).check_bind("::1")
    ApiSecurity.from_settings(SecuritySettings(allow_insecure_bind=True)).check_bind("0.0.0.0")
    ApiSecurity.from_settings(SecuritySettings(token_env="T"), {"T": "x"}).check_bind("10.0.0.1")
    with pytest.raises(ConfigInvalidError):
        ApiSecurity.from_settings(SecuritySettings()).check_bind("cdc.example.com")


def _create(api: LiveApi, sinks: list[dict[str, Any]], cf: str = "cf-1") -> tuple[int, dict[str, Any]]:
    body = {"changefeed_id": cf, "source": {"type": "ticker"}, "sinks": sinks}
    return request(f"{api.url}/api/v2/changefeeds", "POST", body)


def test_sinks_outside_the_policy_are_refused_and_nothing_is_created(tmp_path):
    root = tmp_path / "exports"
    outside = tmp_path / "outside"
    security = SecuritySettings(allowed_sinks=["file", "blackhole"], file_roots=[str(root)])
    with LiveApi(tmp_path, security) as api:
        status, body = _create(api, [{"uri": "file:///root/anything?protocol=json"}])
        assert status == 403 and body["error_code"] == "ErrForbidden"
        assert "/root/anything" in body["error_msg"] and "file-roots" in body["error_msg"]
        status, body = _create(api, [{"type": "file", "path": str(root / ".." / "outside")}])
        assert status == 403 and str(outside) in body["error_msg"]  # resolved, not compared as text
        status, body = _create(api, [{"uri": "kafka://127.0.0.1:9092/t?protocol=open-protocol"}])
        assert status == 403 and "allowed-sinks allows: file, blackhole" in body["error_msg"]
        assert request(f"{api.url}/api/v2/changefeeds")[1]["total"] == 0
        assert not outside.exists()

        status, body = _create(api, [{"type": "file", "path": str(root / "orders"), "protocol": "json"}])
        assert status == 201, body
        # An update cannot move the sink outside either.
        assert request(f"{api.url}/api/v2/changefeeds/cf-1/pause", "POST")[0] == 200
        status, body = request(f"{api.url}/api/v2/changefeeds/cf-1", "PUT", {"sinks": [{"uri": "file:///etc/cdcflow"}]})
        assert status == 403 and body["error_code"] == "ErrForbidden"
        status, body = request(f"{api.url}/api/v2/changefeeds/cf-1")
        assert body["sinks"] == [{"type": "file", "path": str(root / "orders"), "protocol": "json"}]


def test_the_inter_capture_grpc_uses_the_api_tls_material(certs):
    settings = ServerSettings(security=tls_settings(certs))
    assert CaptureOptions.from_server(settings).tls == TLSConfig(certs.ca, certs.server.cert, certs.server.key)
    assert CaptureOptions.from_server(ServerSettings()).tls is None
    flags = TLSConfig("a", "b", "c")
    assert CaptureOptions.from_server(settings, tls=flags).tls == flags


def test_tls_settings_go_together(tmp_path):
    with pytest.raises(ValueError, match="ca, cert and key go together"):
        SecuritySettings(ca=str(tmp_path / "ca.pem"))
    with pytest.raises(ValueError, match="not an environment variable name"):
        SecuritySettings(token_env="NOT A NAME")
    with pytest.raises(ConfigInvalidError, match="not a readable file"):
        ApiSecurity.from_settings(SecuritySettings(ca="/nonexistent/ca", cert="/x", key="/y"))
