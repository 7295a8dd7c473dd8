"""A Confluent Schema Registry client: the REST calls the avro codec and its decoder make.

=====================================  =========================================  ====================
Call                                   Request                                    Answer used
=====================================  =========================================  ====================
:meth:`register`                       ``POST /subjects/{subject}/versions``      ``{"id": N}``
                                       body ``{"schema": "<schema JSON text>"}``
:meth:`schema_by_id`                   ``GET /schemas/ids/{id}``                  ``{"schema": "…"}``
:meth:`versions`                       ``GET /subjects/{subject}/versions``       ``[1, 2, …]``
:meth:`version`                        ``GET /subjects/{subject}/versions/{v}``   subject, id, version,
                                                                                  schema
=====================================  =========================================  ====================

Requests carry ``Content-Type: application/vnd.schemaregistry.v1+json``;
user and password from the URL (``https://user:pass@host``, URL-encoded, as
TiCDC's ``schema-registry``) go out as HTTP basic auth. Errors:

* HTTP 409 on register → :class:`SchemaIncompatibleError` with the
  registry's message (the subject's compatibility rule refused the schema);
* 404 on a schema id → :class:`SchemaNotFoundError`;
* any other error status, an unreachable registry, a timeout or an answer
  that is not the documented JSON → :class:`SchemaRegistryError` (2001, retry).

Caching: a schema registered under a subject is not posted again (same
subject and schema text → the cached id); a schema fetched by id is kept
(ids are immutable). The caches are per client and unbounded: one entry per
table schema version, which a changefeed has few of.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from cdcflow.plugins.codecs.avro.errors import (
    SchemaIncompatibleError,
    SchemaNotFoundError,
    SchemaRegistryError,
)

__all__ = ["CONTENT_TYPE", "SchemaRegistryClient", "schema_text"]

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_ACCEPT = f"{CONTENT_TYPE}, application/vnd.schemaregistry+json; q=0.9, application/json; q=0.5"


def schema_text(schema: Mapping[str, Any]) -> str:
    """The compact JSON text of a schema, as registered (field order kept)."""
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


class SchemaRegistryClient:
    """Registers and fetches Avro schemas over the Confluent Schema Registry REST API (thread-safe)."""

    def __init__(self, url: str, *, timeout: float = 10.0, retries: int = 2) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"schema registry URL must be http(s)://host:port, got {url!r}")
        self._auth: str | None = None
        if parts.username is not None:
            user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self._auth = "Basic " + base64.b64encode(user_pass.encode()).decode()
        netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        if ":" in parts.hostname:
            netloc = f"[{parts.hostname}]" + (f":{parts.port}" if parts.port else "")
        #: The URL without credentials (safe for messages and logs).
        self.url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.timeout = timeout
        self.retries = retries
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    # -- the calls ----------------------------------------------------------------------

    def register(self, subject: str, schema: Mapping[str, Any] | str) -> int:
        """The registry's id for ``schema`` under ``subject``, registering a new version when needed."""
        text = schema if isinstance(schema, str) else schema_text(schema)
        with self._lock:
            cached = self._ids.get((subject, text))
        if cached is not None:
            return cached
        answer = self._call("POST", f"/subjects/{_segment(subject)}/versions", {"schema": text}, subject=subject)
        schema_id: int = _field(answer, "id", int, self.url)
        with self._lock:
            self._ids[(subject, text)] = schema_id
            self._schemas.setdefault(schema_id, json.loads(text))
        return schema_id

    def schema_by_id(self, schema_id: int) -> dict[str, Any]:
        """The schema (parsed JSON) the registry holds under ``schema_id``."""
        with self._lock:
            cached = self._schemas.get(schema_id)
        if cached is not None:
            return cached
        answer = self._call("GET", f"/schemas/ids/{int(schema_id)}", schema_id=schema_id)
        text: str = _field(answer, "schema", str, self.url)
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise SchemaRegistryError(f"schema registry {self.url}: schema {schema_id} is not JSON: {exc}") from exc
        if not isinstance(schema, dict):
            schema = {"type": schema}  # a primitive schema such as "string"
        with self._lock:
            self._schemas[schema_id] = schema
        return schema

    def versions(self, subject: str) -> list[int]:
        """Version numbers registered under ``subject``, oldest first."""
        answer = self._call("GET", f"/subjects/{_segment(subject)}/versions", subject=subject)
        if not isinstance(answer, list) or not all(isinstance(v, int) for v in answer):
            raise SchemaRegistryError(f"schema registry {self.url}: versions of {subject!r} are not a list: {answer!r}")
        return answer

    def version(self, subject: str, version: int | str = "latest") -> dict[str, Any]:
        """``{"subject", "id", "version", "schema"}`` of one version of ``subject``."""
        answer = self._call("GET", f"/subjects/{_segment(subject)}/versions/{version}", subject=subject)
        if not isinstance(answer, dict):
            raise SchemaRegistryError(f"schema registry {self.url}: version answer is not an object: {answer!r}")
        return answer

    # -- HTTP ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, **detail: Any) -> Any:
        """One REST call; an unreachable registry or a 5xx is tried ``retries`` more times with backoff.

        Registering is idempotent (the same schema under the same subject
        gets the same id), so a retried POST is safe.
        """
        for attempt in range(self.retries + 1):
            try:
                return self._call_once(method, path, body, detail)
            except SchemaRegistryError as exc:
                if not exc.detail.get("transient") or attempt == self.retries:
                    raise
                time.sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")

    def _call_once(self, method: str, path: str, body: Any, detail: dict[str, Any]) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": _ACCEPT}
        if data is not None:
            headers["Content-Type"] = CONTENT_TYPE
        if self._auth is not None:
            headers["Authorization"] = self._auth
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        where = f"schema registry {self.url}: {method} {path}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise self._status_error(exc, where, detail) from None
        except (OSError, TimeoutError) as exc:  # refused, DNS, TLS, timeout
            raise SchemaRegistryError(
                f"{where}: unreachable ({exc}); check schema-registry and that the registry is up",
                detail={"registry": self.url, "transient": True, **detail},
            ) from exc
        try:
            return json.loads(payload)
        except ValueError as exc:
            raise SchemaRegistryError(f"{where}: answer is not JSON: {payload[:200]!r}") from exc

    def _status_error(self, exc: urllib.error.HTTPError, where: str, detail: dict[str, Any]) -> SchemaRegistryError:
        try:
            doc = json.loads(exc.read() or b"{}")
        except ValueError:
            doc = {}
        code = doc.get("error_code", exc.code) if isinstance(doc, dict) else exc.code
        message = doc.get("message", exc.reason) if isinstance(doc, dict) else exc.reason
        info = {"registry": self.url, "status": exc.code, "error_code": code, "transient": exc.code >= 500, **detail}
        if exc.code == 409:
            return SchemaIncompatibleError(
                f"{where}: the registry refused the schema as incompatible with the subject's earlier versions "
                f"({message}). Change the subject's compatibility level (PUT /config/{{subject}}) or the table, "
                "then resume the changefeed",
                detail=info,
            )
        if exc.code == 404 and "schema_id" in detail:
            return SchemaNotFoundError(f"{where}: no such schema ({message})", detail=info)
        if exc.code in (401, 403):
            return SchemaRegistryError(
                f"{where}: HTTP {exc.code} {message}; check the user and password in schema-registry", detail=info
            )
        return SchemaRegistryError(f"{where}: HTTP {exc.code} error {code}: {message}", detail=info)


def _segment(text: str) -> str:
    return quote(text, safe="")


def _field(answer: Any, name: str, kind: type, url: str) -> Any:
    if not isinstance(answer, dict) or not isinstance(answer.get(name), kind):
        raise SchemaRegistryError(f"schema registry {url}: answer lacks {name!r}: {str(answer)[:200]}")
    return answer[name]
