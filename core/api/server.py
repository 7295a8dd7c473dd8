"""The REST API of a capture, in TiCDC's OpenAPI v2 shape (``/api/v2/...``).

Every capture serves it. Reads come from the metastore; changes are carried
out by the coordinator: the owner handles them itself, any other capture
forwards the request to the owner's API. Errors are JSON
``{"error_code": "ErrConfigInvalid", "error_msg": "...", "code": 1001}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from typing import Any

import aiohttp
from aiohttp import web

from cdcflow.core.api.security import ApiSecurity, ForbiddenError, UnauthenticatedError
from cdcflow.core.api.statistics import add_statistics_routes
from cdcflow.core.api.status_page import add_status_routes, snapshot_progress_json
from cdcflow.core.api.tables import add_table_routes
from cdcflow.core.config.sourcecheck import check_transforms, source_issues
from cdcflow.core.control.capture import Capture
from cdcflow.core.control.changefeed import (
    ChangeFeedInfo,
    ChangefeedNotFoundError,
    ChangeFeedStatus,
    InvalidTransitionError,
)
from cdcflow.core.control.coordinator.spec import info_from_connector, section_from_request, validate_section
from cdcflow.core.control.gc.manager import overwrite_checkpoint_ts
from cdcflow.core.data.events import tso_utc_text
from cdcflow.core.errors import (
    CdcflowError,
    ConfigInvalidError,
    DuplicateChangefeedIDError,
    MetaStoreIOError,
    NotAvailableError,
)
from cdcflow.core.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from cdcflow.core.metrics import CaptureMetrics
from cdcflow.core.secrets import redact
from cdcflow.core.version import __version__

__all__ = ["MAX_BODY_DEPTH", "ApiServer", "changefeed_json", "error_response", "redact"]

log = logging.getLogger(__name__)
FORWARDED = "X-Cdcflow-Forwarded"
#: Seconds verify_config gives a source to list its tables and schemas for the transform check.
VERIFY_SOURCE_TIMEOUT = 5.0
#: How deeply a request body's arrays and objects may nest (no API field needs more than a few levels).
MAX_BODY_DEPTH = 64
#: A JSON string (possibly unterminated) or a bracket: what the nesting check looks at.
_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def error_response(exc: CdcflowError) -> web.Response:
    status = 500
    if isinstance(exc, ConfigInvalidError | InvalidTransitionError):
        status = 400
    elif isinstance(exc, DuplicateChangefeedIDError):
        status = 409
    elif isinstance(exc, ChangefeedNotFoundError):
        status = 404
    elif isinstance(exc, UnauthenticatedError):
        status = 401
    elif isinstance(exc, ForbiddenError):
        status = 403
    elif isinstance(exc, MetaStoreIOError | NotAvailableError):
        status = 503
    body: dict[str, Any] = {"error_code": exc.code_name, "error_msg": str(exc).split("\n")[0]}
    if exc.code is not None:
        body["code"] = int(exc.code)
    issues = exc.detail.get("issues")
    if issues:
        body["issues"] = issues
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return web.json_response(body, status=status, headers=headers)


def _http_error(exc: web.HTTPException) -> web.Response:
    """aiohttp's own answers (404 no such path, 405, 413 body too large) as JSON errors too."""
    name = "Err" + "".join(w.capitalize() for w in (exc.reason or "HTTPError").split())
    body = {"error_code": name, "error_msg": exc.text or exc.reason}
    return web.json_response(body, status=exc.status, headers={k: v for k, v in exc.headers.items() if k == "Allow"})


