"""The status page: a small HTML page at ``/`` of every capture's REST API.

It shows the changefeeds (state, checkpoint, lags, rows/s, last error, and the
initial snapshot's progress bar while one runs: the coordinator's view, see
:func:`snapshot_progress_json`), the
captures and the spans each one runs, and a chart of checkpoint lag and
throughput over the last hour. The page is three static files shipped inside
the package (``core/api/status/``: HTML, JavaScript, CSS; no build step, no
CDN) that poll one JSON document, ``GET /api/v2/status/overview``.

* **History on the owner.** Every :data:`SAMPLE_INTERVAL` seconds the owner
  records, per changefeed, the checkpoint and resolved lags of the persisted
  status and the rows flushed downstream per second, in a ring bounded to
  :data:`HISTORY_SECONDS` (memory only: a new owner starts a new history).
  Any other capture forwards the overview request to the owner.
* **Rows** are counted on each capture from the ``cdcflow_batch_flushed`` hook
  (every sink flushed the batch); the owner adds up the counters of every
  capture (``GET /api/v2/status/local``, which also lists the spans of the
  maintainers that capture hosts).
* **Authentication** is the API's own (:mod:`cdcflow.core.api.security`): with
  client certificates the browser presents one; with a bearer token, which a
  browser cannot send when it opens a page, ``/login`` takes the token in a
  form and sets an HttpOnly, SameSite=Strict session cookie holding an HMAC of
  the token (never the token). The cookie is accepted for GET and HEAD
  requests only: a browser session can look, and every change still needs the
  bearer token (``cdcflow cli``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import html
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from cdcflow.core.data.events import tso_physical_ms, tso_utc_text, utc_text
from cdcflow.core.errors import CdcflowError
from cdcflow.core.plugin.hookspec import hookimpl
from cdcflow.core.version import __version__

if TYPE_CHECKING:
    from cdcflow.core.api.security import ApiSecurity
    from cdcflow.core.api.server import ApiServer
    from cdcflow.core.control.capture import Capture

__all__ = [
    "ASSETS",
    "HISTORY_SECONDS",
    "SAMPLE_INTERVAL",
    "SESSION_COOKIE",
    "FlushCounter",
    "StatusHistory",
    "add_status_routes",
    "session_value",
    "snapshot_progress_json",
]

log = logging.getLogger(__name__)

#: Seconds between two samples of the owner's history.
SAMPLE_INTERVAL = 5.0
#: Seconds of history the owner keeps (the chart's width).
HISTORY_SECONDS = 3600.0
#: The cookie a browser session carries after ``/login``.
SESSION_COOKIE = "cdcflow_session"
#: The page's static files (package data under ``core/api/status/``) and their content types.
ASSETS = {
    "index.html": "text/html",
    "login.html": "text/html",
    "status.js": "application/javascript",
    "status.css": "text/css",
}
#: Seconds the owner waits for another capture's counters before leaving them out of a sample.
PEER_TIMEOUT = 2.0
#: Headers of every page and asset: nothing from elsewhere, no framing, no caching.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}


def asset(name: str) -> str:
    """The text of one of the page's files, from the installed package."""
    return resources.files("cdcflow.core.api.status").joinpath(name).read_text(encoding="utf-8")


def session_value(token: str) -> str:
    """The session cookie's value for ``token``: an HMAC of it, so the cookie is not the token
    (it cannot be replayed as a bearer token) and changing the token ends every session."""
    return hmac.new(token.encode(), b"cdcflow status page session", hashlib.sha256).hexdigest()


def lag_seconds(ts: int, now: float) -> float:
    """Seconds from the TSO ``ts``'s physical time to ``now`` (0 for ts 0 or a ts ahead of the clock)."""
    return max(0.0, now - tso_physical_ms(ts) / 1000) if ts else 0.0


