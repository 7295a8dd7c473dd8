"""Table scheduling through the REST API: move-table and per-span status.

A changefeed's scheduler lives in its maintainer, on whichever capture hosts
it. Any capture accepts these requests: it answers itself when it hosts the
maintainer; otherwise it asks the other captures' APIs with
``X-Cdcflow-Maintainer-Local: 1`` (answer only if the maintainer is here, else
404) and returns the first answer that is not a 404.

* ``POST /api/v2/changefeeds/{id}/move_table`` with
  ``{"table_id": T, "target_capture_id": C}``: queue a move of every span of
  table T to capture C (``Scheduler.move_table``); answers the spans that will
  move. 400 for an unknown table or capture; 503 for a scheduler that cannot
  move (``round-robin``).
* ``GET /api/v2/changefeeds/{id}/tables``: every span's scheduling status
  (``Scheduler.replication_status``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from cdcflow.core.control.changefeed import ChangefeedNotFoundError
from cdcflow.core.errors import ConfigInvalidError

if TYPE_CHECKING:
    from cdcflow.core.api.server import ApiServer
    from cdcflow.core.control.maintainer.maintainer import Maintainer

__all__ = ["LOCAL_ONLY", "add_table_routes"]

LOCAL_ONLY = "X-Cdcflow-Maintainer-Local"


def add_table_routes(server: ApiServer) -> None:
    """Register the table-scheduling routes on ``server``'s router."""

    async def move_table(request: web.Request) -> web.Response:
        body = await server._body(request)
        table_id, target = _move_args(body)

        def act(m: Maintainer) -> dict[str, Any]:
            spans = m.move_table(table_id, target)
            moving = [{"table_id": s.table_id, "start": s.start.hex(), "end": s.end.hex()} for s in spans]
            return {
                "changefeed_id": m.changefeed_id,
                "table_id": table_id,
                "target_capture_id": target,
                "spans": moving,
            }

        return await _at_maintainer(server, request, act)

    async def tables(request: web.Request) -> web.Response:
        def act(m: Maintainer) -> dict[str, Any]:
            items = [r.to_dict() for r in m.replication_status()]
            return {"changefeed_id": m.changefeed_id, "total": len(items), "items": items}

        return await _at_maintainer(server, request, act)

    server.app.router.add_post("/api/v2/changefeeds/{id}/move_table", move_table)
    server.app.router.add_get("/api/v2/changefeeds/{id}/tables", tables)


def _move_args(body: dict[str, Any]) -> tuple[int, str]:
    table_id, target = body.get("table_id"), body.get("target_capture_id")
    if not isinstance(table_id, int) or isinstance(table_id, bool) or not isinstance(target, str) or not target:
        raise ConfigInvalidError(
            'move_table needs {"table_id": <integer>, "target_capture_id": "<capture id>"}',
            detail={"body": body},
        )
    return table_id, target


async def _at_maintainer(
    server: ApiServer, request: web.Request, act: Callable[[Maintainer], dict[str, Any]]
) -> web.Response:
    cf = request.match_info["id"]
    manager = server.capture.manager
    maintainer = manager.maintainers.get(cf) if manager is not None else None
    if maintainer is not None:
        return web.json_response(act(maintainer))
    missing = ChangefeedNotFoundError(
        f"changefeed {cf} has no running maintainer; check that it exists and is running",
        detail={"changefeed_id": cf},
    )
    if request.headers.get(LOCAL_ONLY):
        raise missing
    me = server.capture.info.id if server.capture.info is not None else None
    data = await request.read()
    async with aiohttp.ClientSession() as session:
        for capture in await server.capture.store.list_captures():
            if capture.id == me:
                continue
            url = f"{server.security.scheme}://{capture.api_addr}{request.path_qs}"
            headers, ssl_options = server.peer_options(request)
            headers[LOCAL_ONLY] = "1"
            try:
                async with session.request(request.method, url, data=data, headers=headers, **ssl_options) as resp:
                    if resp.status != 404:
                        return web.Response(body=await resp.read(), status=resp.status, content_type="application/json")
            except aiohttp.ClientError:
                continue  # a capture going away; another may host the maintainer
    raise missing
