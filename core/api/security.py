"""Who may use the REST API, and what an API client may create (``server.security``).

* **TLS with client certificates**, as TiCDC does: with ``ca``, ``cert`` and
  ``key`` the API serves HTTPS and requires a client certificate signed by the
  CA; ``cert-allowed-cn`` lists the common names it accepts (403 for others).
* **Bearer tokens**: with ``token-env``, every request carries
  ``Authorization: Bearer <token>``, the token read from that environment
  variable when the capture starts, compared in constant time (401 otherwise).
* **Bind rule**: an API on a non-loopback address without either is refused at
  start unless ``allow-insecure-bind`` says so.
* **Sink policy**: ``allowed-sinks`` (URI schemes or sink types) and
  ``file-roots`` (directories file sinks must write under) bound what a create
  or update through the API may name; anything else is refused with 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from cdcflow.core.config.settings import SecuritySettings
from cdcflow.core.errors import CdcflowError, ConfigInvalidError, ConfigIssue

__all__ = [
    "ApiSecurity",
    "ForbiddenError",
    "SecurityConfigError",
    "UnauthenticatedError",
    "client_ssl_context",
    "is_loopback",
]


class UnauthenticatedError(CdcflowError):
    """The request carries no valid credentials (no token, a wrong token, no client certificate): HTTP 401."""

    @property
    def code_name(self) -> str:
        return "ErrUnauthenticated"


class ForbiddenError(CdcflowError):
    """The client is known but not allowed this (a certificate common name not in the
    allow-list, a sink the policy does not allow): HTTP 403."""

    @property
    def code_name(self) -> str:
        return "ErrForbidden"


class SecurityConfigError(ConfigInvalidError):
    """``server.security`` (or the API address) cannot be served as configured; the
    server does not start (exit status 3, like any invalid configuration)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is only reachable from this machine."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (or "", every interface): it may resolve to anything


def _read(path: str, field: str) -> None:
    if not Path(path).is_file():
        raise SecurityConfigError(
            f"server.security.{field}: {path!r} is not a readable file",
            [ConfigIssue(f"{path!r} is not a readable file", path=f"server.security.{field}")],
        )