class FlushCounter:
    """A plugin counting, per changefeed, the rows and batches every sink of this capture flushed
    (``cdcflow_batch_flushed``, called from the pipeline's threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, int] = defaultdict(int)
        self._batches: dict[str, int] = defaultdict(int)

    @hookimpl
    def cdcflow_batch_flushed(self, changefeed_id: str, batch_id: int, checkpoint_ts: int, row_count: int) -> None:
        with self._lock:
            self._rows[changefeed_id] += row_count
            self._batches[changefeed_id] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {cf: {"rows": rows, "batches": self._batches[cf]} for cf, rows in self._rows.items()}


@dataclass
class StatusHistory:
    """The owner's ring of samples; see the module docstring."""

    capture: Capture
    security: ApiSecurity
    counter: FlushCounter
    interval: float = SAMPLE_INTERVAL
    horizon: float = HISTORY_SECONDS
    samples: deque[dict[str, Any]] = field(init=False)
    _previous: tuple[float, dict[str, int]] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.samples = deque(maxlen=max(1, int(self.horizon / self.interval)) + 1)

    async def sample(self, now: float | None = None) -> dict[str, Any] | None:
        """Record one sample when this capture is the owner (a capture that is not forgets its history)."""
        if not self.capture.is_owner:
            self.samples.clear()
            self._previous = None
            return None
        now = time.time() if now is None else now
        rows = {cf: v["rows"] for cf, v in (await self.cluster_counters()).items()}
        since, before = self._previous if self._previous is not None else (now, rows)
        elapsed = now - since
        feeds: dict[str, dict[str, Any]] = {}
        for info, status in await self.capture.store.list_changefeeds():
            moved = max(0, rows.get(info.id, 0) - before.get(info.id, rows.get(info.id, 0)))
            feeds[info.id] = {
                "state": info.state.value,
                "checkpoint_lag": round(lag_seconds(status.checkpoint_ts, now), 3),
                "resolved_lag": round(lag_seconds(status.resolved_ts, now), 3),
                "rows_per_second": round(moved / elapsed, 3) if elapsed > 0 else 0.0,
            }
        self._previous = (now, rows)
        sample = {"t": round(now, 3), "changefeeds": feeds}
        self.samples.append(sample)
        return sample

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled; a failed sample is logged and skipped."""
        while True:
            try:
                await self.sample()
            except Exception as exc:  # logged: the page's history must not stop with one bad sample
                traceback = not isinstance(exc, CdcflowError)
                log.warning("status page: skipped a history sample: %s", exc, exc_info=traceback)
            await asyncio.sleep(self.interval)

    def local(self) -> dict[str, Any]:
        """This capture's own part: its flushed-row counters and the spans of the maintainers it hosts."""
        spans: dict[str, list[dict[str, Any]]] = {}
        manager = self.capture.manager
        for cf, maintainer in list(manager.maintainers.items()) if manager is not None else []:
            with contextlib.suppress(CdcflowError):  # still listing its spans
                spans[cf] = [r.to_dict() for r in maintainer.replication_status()]
        info = self.capture.info
        return {"capture_id": info.id if info else "", "flushed": self.counter.snapshot(), "spans": spans}

    async def cluster_parts(self) -> list[dict[str, Any]]:
        """:meth:`local` of every live capture; one that does not answer in time is left out."""
        me = self.capture.info.id if self.capture.info is not None else None
        parts = [self.local()]
        others = [c for c in await self.capture.store.list_captures() if c.id != me]
        if not others:
            return parts
        headers = {"Authorization": f"Bearer {self.security.token}"} if self.security.token else {}
        context = self.security.forward_ssl_context()
        options: dict[str, Any] = {"ssl": context} if context is not None else {}
        timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def fetch(address: str) -> dict[str, Any] | None:
                url = f"{self.security.scheme}://{address}/api/v2/status/local"
                try:
                    async with session.get(url, headers=headers, **options) as resp:
                        if resp.status != 200:
                            return None
                        part: dict[str, Any] = await resp.json()
                        return part
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    return None  # a capture going away, or one with another token

            answers = await asyncio.gather(*(fetch(c.api_addr) for c in others))
        return parts + [a for a in answers if a is not None]

    async def cluster_counters(self) -> dict[str, dict[str, int]]:
        """Rows and batches flushed per changefeed, added up over every capture."""
        return _add_up(await self.cluster_parts())

    def _snapshot(self, changefeed_id: str) -> dict[str, Any] | None:
        """The coordinator's snapshot progress of the changefeed (the overview is the owner's)."""
        coordinator = self.capture.coordinator
        runtime = coordinator.controller.changefeeds.get(changefeed_id) if coordinator is not None else None
        return runtime.snapshot if runtime is not None else None

    async def overview(self) -> dict[str, Any]:
        """The page's document: changefeeds, captures with their spans, and the history."""
        now = time.time()
        parts = await self.cluster_parts()
        spans_by_capture: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for part in parts:
            for cf, items in part.get("spans", {}).items():
                for item in items:
                    for role in ("primary", "secondary"):
                        if item.get(role):
                            spans_by_capture[item[role]].append(
                                {
                                    "changefeed_id": cf,
                                    "role": role,
                                    **{k: item[k] for k in ("table_id", "start", "end", "state", "checkpoint_ts")},
                                }
                            )
        flushed = _add_up(parts)
        owner = await self.capture.store.get_owner()
        captures = [
            {
                "id": c.id,
                "is_owner": owner is not None and owner.capture_id == c.id,
                "address": c.api_addr,
                "version": c.version,
                "spans": sorted(spans_by_capture.get(c.id, []), key=lambda s: (s["changefeed_id"], s["table_id"])),
            }
            for c in await self.capture.store.list_captures()
        ]
        latest = self.samples[-1]["changefeeds"] if self.samples else {}
        changefeeds = []
        for info, status in await self.capture.store.list_changefeeds():
            changefeeds.append(
                {
                    "id": info.id,
                    "state": info.state.value,
                    "checkpoint_tso": status.checkpoint_ts,
                    "checkpoint_time": tso_utc_text(status.checkpoint_ts),
                    "checkpoint_lag": round(lag_seconds(status.checkpoint_ts, now), 3),
                    "resolved_lag": round(lag_seconds(status.resolved_ts, now), 3),
                    "rows_per_second": latest.get(info.id, {}).get("rows_per_second", 0.0),
                    "rows_flushed": flushed.get(info.id, {}).get("rows", 0),
                    "error": info.error,
                    "initial_snapshot": bool(info.initial_snapshot),
                    "snapshot_done": bool(info.initial_snapshot) and status.checkpoint_ts > info.start_ts,
                    "snapshot_progress": snapshot_progress_json(self._snapshot(info.id), now),
                }
            )
        me = self.capture.info
        return {
            "version": __version__,
            "now": round(now, 3),
            "served_by": me.id if me else "",
            "owner": owner.capture_id if owner is not None else None,
            "changefeeds": changefeeds,
            "captures": captures,
            "history": {
                "interval_seconds": self.interval,
                "horizon_seconds": self.horizon,
                "samples": list(self.samples),
            },
        }


