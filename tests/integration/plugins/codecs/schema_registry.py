"""A Confluent Schema Registry for the tests: its REST API over real HTTP (aiohttp.web on 127.0.0.1:0).

Implements, with Confluent's status codes, error codes and media type
(``application/vnd.schemaregistry.v1+json``):

* ``POST /subjects/{subject}/versions`` ``{"schema": "..."}`` → ``{"id": N}``;
  the same schema under the same subject returns its existing id; the same
  schema under another subject reuses the global id; an invalid schema is 422
  (error 42201); a schema that breaks the subject's compatibility level
  (default BACKWARD, checked against the latest version) is 409 (error 409);
* ``GET /schemas/ids/{id}`` → ``{"schema": "..."}`` or 404 (error 40403);
* ``GET /subjects`` → names; ``GET /subjects/{subject}/versions`` → ``[1, 2]``
  or 404 (40401); ``GET /subjects/{subject}/versions/{v|latest}`` →
  ``{"subject", "id", "version", "schema"}`` or 404 (40402);
* ``GET /config``, ``PUT /config`` and ``PUT /config/{subject}``
  ``{"compatibility": "NONE|BACKWARD|..."}``;
* optional HTTP basic auth (401, error 401) when ``users`` is given;
* ``fail_next`` = N: the next N requests get 500 (error 50001).

The BACKWARD check is Avro schema resolution for flat records, as Confluent
applies it: every field of the new schema must exist in the old one with a
type the old one's values resolve to (same type, numeric promotion, a union
holding it), or have a default.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from typing import Any

import fastavro
from aiohttp import web

MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"
_PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"}, "float": {"double"}}


def _reply(status: int, doc: Any) -> web.Response:
    return web.Response(status=status, body=json.dumps(doc).encode(), content_type=MEDIA_TYPE)


def _error(status: int, code: int, message: str) -> web.Response:
    return _reply(status, {"error_code": code, "message": message})


def _type_name(avro_type: Any) -> Any:
    if isinstance(avro_type, dict):
        return avro_type.get("name") if avro_type.get("type") in ("record", "enum", "fixed") else avro_type["type"]
    return avro_type


def _resolves(writer: Any, reader: Any) -> bool:
    """Whether values written as ``writer`` can be read as ``reader`` (flat types and unions)."""
    if isinstance(writer, list):
        return all(_resolves(w, reader) for w in writer)
    if isinstance(reader, list):
        return any(_resolves(writer, r) for r in reader)
    w, r = _type_name(writer), _type_name(reader)
    return w == r or r in _PROMOTIONS.get(w, set()) or {w, r} == {"string", "bytes"}


def backward_compatible(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether a reader with ``new`` reads data written with ``old``."""
    if new.get("type") != "record" or old.get("type") != "record":
        return _resolves(old, new)
    if new.get("name") != old.get("name"):
        return False
    old_fields = {f["name"]: f for f in old["fields"]}
    for field in new["fields"]:
        before = old_fields.get(field["name"])
        if before is None:
            if "default" not in field:
                return False
        elif not _resolves(before["type"], field["type"]):
            return False
    return True


class SchemaRegistryServer:
    """The registry double; ``url`` is where it listens. Call :meth:`close` when done."""

    def __init__(self, users: dict[str, str] | None = None) -> None:
        self.schemas: dict[int, str] = {}  # id → schema text as first registered
        self.subjects: dict[str, list[int]] = {}  # subject → schema id per version (version = index + 1)
        self.compatibility: dict[str, str] = {}
        self.global_compatibility = "BACKWARD"
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        #: Answer this many next requests with 500 (error 50001), as a registry whose store is down.
        self.fail_next = 0
        self._users = users
        self._canonical: dict[str, int] = {}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="schema-registry")
        self._thread.start()
        self._ready.wait(30)
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    # -- lifecycle ------------------------------------------------------------------------

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(middlewares=[self._middleware])
        app.add_routes(
            [
                web.post("/subjects/{subject}/versions", self._register),
                web.get("/subjects", self._list_subjects),
                web.get("/subjects/{subject}/versions", self._versions),
                web.get("/subjects/{subject}/versions/{version}", self._version),
                web.get("/schemas/ids/{id}", self._schema_by_id),
                web.get("/config", self._get_config),
                web.put("/config", self._put_config),
                web.put("/config/{subject}", self._put_config),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", 0).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    # -- handlers -------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path, dict(request.headers)))
        if self.fail_next > 0:
            self.fail_next -= 1
            return _error(500, 50001, "Error in the backend data store")
        if self._users is not None:
            header = request.headers.get("Authorization", "")
            user, password = "", None
            if header.startswith("Basic "):
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            if password is None or self._users.get(user) != password:
                return _error(401, 401, "Unauthorized")
        return await handler(request)  # type: ignore[no-any-return]

    async def _register(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        try:
            body = await request.json()
            text = body["schema"]
            parsed = json.loads(text)
            fastavro.parse_schema(parsed)
        except (ValueError, KeyError, TypeError, fastavro.schema.SchemaParseException) as exc:
            return _error(422, 42201, f"Invalid schema: {exc}")
        canonical = json.dumps(parsed, sort_keys=True)
        versions = self.subjects.get(subject, [])
        known = self._canonical.get(canonical)
        if known is not None and known in versions:
            return _reply(200, {"id": known})
        level = self.compatibility.get(subject, self.global_compatibility)
        if versions and level.startswith("BACKWARD"):
            latest = json.loads(self.schemas[versions[-1]])
            if not backward_compatible(parsed, latest):
                message = f'Schema being registered is incompatible with an earlier schema for subject "{subject}"'
                return _error(409, 409, message)
        if known is None:
            known = len(self.schemas) + 1
            self.schemas[known] = text
            self._canonical[canonical] = known
        self.subjects.setdefault(subject, []).append(known)
        return _reply(200, {"id": known})

    async def _schema_by_id(self, request: web.Request) -> web.Response:
        text = self.schemas.get(int(request.match_info["id"]))
        if text is None:
            return _error(404, 40403, "Schema not found")
        return _reply(200, {"schema": text})

    async def _list_subjects(self, request: web.Request) -> web.Response:
        return _reply(200, sorted(self.subjects))

    async def _versions(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        if subject not in self.subjects:
            return _error(404, 40401, f"Subject '{subject}' not found.")
        return _reply(200, list(range(1, len(self.subjects[subject]) + 1)))

    async def _version(self, request: web.Request) -> web.Response:
        subject, version = request.match_info["subject"], request.match_info["version"]
        ids = self.subjects.get(subject)
        if ids is None:
            return _error(404, 40401, f"Subject '{subject}' not found.")
        number = len(ids) if version == "latest" else int(version)
        if not 1 <= number <= len(ids):
            return _error(404, 40402, "Version not found.")
        schema_id = ids[number - 1]
        return _reply(200, {"subject": subject, "id": schema_id, "version": number, "schema": self.schemas[schema_id]})

    async def _get_config(self, request: web.Request) -> web.Response:
        return _reply(200, {"compatibilityLevel": self.global_compatibility})

    async def _put_config(self, request: web.Request) -> web.Response:
        level = (await request.json())["compatibility"]
        subject = request.match_info.get("subject")
        if subject is None:
            self.global_compatibility = level
        else:
            self.compatibility[subject] = level
        return _reply(200, {"compatibility": level})