def body_depth(raw: bytes) -> int:
    """How deeply ``raw`` (JSON text) nests arrays and objects; brackets inside strings do not count."""
    depth = deepest = 0
    for match in _JSON_TOKENS.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def changefeed_json(
    info: ChangeFeedInfo, status: ChangeFeedStatus, snapshot: dict[str, Any] | None = None, now: float | None = None
) -> dict[str, Any]:
    """A changefeed's REST status; ``snapshot``: its maintainer's snapshot progress, as the
    coordinator holds it (``snapshot_progress``, see :func:`snapshot_progress_json`)."""
    return {
        "id": info.id,
        "state": info.state.value,
        "checkpoint_tso": status.checkpoint_ts,
        "checkpoint_time": tso_utc_text(status.checkpoint_ts),
        "resolved_ts": status.resolved_ts,
        "start_ts": info.start_ts,
        "epoch": info.epoch,
        "version": info.version,
        "error": info.error,
        # The checkpoint passes the start ts only once every capture delivered its snapshot.
        "snapshot_done": bool(info.initial_snapshot) and status.checkpoint_ts > info.start_ts,
        "snapshot_progress": snapshot_progress_json(snapshot, time.time() if now is None else now),
        "source": redact(info.source),
        "sinks": redact(info.sinks),
        "scheduler": info.scheduler,
        **info.options(),
    }


def _snapshot_known(info: ChangeFeedInfo) -> bool:
    """Whether the coordinator may hold an initial snapshot's progress for the changefeed."""
    return bool(info.initial_snapshot) and info.state.runs