def snapshot_progress_json(raw: dict[str, Any] | None, now: float) -> dict[str, Any] | None:
    """The REST form of a changefeed's snapshot progress (``MaintainerStatus.snapshot``):
    the counts, ``started`` (UTC), and, from the time since it started, the rows per
    second and the ETA (seconds; None before any part is read, 0 once done)."""
    if raw is None:
        return None
    started = float(raw.get("started_at") or now)
    finished = raw.get("finished_at")
    elapsed = max(0.0, (float(finished) if finished is not None else now) - started)
    fraction = float(raw.get("fraction", 0.0))
    if raw.get("phase") == "done":
        eta: float | None = 0.0
    elif 0 < fraction < 1:
        eta = round(elapsed / fraction * (1 - fraction), 1)
    else:
        eta = None
    rows = int(raw.get("rows_done", 0))
    return {
        "unit": raw.get("unit", "range"),
        "phase": raw.get("phase", "read"),
        "parts_done": int(raw.get("parts_done", 0)),
        "parts_total": int(raw.get("parts_total", 0)),
        "rows_done": rows,
        "rows_estimate": int(raw.get("rows_estimate", 0)),
        "captures": int(raw.get("captures", 0)),
        "started": utc_text(started),
        "elapsed_seconds": round(elapsed, 1),
        "rows_per_second": round(rows / elapsed, 1) if elapsed > 0 else 0.0,
        "eta_seconds": eta,
    }


