"""The MySQL sink's TLS options against a MariaDB with certificates, and its session time zone."""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdcflow.core.data.events import MicroBatch
from cdcflow.core.data.sink import SinkContext
from cdcflow.core.errors import DownstreamUnavailableError, Retryable
from cdcflow.core.testing import insert
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from tests.fixtures.mariadb import MariaDB, new_database, start_mariadb

pytestmark = pytest.mark.integration


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(tmp: Path, name: str) -> None:
    """A CA, and a server and a client certificate it signed."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem",
             "-days", "1", "-subj", f"/CN={name} test CA", cwd=tmp)  # fmt: skip
    for leaf in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-{leaf}.key", "-out", f"{name}-{leaf}.csr",
                 "-subj", f"/CN=127.0.0.1 {leaf}", cwd=tmp)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}-{leaf}.csr", "-CA", f"{name}-ca.pem", "-CAkey", f"{name}-ca.key",
                 "-CAcreateserial", "-out", f"{name}-{leaf}.pem", "-days", "1", cwd=tmp)  # fmt: skip


@pytest.fixture(scope="module")
def tls_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MariaDB, Path]]:
    pki = tmp_path_factory.mktemp("pki")
    make_pki(pki, "good")
    make_pki(pki, "other")
    args = (
        f"--ssl-ca={pki / 'good-ca.pem'}",
        f"--ssl-cert={pki / 'good-server.pem'}",
        f"--ssl-key={pki / 'good-server.key'}",
    )
    with start_mariadb(args, local=True) as server:
        yield server, pki


def test_tls_with_a_verified_server_and_a_client_certificate(tls_mariadb: tuple[MariaDB, Path]) -> None:
    server, pki = tls_mariadb
    db = new_database(server)
    with server.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    uri = (
        f"mysql+ssl://root@127.0.0.1:{server.port}/?ssl-ca={pki / 'good-ca.pem'}"
        f"&ssl-cert={pki / 'good-client.pem'}&ssl-key={pki / 'good-client.key'}"
    )
    sink = MySQLSink(MySQLSinkConfig(**MySQLSink.options_from_uri(uri)))
    sink.open(SinkContext(f"tls-{db}"))
    sink.write_batch(MicroBatch(f"tls-{db}", 0, 0, 20, [insert(db, "t", {"id": 7}, commit_ts=10)]))
    downstream, _ = sink._require_open()
    with downstream.connection(0).cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        (_, cipher) = cur.fetchone() or ("", "")
    sink.close()
    assert cipher, "the sink's connection is not encrypted"
    with server.connect(db) as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM t")
        assert cur.fetchall() == ((7,),)


def test_a_server_certificate_from_another_ca_is_refused(tls_mariadb: tuple[MariaDB, Path]) -> None:
    server, pki = tls_mariadb
    uri = f"mysql+ssl://root@127.0.0.1:{server.port}/?ssl-ca={pki / 'other-ca.pem'}"
    sink = MySQLSink(MySQLSinkConfig(**MySQLSink.options_from_uri(uri)))
    with pytest.raises(DownstreamUnavailableError, match="CERTIFICATE_VERIFY_FAILED") as info:
        sink.open(SinkContext("tls-refused"))  # at once: retrying cannot fix a certificate
    sink.close()
    assert info.value.retryable is Retryable.LATER


def test_tls_without_a_ca_encrypts_without_verifying(tls_mariadb: tuple[MariaDB, Path]) -> None:
    server, _ = tls_mariadb
    sink = MySQLSink(MySQLSinkConfig(uri=f"mysql+ssl://root@127.0.0.1:{server.port}/"))
    sink.open(SinkContext("tls-unverified"))
    downstream, _ = sink._require_open()
    with downstream.connection(0).cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        (_, cipher) = cur.fetchone() or ("", "")
    sink.close()
    assert cipher


def test_session_time_zone_applies_to_aware_values(mariadb: MariaDB, mysql_database: str) -> None:
    db = mysql_database
    with mariadb.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE ev (id INT PRIMARY KEY, at_ts TIMESTAMP NULL, at_dt DATETIME NULL)")
    instant = dt.datetime(2026, 1, 1, 0, 0, tzinfo=dt.UTC)
    sink = MySQLSink(MySQLSinkConfig(uri=mariadb.uri, time_zone="+08:00"))
    sink.open(SinkContext(f"tz-{db}"))
    sink.write_batch(
        MicroBatch(
            f"tz-{db}", 0, 0, 20, [insert(db, "ev", {"id": 1, "at_ts": instant, "at_dt": instant}, commit_ts=10)]
        )
    )
    sink.close()
    with mariadb.connect(db) as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SELECT at_ts, at_dt FROM ev")
        at_ts, at_dt = cur.fetchone() or (None, None)
    # TIMESTAMP keeps the instant; DATETIME keeps the wall clock of the sink's session zone.
    assert at_ts == dt.datetime(2026, 1, 1, 0, 0)
    assert at_dt == dt.datetime(2026, 1, 1, 8, 0)
