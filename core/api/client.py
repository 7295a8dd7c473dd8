"""A small synchronous client of the REST API, for ``cdcflow cli``."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from cdcflow.core.errors import CdcflowError, ConfigInvalidError, NotAvailableError

__all__ = ["ApiClient", "ApiError"]


class ApiError(CdcflowError):
    """The server answered with an error (``error_code`` / ``error_msg``)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.error_code = str(body.get("error_code", "ErrInternal"))
        super().__init__(str(body.get("error_msg", "unknown error")), detail=body)

    @property
    def code_name(self) -> str:
        return self.error_code

    def __str__(self) -> str:
        return f"[{self.error_code}] {self.message}"


class ApiClient:
    """Calls one capture's API: over HTTPS with ``ca`` (and a client certificate with
    ``cert``/``key``) when the server URL is ``https://``, with ``token`` as a bearer token."""

    def __init__(
        self,
        server: str,
        timeout: float = 30.0,
        *,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        token: str | None = None,
    ) -> None:
        if (ca or cert or key) and "://" not in server:
            server = f"https://{server}"
        self.base = server if "://" in server else f"http://{server}"
        self.timeout = timeout
        self.token = token or None
        self._context: ssl.SSLContext | None = None
        if self.base.startswith("https://"):
            from cdcflow.core.api.security import client_ssl_context

            try:
                self._context = client_ssl_context(ca, cert, key)
            except (ssl.SSLError, OSError) as exc:
                raise ConfigInvalidError(f"cannot load --ca/--cert/--key ({ca}, {cert}, {key}): {exc}") from None
        elif ca or cert or key:
            raise ConfigInvalidError(f"--ca/--cert/--key need an https:// server, not {self.base}")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.base.rstrip("/") + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = None
            if not isinstance(doc, dict):
                doc = {"error_code": "ErrInternal", "error_msg": raw.decode(errors="replace") or str(exc)}
            raise ApiError(exc.code, doc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            hint = ""
            if isinstance(reason, ssl.SSLError):
                hint = " (TLS handshake failed: check --ca, and give --cert/--key if the server requires them)"
            raise NotAvailableError(f"cannot reach the cdcflow server at {self.base}: {reason}{hint}") from None
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise NotAvailableError(f"the server at {self.base} answered something that is not JSON") from None