def _add_up(parts: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Rows and batches flushed per changefeed, over the captures' parts."""
    total: dict[str, dict[str, int]] = defaultdict(lambda: {"rows": 0, "batches": 0})
    for part in parts:
        for cf, counts in part.get("flushed", {}).items():
            total[cf]["rows"] += int(counts.get("rows", 0))
            total[cf]["batches"] += int(counts.get("batches", 0))
    return dict(total)


def _page(name: str, status: int = 200, replace: dict[str, str] | None = None) -> web.Response:
    text = asset(name)
    for key, value in (replace or {}).items():
        text = text.replace(key, value)
    return web.Response(text=text, status=status, content_type=ASSETS[name], charset="utf-8", headers=_PAGE_HEADERS)


def _login_page(status: int, message: str = "") -> web.Response:
    shown = f'<p class="error" id="login-error">{html.escape(message)}</p>' if message else ""
    return _page("login.html", status, {"<!--MESSAGE-->": shown})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _session_middleware(security: ApiSecurity) -> Any:
    """Outside the API's guard: ``/login`` and ``/logout``, and a valid session cookie turned
    into the bearer token for GET and HEAD requests (see the module docstring)."""

    @web.middleware
    async def browser_session(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in ("/login", "/logout"):
            return await _login(request, security)
        if (
            security.token
            and request.method in ("GET", "HEAD")
            and "Authorization" not in request.headers
            and hmac.compare_digest(request.cookies.get(SESSION_COOKIE, ""), session_value(security.token))
        ):
            headers = CIMultiDict(request.headers)
            headers["Authorization"] = f"Bearer {security.token}"
            request = request.clone(headers=headers)
        response = await handler(request)
        if request.path == "/" and response.status == 401 and security.token:
            return _login_page(401)  # a browser without a session: the form, not a JSON error
        return response

    return browser_session


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


async def _login(request: web.Request, security: ApiSecurity) -> web.StreamResponse:
    if request.path == "/logout" or not security.token:
        response = _see_other("/login" if security.token else "/")
        response.del_cookie(SESSION_COOKIE, path="/")
        return response
    if request.method != "POST":
        return _login_page(200)
    form = await request.post()
    given = str(form.get("token", "")).strip()
    if not given or not hmac.compare_digest(given.encode(), security.token.encode()):
        return _login_page(401, "That token is not valid.")
    response = _see_other("/")
    response.set_cookie(
        SESSION_COOKIE,
        session_value(security.token),
        path="/",
        httponly=True,
        samesite="Strict",
        secure=security.settings.tls,
    )
    return response


def add_status_routes(server: ApiServer) -> StatusHistory:
    """Register the page, its files and its JSON on ``server``; the owner's sampler runs while it serves."""
    counter = FlushCounter()
    server.capture.plugins.register(counter, name=f"cdcflow-status-page-{id(server)}")
    history = StatusHistory(server.capture, server.security, counter)

    async def index(request: web.Request) -> web.Response:
        return _page("index.html")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in ASSETS or name.endswith(".html"):
            raise web.HTTPNotFound(text=f"no status page file {name}")
        return _page(name)

    async def overview(request: web.Request) -> web.Response:
        forwarded = await server._forward(request)  # the history lives on the owner
        if forwarded is not None:
            return forwarded
        return web.json_response(await history.overview())

    async def local(request: web.Request) -> web.Response:
        return web.json_response(history.local())

    router = server.app.router
    router.add_get("/", index)
    router.add_get("/status/{name}", static)
    router.add_get("/api/v2/status/overview", overview)
    router.add_get("/api/v2/status/local", local)
    router.add_route("*", "/login", index)  # answered by the session middleware
    router.add_route("*", "/logout", index)
    server.app.middlewares.insert(0, _session_middleware(server.security))

    async def start_sampling(app: web.Application) -> None:
        app[_SAMPLER] = asyncio.create_task(history.run(), name="status-page-history")

    async def stop_sampling(app: web.Application) -> None:
        task = app[_SAMPLER]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    server.app.on_startup.append(start_sampling)
    server.app.on_cleanup.append(stop_sampling)
    return history


_SAMPLER = web.AppKey("status_page_sampler", asyncio.Task[None])
