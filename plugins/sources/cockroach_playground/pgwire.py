"""The PostgreSQL v3 wire protocol, server side, as CockroachDB speaks it.

Startup (SSLRequest and GSSENCRequest answered ``N``; CancelRequest), trust,
cleartext-password or SCRAM-SHA-256 authentication, ParameterStatus,
BackendKeyData, ReadyForQuery; the simple query protocol (several statements
per Query) and the extended one (Parse/Bind/Describe/Execute/Close/Sync/Flush,
named and unnamed statements and portals, text and binary parameters, text
results); RowDescription, DataRow, CommandComplete, EmptyQueryResponse,
ErrorResponse with SQLSTATE. A sinkless changefeed streams DataRows until the
client closes the connection or cancels the query.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import secrets
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from cdcflow.plugins.sources.cockroach_playground.changefeed import run_changefeed
from cdcflow.plugins.sources.cockroach_playground.sql import Result, Session, SQLError, split_statements
from cdcflow.plugins.sources.cockroach_playground.store import Store

__all__ = ["PgServer"]

log = logging.getLogger(__name__)

_SSL_REQUEST, _GSS_REQUEST, _CANCEL_REQUEST, _PROTOCOL_3 = 80877103, 80877104, 80877102, 196608

#: CockroachDB SQL types → (PostgreSQL type OID, typlen).
_OIDS = {
    "BOOL": (16, 1),
    "BYTES": (17, -1),
    "INT8": (20, 8),
    "INT2": (21, 2),
    "INT4": (23, 4),
    "STRING": (25, -1),
    "FLOAT4": (700, 4),
    "FLOAT8": (701, 8),
    "DATE": (1082, 4),
    "TIMESTAMP": (1114, 8),
    "TIMESTAMPTZ": (1184, 8),
    "DECIMAL": (1700, -1),
    "JSONB": (3802, -1),
    "UUID": (2950, 16),
    "TIME": (1083, 8),
}
_ALIASES = {
    "INT": "INT8",
    "BIGINT": "INT8",
    "INTEGER": "INT8",
    "SMALLINT": "INT2",
    "TEXT": "STRING",
    "VARCHAR": "STRING",
    "CHAR": "STRING",
    "NUMERIC": "DECIMAL",
    "FLOAT": "FLOAT8",
    "REAL": "FLOAT4",
    "BOOLEAN": "BOOL",
    "JSON": "JSONB",
    "BYTEA": "BYTES",
    "DOUBLE PRECISION": "FLOAT8",
}


def _oid(type_text: str) -> tuple[int, int]:
    base = type_text.upper().split("(")[0].strip()
    return _OIDS.get(_ALIASES.get(base, base), (25, -1))


def _text(v: Any) -> bytes:
    if isinstance(v, bool):
        return b"t" if v else b"f"
    if isinstance(v, bytes):
        return b"\\x" + v.hex().encode()
    if isinstance(v, dt.datetime):
        if v.tzinfo:
            return v.astimezone(dt.UTC).isoformat(sep=" ").encode()
        return v.isoformat(sep=" ").encode()
    if isinstance(v, (dict, list)):
        return json.dumps(v).encode()
    if isinstance(v, float):
        return repr(v).encode()
    return str(v).encode()


def _binary_param(oid: int, data: bytes) -> Any:
    if oid == 21:
        return struct.unpack("!h", data)[0]
    if oid == 23:
        return struct.unpack("!i", data)[0]
    if oid == 20:
        return struct.unpack("!q", data)[0]
    if oid == 701:
        return struct.unpack("!d", data)[0]
    if oid == 16:
        return data != b"\x00"
    if oid == 17:
        return bytes(data)
    if oid == 3802:
        return json.loads(data[1:])
    return data.decode()


def _text_param(oid: int, data: bytes) -> Any:
    text = data.decode()
    if oid in (20, 21, 23):
        return int(text)
    if oid == 1700:
        return Decimal(text)
    if oid in (700, 701):
        return float(text)
    if oid == 17:
        return bytes.fromhex(text[2:]) if text.startswith("\\x") else data
    return text


def _msg(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def _cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


def _error(sqlstate: str, message: str, severity: str = "ERROR") -> bytes:
    fields = b"S" + _cstr(severity) + b"V" + _cstr(severity) + b"C" + _cstr(sqlstate) + b"M" + _cstr(message)
    return _msg(b"E", fields + b"\x00")


class _Conn:
    """One client connection."""

    def __init__(self, server: PgServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.session = Session(server.store)
        self.session.before_commit = server.before_commit
        self.pid = secrets.randbelow(1 << 31)
        self.secret = secrets.randbelow(1 << 31)
        self.statements: dict[str, tuple[str, list[int]]] = {}
        self.portals: dict[str, tuple[str, list[Any]]] = {}
        self.feed_task: asyncio.Task[None] | None = None
        self.spec: Any = None

    async def read_message(self) -> tuple[bytes, bytes]:
        head = await self.reader.readexactly(5)
        (length,) = struct.unpack("!i", head[1:])
        return head[:1], await self.reader.readexactly(length - 4)

    async def startup(self) -> bool:
        while True:
            (length,) = struct.unpack("!i", await self.reader.readexactly(4))
            body = await self.reader.readexactly(length - 4)
            (code,) = struct.unpack("!i", body[:4])
            if code in (_SSL_REQUEST, _GSS_REQUEST):
                self.writer.write(b"N")
                continue
            if code == _CANCEL_REQUEST:
                pid, key = struct.unpack("!ii", body[4:12])
                self.server.cancel(pid, key)
                return False
            if code != _PROTOCOL_3:
                self.writer.write(
                    _error("08P01", f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}", "FATAL")
                )
                return False
            parts = body[4:].split(b"\x00")
            params = {parts[i].decode(): parts[i + 1].decode() for i in range(0, len(parts) - 1, 2) if parts[i]}
            break
        user = params.get("user", "root")
        self.session.user = user
        if not await self.authenticate(user):
            return False
        for key, value in (
            ("server_version", "13.0.0"),
            ("server_encoding", "UTF8"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("IntervalStyle", "postgres"),
            ("integer_datetimes", "on"),
            ("standard_conforming_strings", "on"),
            ("TimeZone", "UTC"),
            ("is_superuser", "on"),
            ("application_name", params.get("application_name", "")),
            ("crdb_version", self.session.version),
            ("session_authorization", user),
        ):
            self.writer.write(_msg(b"S", _cstr(key) + _cstr(value)))
        self.writer.write(_msg(b"K", struct.pack("!ii", self.pid, self.secret)))
        self.ready()
        return True

    async def authenticate(self, user: str) -> bool:
        password = self.server.passwords.get(user)
        if password is None:
            if self.server.passwords:
                self.writer.write(_error("28000", f"password authentication failed for user {user}", "FATAL"))
                return False
            self.writer.write(_msg(b"R", struct.pack("!i", 0)))
            return True
        if self.server.auth == "password":
            self.writer.write(_msg(b"R", struct.pack("!i", 3)))
            kind, body = await self.read_message()
            ok = kind == b"p" and hmac.compare_digest(body.rstrip(b"\x00"), password.encode())
        else:
            ok = await self._scram(password)
        if not ok:
            self.writer.write(_error("28P01", f"password authentication failed for user {user}", "FATAL"))
            return False
        self.writer.write(_msg(b"R", struct.pack("!i", 0)))
        return True

    async def _scram(self, password: str) -> bool:
        """SCRAM-SHA-256 (RFC 5802/7677) without channel binding."""
        self.writer.write(_msg(b"R", struct.pack("!i", 10) + _cstr("SCRAM-SHA-256") + b"\x00"))
        _, body = await self.read_message()
        mech_end = body.index(b"\x00")
        client_first = body[mech_end + 5 :].decode()
        bare = client_first.split(",", 2)[2]
        client_nonce = dict(kv.split("=", 1) for kv in bare.split(","))["r"]
        salt, iterations = os.urandom(16), 4096
        nonce = client_nonce + base64.b64encode(os.urandom(18)).decode()
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        self.writer.write(_msg(b"R", struct.pack("!i", 11) + server_first.encode()))
        _, body = await self.read_message()
        client_final = body.decode()
        without_proof, proof_b64 = client_final.rsplit(",p=", 1)
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", "sha256").digest()
        stored_key = hashlib.sha256(client_key).digest()
        auth_message = f"{bare},{server_first},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, "sha256").digest()
        proof = base64.b64decode(proof_b64)
        recovered = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        if not hmac.compare_digest(hashlib.sha256(recovered).digest(), stored_key):
            return False
        server_key = hmac.new(salted, b"Server Key", "sha256").digest()
        server_sig = base64.b64encode(hmac.new(server_key, auth_message, "sha256").digest()).decode()
        self.writer.write(_msg(b"R", struct.pack("!i", 12) + f"v={server_sig}".encode()))
        return True

    def ready(self) -> None:
        status = b"I" if self.session.txn is None else (b"E" if self.session.txn_failed else b"T")
        self.writer.write(_msg(b"Z", status))

    def row_description(self, columns: list[tuple[str, str]]) -> bytes:
        payload = struct.pack("!h", len(columns))
        for name, type_text in columns:
            oid, size = _oid(type_text)
            payload += _cstr(name) + struct.pack("!ihihih", 0, 0, oid, size, -1, 0)
        return _msg(b"T", payload)

    @staticmethod
    def data_row(values: list[Any] | tuple[Any, ...]) -> bytes:
        payload = struct.pack("!h", len(values))
        for v in values:
            if v is None:
                payload += struct.pack("!i", -1)
            else:
                data = _text(v)
                payload += struct.pack("!i", len(data)) + data
        return _msg(b"D", payload)

    async def send_result(self, result: Result, *, describe: bool) -> None:
        if result.feed is not None:
            if describe:
                self.writer.write(self.row_description(result.columns))
            await self.stream_feed(result.feed)
            return
        if result.columns and describe:
            self.writer.write(self.row_description(result.columns))
        for row in result.rows:
            self.writer.write(self.data_row(row))
        self.writer.write(_msg(b"C", _cstr(result.tag or "SELECT 0")))

    async def stream_feed(self, spec: Any) -> None:
        self.spec = spec
        self.server.feeds.add(self)
        count = 0
        try:
            async for row in run_changefeed(self.server.store, spec):
                self.writer.write(self.data_row(row))
                count += 1
                await self.writer.drain()
                if self.reader.at_eof():
                    raise ConnectionResetError("client went away")
            self.writer.write(_msg(b"C", _cstr(f"SELECT {count}")))
        finally:
            self.server.feeds.discard(self)
            self.spec = None

    async def run(self) -> None:
        if not await self.startup():
            await self.writer.drain()
            return
        skipping = False  # after an error in the extended protocol: until Sync
        while True:
            await self.writer.drain()
            kind, body = await self.read_message()
            if kind == b"X":
                return
            if kind == b"Q":
                await self.simple_query(body[:-1].decode())
                self.ready()
                continue
            if kind == b"S":
                skipping = False
                self.ready()
                continue
            if kind == b"H":
                continue
            if skipping:
                continue
            try:
                await self.extended(kind, body)
            except SQLError as exc:
                self.writer.write(_error(exc.sqlstate, exc.message))
                skipping = True

    async def simple_query(self, sql: str) -> None:
        statements = split_statements(sql)
        if not statements:
            self.writer.write(_msg(b"I"))
            return
        for statement in statements:
            try:
                result = self.session.execute(statement)
                await self.send_result(result, describe=True)
            except SQLError as exc:
                self.writer.write(_error(exc.sqlstate, exc.message))
                return

    async def extended(self, kind: bytes, body: bytes) -> None:  # noqa: PLR0915
        if kind == b"P":
            raw_name, rest = body.split(b"\x00", 1)
            raw_query, rest = rest.split(b"\x00", 1)
            (n,) = struct.unpack("!h", rest[:2])
            oids = list(struct.unpack(f"!{n}i", rest[2 : 2 + 4 * n]))
            self.statements[raw_name.decode()] = (raw_query.decode(), oids)
            self.writer.write(_msg(b"1"))
        elif kind == b"B":
            raw_portal, rest = body.split(b"\x00", 1)
            raw_stmt, rest = rest.split(b"\x00", 1)
            query, oids = self.statements[raw_stmt.decode()]
            (nf,) = struct.unpack("!h", rest[:2])
            formats = list(struct.unpack(f"!{nf}h", rest[2 : 2 + 2 * nf]))
            pos = 2 + 2 * nf
            (np_,) = struct.unpack("!h", rest[pos : pos + 2])
            pos += 2
            params: list[Any] = []
            for i in range(np_):
                (size,) = struct.unpack("!i", rest[pos : pos + 4])
                pos += 4
                if size < 0:
                    params.append(None)
                    continue
                data = rest[pos : pos + size]
                pos += size
                fmt = formats[i] if len(formats) > 1 else (formats[0] if formats else 0)
                oid = oids[i] if i < len(oids) else 0
                params.append(_binary_param(oid, data) if fmt == 1 else _text_param(oid, data))
            (nr,) = struct.unpack("!h", rest[pos : pos + 2])
            result_formats = struct.unpack(f"!{nr}h", rest[pos + 2 : pos + 2 + 2 * nr])
            if any(result_formats):
                raise SQLError("0A000", "the playground sends text results only")
            self.portals[raw_portal.decode()] = (query, params)
            self.writer.write(_msg(b"2"))
        elif kind == b"D":
            which, name = body[:1], body[1:-1].decode()
            if which == b"S":
                query, oids = self.statements[name]
                self.writer.write(_msg(b"t", struct.pack(f"!h{len(oids)}i", len(oids), *oids)))
                columns = self._columns_of(query)
            else:
                columns = self._columns_of(self.portals[name][0])
            self.writer.write(self.row_description(columns) if columns else _msg(b"n"))
        elif kind == b"E":
            name = body.split(b"\x00", 1)[0].decode()
            query, params = self.portals[name]
            if not query.strip():
                self.writer.write(_msg(b"I"))
                return
            result = self.session.execute(query, params)
            await self.send_result(result, describe=False)
        elif kind == b"C":
            which, name = body[:1], body[1:-1].decode()
            (self.statements if which == b"S" else self.portals).pop(name, None)
            self.writer.write(_msg(b"3"))
        else:
            raise SQLError("08P01", f"unexpected message {kind!r}")

    def _columns_of(self, query: str) -> list[tuple[str, str]]:
        """Result columns of a query, found by running it read-only (SELECT/SHOW) or from its kind."""
        head = query.lstrip().upper()
        if head.startswith(("CREATE CHANGEFEED", "EXPERIMENTAL CHANGEFEED")):
            return [("table", "STRING"), ("key", "BYTES"), ("value", "BYTES")]
        if head.startswith(("SELECT", "SHOW")):
            try:
                params = [None] * 32
                return Session(self.server.store).execute(query, params).columns
            except SQLError:
                return []
        return []


class PgServer:
    """A pgwire server over a :class:`Store` on 127.0.0.1."""

    def __init__(self, store: Store, *, passwords: dict[str, str] | None = None, auth: str = "scram-sha-256") -> None:
        self.store = store
        self.passwords = dict(passwords or {})
        self.auth = auth
        self.feeds: set[_Conn] = set()
        self.conns: set[_Conn] = set()
        self.before_commit: Callable[[], None] = lambda: None
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns):
            conn.writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(self, reader, writer)
        self.conns.add(conn)
        try:
            await conn.run()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass  # the playground stops: end quietly (asyncio logs a cancelled connection handler)
        except Exception:
            log.exception("cockroach playground: connection failed")
        finally:
            self.conns.discard(conn)
            writer.transport.abort()

    def cancel(self, pid: int, key: int) -> None:
        for conn in list(self.feeds):
            if conn.pid == pid and conn.secret == key:
                conn.writer.transport.abort()

    def drop_feed_connections(self) -> int:
        """Close every connection streaming a changefeed (fault injection); how many there were."""
        feeds = list(self.feeds)
        for conn in feeds:
            conn.writer.transport.abort()
        return len(feeds)

    def fail_feeds(self, sqlstate: str, message: str) -> int:
        """Make every running changefeed end with this error at its next step (fault injection)."""
        feeds = list(self.feeds)
        for conn in feeds:
            if conn.spec is not None:
                conn.spec.fail_with = SQLError(sqlstate, message)
        return len(feeds)