class ApiServer:
    def __init__(self, capture: Capture, host: str, port: int, security: ApiSecurity | None = None) -> None:
        self.capture = capture
        self.host, self.port = host, port
        self.security = security or ApiSecurity.from_settings()
        self.app = web.Application(middlewares=[self._guard])
        r = self.app.router
        r.add_get("/api/v2/health", self.health)
        r.add_get("/api/v2/status", self.status)
        r.add_get("/api/v2/captures", self.captures)
        r.add_get("/api/v2/changefeeds", self.list_changefeeds)
        r.add_post("/api/v2/changefeeds", self.create)
        r.add_get("/api/v2/changefeeds/{id}", self.get_changefeed)
        r.add_put("/api/v2/changefeeds/{id}", self.update)
        r.add_delete("/api/v2/changefeeds/{id}", self.remove)
        r.add_post("/api/v2/changefeeds/{id}/pause", self.pause)
        r.add_post("/api/v2/changefeeds/{id}/resume", self.resume)
        r.add_post("/api/v2/owner/resign", self.resign)
        r.add_post("/api/v2/verify_config", self.verify_config)
        r.add_get("/metrics", self.metrics)
        add_table_routes(self)
        add_statistics_routes(self)
        self.status_history = add_status_routes(self)
        self._runner: web.AppRunner | None = None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Authenticate every request, then answer every error as JSON (a coded one when cdcflow raised it)."""
        try:
            transport = request.transport
            peercert = transport.get_extra_info("peercert") if transport is not None else None
            self.security.authenticate(request.headers, peercert)
            response: web.StreamResponse = await handler(request)
            return response
        except CdcflowError as exc:
            return error_response(exc)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _http_error(exc)

    async def start(self) -> int:
        """Listen; a non-loopback address without authentication is refused (1001) unless allowed."""
        self.security.check_bind(self.host)
        ssl_context = self.security.server_ssl_context()
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=ssl_context)
        await site.start()
        server: Any = site._server
        sockets = server.sockets if server is not None else []
        self.port = int(sockets[0].getsockname()[1]) if sockets else self.port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- reads ----------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if not self.capture.joined.is_set():
            raise NotAvailableError("the capture has no live session (joining the cluster)")
        return web.json_response({"status": "ok"})

    async def status(self, request: web.Request) -> web.Response:
        info = self.capture.info
        return web.json_response(
            {
                "version": __version__,
                "id": info.id if info else "",
                "pid": os.getpid(),
                "is_owner": self.capture.is_owner,
                "liveness": 0 if self.capture.joined.is_set() else 1,
                "metastore": self.capture.store.url,
            }
        )

    async def captures(self, request: web.Request) -> web.Response:
        owner = await self.capture.store.get_owner()
        items = [
            {
                "id": c.id,
                "is_owner": owner is not None and owner.capture_id == c.id,
                "address": c.api_addr,
                "message_address": c.advertise_addr,
                "version": c.version,
                "pid": c.pid,
            }
            for c in await self.capture.store.list_captures()
        ]
        return web.json_response({"total": len(items), "items": items})

    async def list_changefeeds(self, request: web.Request) -> web.Response:
        wanted = request.query.get("state", "")
        records = [
            (info, status)
            for info, status in await self.capture.store.list_changefeeds()
            if wanted in ("", "all") or info.state.value == wanted
        ]
        if any(_snapshot_known(info) for info, _ in records):
            forwarded = await self._read_at_owner(request)
            if forwarded is not None:
                return forwarded
        items = [changefeed_json(info, status, self.snapshot_progress(info.id)) for info, status in records]
        return web.json_response({"total": len(items), "items": items})

    async def get_changefeed(self, request: web.Request) -> web.Response:
        cf = request.match_info["id"]
        record = await self.capture.store.get_changefeed(cf)
        if record is None:
            raise ChangefeedNotFoundError(f"changefeed {cf} does not exist", detail={"changefeed_id": cf})
        if _snapshot_known(record[0]):
            forwarded = await self._read_at_owner(request)
            if forwarded is not None:
                return forwarded
        return web.json_response(changefeed_json(*record, self.snapshot_progress(cf)))

    def snapshot_progress(self, changefeed_id: str) -> dict[str, Any] | None:
        """The snapshot progress the coordinator holds for the changefeed (None on a capture
        that is not the owner, or when none is known)."""
        coordinator = self.capture.coordinator if self.capture.is_owner else None
        runtime = coordinator.controller.changefeeds.get(changefeed_id) if coordinator is not None else None
        return runtime.snapshot if runtime is not None else None

    async def _read_at_owner(self, request: web.Request) -> web.Response | None:
        """The owner's answer to a read that carries the coordinator's view (the snapshot's
        progress); None on the owner, or when no owner answers (then this capture answers
        from the metastore, without that view)."""
        if self.capture.is_owner or request.headers.get(FORWARDED):
            return None
        try:
            return await self._forward(request)
        except (NotAvailableError, aiohttp.ClientError, TimeoutError) as exc:
            log.debug("answering %s without the owner: %s", request.path, exc)
            return None

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus exposition of this capture's metrics (docs/reference/metrics.md):
        read on the event loop, rendered in a thread."""
        snapshot = await self.capture.metrics_snapshot()
        metrics = self.capture.metrics or CaptureMetrics.disabled()
        body = await asyncio.to_thread(metrics.exposition, snapshot)
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def verify_config(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        body.setdefault("changefeed_id", "verify")
        connector = validate_section(section_from_request(body), self.capture.plugins)
        # Transforms against the source's tables, when it answers (a note when it does not).
        check = await check_transforms(connector, VERIFY_SOURCE_TIMEOUT)
        issues = source_issues(connector, check, None)
        if issues:
            fields = ", ".join(i.path for i in issues)
            raise ConfigInvalidError(f"invalid changefeed configuration ({fields})", issues)
        return web.json_response({"valid": True, "notes": [check.note] if check.note else []})

    # -- changes: carried out by the owner ----------------------------------------------------

    async def _body(self, request: web.Request) -> dict[str, Any]:
        """The JSON object of the request; 400 (1001) for anything else, deep nesting included
        (checked before parsing, so no recursion limit is ever reached)."""
        if not request.can_read_body:
            return {}
        raw = await request.read()
        if not raw.strip():
            return {}
        if body_depth(raw) > MAX_BODY_DEPTH:
            raise ConfigInvalidError(
                f"the request body nests arrays and objects more than {MAX_BODY_DEPTH} levels deep; "
                "send the changefeed fields as documented"
            )
        try:
            body = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            raise ConfigInvalidError(f"the request body is not UTF-8 JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ConfigInvalidError("the request body must be a JSON object")
        return body

    async def _forward(self, request: web.Request) -> web.Response | None:
        """None when this capture is the owner; else the owner's answer."""
        if self.capture.is_owner:
            return None
        if request.headers.get(FORWARDED):
            raise NotAvailableError("this capture is no longer the owner; retry the request")
        owner = await self.capture.store.get_owner()
        captures = {c.id: c for c in await self.capture.store.list_captures()}
        if owner is None or owner.capture_id not in captures:
            raise NotAvailableError("the cluster has no owner right now; retry in a few seconds")
        url = f"{self.security.scheme}://{captures[owner.capture_id].api_addr}{request.path_qs}"
        data = await request.read()
        headers, ssl_options = self.peer_options(request)
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, url, data=data, headers={FORWARDED: "1", **headers}, **ssl_options) as resp,
        ):
            return web.Response(body=await resp.read(), status=resp.status, content_type="application/json")

    def peer_options(self, request: web.Request) -> tuple[dict[str, str], dict[str, Any]]:
        """Headers and TLS options of a request passed on to another capture: the caller's
        token, and this capture's certificate as the client's (its CN must be allowed)."""
        headers = {"Content-Type": "application/json"}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        context = self.security.forward_ssl_context()
        return headers, ({"ssl": context} if context is not None else {})

    def _coordinator(self) -> Any:
        coordinator = self.capture.coordinator
        if coordinator is None:
            raise NotAvailableError("this capture stopped being the owner; retry the request")
        return coordinator

    async def create(self, request: web.Request) -> web.Response:
        forwarded = await self._forward(request)
        if forwarded is not None:
            return forwarded
        body = await self._body(request)
        section = section_from_request(body)
        connector = validate_section(section, self.capture.plugins)
        self.security.check_sinks(list(connector.sinks), section["sinks"])
        info = await self._coordinator().create(info_from_connector(connector, section))
        record = await self.capture.store.get_changefeed(info.id)
        assert record is not None
        return web.json_response(changefeed_json(*record), status=201)

    async def update(self, request: web.Request) -> web.Response:
        forwarded = await self._forward(request)
        if forwarded is not None:
            return forwarded
        cf = request.match_info["id"]
        record = await self.capture.store.get_changefeed(cf)
        if record is None:
            raise ChangefeedNotFoundError(f"changefeed {cf} does not exist", detail={"changefeed_id": cf})
        old = record[0]
        body = await self._body(request)
        merged = {
            "changefeed_id": cf,
            "source": old.source,
            "sinks": old.sinks,
            "scheduler": old.scheduler,
            "start_ts": old.start_ts,
            **old.options(),
            **body,
        }
        section = section_from_request(merged)
        connector = validate_section(section, self.capture.plugins)
        self.security.check_sinks(list(connector.sinks), section["sinks"])
        new = info_from_connector(connector, section).with_changes(created_at=old.created_at, start_ts=old.start_ts)
        await self._coordinator().update(new)
        record = await self.capture.store.get_changefeed(cf)
        assert record is not None
        return web.json_response(changefeed_json(*record))

    async def remove(self, request: web.Request) -> web.Response:
        forwarded = await self._forward(request)
        if forwarded is not None:
            return forwarded
        await self._coordinator().remove(request.match_info["id"])
        return web.json_response({})

    async def pause(self, request: web.Request) -> web.Response:
        forwarded = await self._forward(request)
        if forwarded is not None:
            return forwarded
        await self._coordinator().pause(request.match_info["id"])
        return web.json_response({})

    async def resume(self, request: web.Request) -> web.Response:
        forwarded = await self._forward(request)
        if forwarded is not None:
            return forwarded
        body = await self._body(request)
        cf = request.match_info["id"]
        overwrite = body.get("overwrite_checkpoint_ts")
        # a TSO the upstream can serve, else 1001 and nothing changed (the coordinator checks the upstream)
        await self._coordinator().resume(cf, None if overwrite is None else overwrite_checkpoint_ts(cf, overwrite))
        return web.json_response({})

    async def resign(self, request: web.Request) -> web.Response:
        forwarded = await self._forward(request)
        if forwarded is not None:
            return forwarded
        await self.capture.resign()
        return web.json_response({})