def client_ssl_context(ca: str | None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client context that trusts ``ca`` (the system's CAs when None) and presents ``cert``/``key`` when given."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert:
        context.load_cert_chain(cert, key or None)
    return context


@dataclass(frozen=True)
class ApiSecurity:
    """``server.security`` as the API applies it; the token is read from the environment once."""

    settings: SecuritySettings
    token: str = ""

    @classmethod
    def from_settings(
        cls, settings: SecuritySettings | None = None, env: Mapping[str, str] | None = None
    ) -> ApiSecurity:
        settings = settings or SecuritySettings()
        env = os.environ if env is None else env
        token = ""
        if settings.token_env:
            token = env.get(settings.token_env, "")
            if not token:
                raise SecurityConfigError(
                    f"server.security.token-env names {settings.token_env}, which is not set or empty: "
                    f"export {settings.token_env}=<a long random token> before starting the server",
                    [ConfigIssue(f"{settings.token_env} is not set", path="server.security.token-env")],
                )
        if settings.tls:
            for field in ("ca", "cert", "key"):
                _read(getattr(settings, field), field)
        return cls(settings, token)

    @classmethod
    def for_api(cls, settings: SecuritySettings, api_addr: str) -> ApiSecurity:
        """:meth:`from_settings`, with the API address checked against the bind rule."""
        security = cls.from_settings(settings)
        security.check_bind(api_addr.rpartition(":")[0])
        return security

    @property
    def authenticates(self) -> bool:
        return bool(self.token) or self.settings.tls

    @property
    def scheme(self) -> str:
        return "https" if self.settings.tls else "http"

    def check_bind(self, host: str) -> None:
        """Refuse a non-loopback API without authentication (unless allowed explicitly)."""
        if is_loopback(host) or self.authenticates or self.settings.allow_insecure_bind:
            return
        raise SecurityConfigError(
            f"the REST API would listen on {host or 'every interface'} without authentication: set "
            "server.security ca/cert/key (client certificates) or token-env, bind to 127.0.0.1, or set "
            "server.security.allow-insecure-bind: true to accept that anyone who reaches the port controls cdcflow",
            [ConfigIssue("a non-loopback API needs authentication", path="server.api-addr")],
        )

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """HTTPS with required, CA-verified client certificates; None without TLS."""
        if not self.settings.tls:
            return None
        s = self.settings
        try:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=s.ca)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(s.cert, s.key)
        except (ssl.SSLError, OSError) as exc:
            raise SecurityConfigError(
                f"server.security: cannot load the TLS files (ca {s.ca}, cert {s.cert}, key {s.key}): {exc}",
                [ConfigIssue(str(exc), path="server.security")],
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def forward_ssl_context(self) -> ssl.SSLContext | None:
        """The context a capture forwards requests to the owner with: its own certificate as the client's."""
        if not self.settings.tls:
            return None
        s = self.settings
        return client_ssl_context(s.ca, s.cert, s.key)

    def authenticate(self, headers: Mapping[str, str], peercert: Any) -> None:
        """Raise 401/403 unless the request's credentials satisfy every configured mechanism."""
        if self.settings.tls:
            if not peercert:
                raise UnauthenticatedError("a client certificate signed by the server's CA is required")
            allowed = self.settings.cert_allowed_cn
            if allowed:
                names = _common_names(peercert)
                if not any(n in allowed for n in names):
                    shown = ", ".join(names) or "none"
                    raise ForbiddenError(
                        f"client certificate common name {shown} is not in server.security.cert-allowed-cn",
                        detail={"common_names": names},
                    )
        if self.token:
            scheme, _, given = headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not given:
                raise UnauthenticatedError("this API needs a bearer token: send 'Authorization: Bearer <token>'")
            if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
                raise UnauthenticatedError("the bearer token is not valid")

    def check_sinks(self, sinks: list[Any], section_sinks: list[Any]) -> None:
        """Refuse (403) a sink the policy does not allow: a type or scheme not in
        ``allowed-sinks``, a file sink outside every ``file-roots`` directory."""
        allowed = self.settings.allowed_sinks
        for i, choice in enumerate(sinks):
            raw = section_sinks[i] if i < len(section_sinks) and isinstance(section_sinks[i], dict) else {}
            uri = str(getattr(choice.config, "uri", "") or raw.get("uri") or "")
            scheme = urlsplit(uri).scheme.lower() if "://" in uri else ""
            if allowed is not None and choice.type_name not in allowed and (not scheme or scheme not in allowed):
                raise ForbiddenError(
                    f"sinks[{i}]: sink {scheme + '://' if scheme else choice.type_name!r} is not allowed here; "
                    f"server.security.allowed-sinks allows: {', '.join(allowed) or 'none'}",
                    detail={"field": f"sinks[{i}]", "allowed_sinks": list(allowed)},
                )
            directory = _file_directory(choice.type_name, choice.config, scheme, uri)
            if directory is not None and self.settings.file_roots:
                resolved = Path(os.path.realpath(directory))
                roots = [Path(os.path.realpath(r)) for r in self.settings.file_roots]
                if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
                    raise ForbiddenError(
                        f"sinks[{i}]: file sink directory {directory} resolves to {resolved}, outside "
                        f"server.security.file-roots ({', '.join(self.settings.file_roots)})",
                        detail={"field": f"sinks[{i}]", "file_roots": list(self.settings.file_roots)},
                    )


def _file_directory(type_name: str, config: Any, scheme: str, uri: str) -> str | None:
    """The local directory a sink writes to: a ``file://`` URI's path, or a file sink's ``path``."""
    if scheme == "file":
        parts = urlsplit(uri)
        raw = unquote(parts.path)
        return "." + raw if parts.netloc == "." else raw
    if type_name == "file":
        return str(getattr(config, "path", "") or ".")
    return None


def _common_names(peercert: Any) -> list[str]:
    names: list[str] = []
    for rdn in peercert.get("subject", ()) if isinstance(peercert, dict) else ():
        for key, value in rdn:
            if key == "commonName":
                names.append(str(value))
    return names
