"""Options of the MySQL sink and how a sink URI maps onto them.

``mysql://user:pass@host:port/?worker-count=4&safe-mode=true`` — the URI
carries the address and credentials, its query any option below. ``tidb://``
is the same sink (TiDB speaks the MySQL protocol); ``mysql+ssl://`` and
``tidb+ssl://`` require TLS.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr

from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin import PluginConfig

__all__ = [
    "SCHEMES",
    "ConnectionTarget",
    "MySQLSinkConfig",
    "describe_issues",
    "session_zone",
    "session_zone_sql",
    "target_of",
]

SCHEMES = ("mysql", "mysql+ssl", "tidb", "tidb+ssl")
_OFFSET = re.compile(r"^([+-])(\d{1,2}):(\d{2})$")


class MySQLSinkConfig(PluginConfig):
    """Options of the MySQL / TiDB sink (names as in TiCDC's sink URI)."""

    uri: str = Field("", description="Sink URI: mysql://user:pass@host:port/?option=value (also mysql+ssl, tidb).")
    host: str = Field("127.0.0.1", description="Server host (used when 'uri' is empty).")
    port: int = Field(3306, ge=1, le=65535, description="Server port (used when 'uri' is empty).")
    user: str = Field("root", description="User name (used when 'uri' is empty).")
    password: SecretStr = Field(
        SecretStr(""),
        description="Password (used when 'uri' is empty); prefer ${VAR} in connectors.yaml; masked wherever shown.",
    )
    worker_count: int = Field(16, ge=1, le=1024, description="Concurrent downstream connections (workers).")
    max_txn_row: int = Field(
        256, ge=1, le=2048, description="Rows per downstream transaction; one upstream transaction is never split."
    )
    safe_mode: bool = Field(False, description="Apply every row as an upsert (REPLACE), not only replayed rows.")
    time_zone: str = Field("+00:00", description="Session time zone: +HH:MM, UTC or an IANA name such as Asia/Tokyo.")
    ssl_ca: str = Field("", description="CA certificate file; set to verify the server and use TLS.")
    ssl_cert: str = Field("", description="Client certificate file for TLS client authentication.")
    ssl_key: str = Field("", description="Client private key file for TLS client authentication.")
    read_timeout: float = Field(120.0, gt=0, description="Seconds to wait for a server reply before giving up.")
    write_timeout: float = Field(120.0, gt=0, description="Seconds to wait for a write to the server.")
    timeout: float = Field(10.0, gt=0, description="Seconds to wait for a connection to open.")
    retry_timeout: float = Field(
        120.0, gt=0, description="Seconds to keep retrying an unreachable downstream before raising error 2001."
    )
    retry_max_backoff: float = Field(10.0, gt=0, description="Longest pause between two retries, in seconds.")
    checkpoint_schema: str = Field("cdcflow", description="Database of the checkpoint table (created when missing).")


@dataclass(frozen=True, slots=True)
class ConnectionTarget:
    """Where and how to connect: what PyMySQL needs, secrets included."""

    host: str
    port: int
    user: str
    password: str
    tls: bool

    def __repr__(self) -> str:  # never print the password
        return f"ConnectionTarget({self.user}@{self.host}:{self.port}, tls={self.tls})"


def target_of(config: MySQLSinkConfig) -> ConnectionTarget:
    """The server named by ``uri`` (when set) or by host/port/user/password."""
    if not config.uri:
        return ConnectionTarget(
            config.host, config.port, config.user, config.password.get_secret_value(), bool(config.ssl_ca)
        )
    parts = urlsplit(config.uri)
    if parts.scheme not in SCHEMES:
        raise ConfigInvalidError(f"MySQL sink URI must start with one of {', '.join(s + '://' for s in SCHEMES)}")
    if not parts.hostname:
        raise ConfigInvalidError("MySQL sink URI names no host; write mysql://user:pass@host:3306/")
    try:
        port = parts.port or 3306
    except ValueError as exc:
        raise ConfigInvalidError(f"MySQL sink URI has a bad port: {exc}") from exc
    return ConnectionTarget(
        host=parts.hostname,
        port=port,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        tls=parts.scheme.endswith("+ssl") or bool(config.ssl_ca),
    )


def session_zone(name: str) -> dt.tzinfo:
    """The tzinfo of the ``time-zone`` option (aware datetimes are converted to it)."""
    if name.upper() in ("UTC", "Z"):
        return dt.UTC
    match = _OFFSET.match(name)
    if match:
        sign = -1 if match.group(1) == "-" else 1
        return dt.timezone(sign * dt.timedelta(hours=int(match.group(2)), minutes=int(match.group(3))))
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigInvalidError(f"time-zone {name!r} is neither +HH:MM, UTC nor a known IANA zone name") from exc


def session_zone_sql(name: str, zone: dt.tzinfo) -> str:
    """What to SET time_zone to: a fixed offset works without the server's zone tables."""
    if isinstance(zone, dt.timezone):
        offset = zone.utcoffset(None)
        minutes = int(offset.total_seconds()) // 60
        sign = "-" if minutes < 0 else "+"
        return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return name


def describe_issues(config: MySQLSinkConfig) -> list[tuple[str, str]]:
    """Problems found in ``config`` as (field, message) pairs."""
    issues: list[tuple[str, str]] = []
    try:
        target_of(config)
    except ConfigInvalidError as exc:
        issues.append(("uri", exc.message))
    try:
        session_zone(config.time_zone)
    except ConfigInvalidError as exc:
        issues.append(("time-zone", exc.message))
    if bool(config.ssl_cert) != bool(config.ssl_key):
        issues.append(("ssl-cert", "ssl-cert and ssl-key go together; set both or neither"))
    return issues
