"""``GET /api/v2/changefeeds/{id}/statistics``: one changefeed's progress and throughput counters.

What ``cdcflow cli changefeed statistics`` shows (TiCDC's ``cdc cli changefeed
statistics``). The persisted checkpoint and resolved ts come from the metastore;
the counters (rows and bytes read and written, micro-batches, event store memory)
from each capture that runs spans of the changefeed: the capture asked gathers
its own and asks every other capture for theirs (``?local=true``). Counters are
totals since each capture's executor started; the CLI turns two answers into
rates.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from cdcflow.core.control.changefeed import ChangefeedNotFoundError
from cdcflow.core.data.events import tso_physical_ms

if TYPE_CHECKING:
    from cdcflow.core.api.server import ApiServer
    from cdcflow.core.metrics import ExecutorStats

__all__ = ["add_statistics_routes", "local_statistics"]

#: Seconds to wait for another capture's part.
_PEER_TIMEOUT = 5.0


def local_statistics(server: ApiServer, changefeed_id: str) -> dict[str, Any] | None:
    """This capture's part of ``changefeed_id`` (None: it runs none of its spans)."""
    capture = server.capture
    host = capture.manager.host if capture.manager is not None else None
    run = host.runs.get(changefeed_id) if host is not None else None
    stats = run.executor.stats() if run is not None else None
    recorder = capture.metrics.recorder(changefeed_id) if capture.metrics is not None else None
    if stats is None and recorder is None:
        return None
    written = recorder.written if recorder is not None else {}
    sinks = {name: {"rows": rows, "bytes": nbytes} for name, (rows, nbytes) in written.items()}
    part: dict[str, Any] = {
        "capture_id": capture.info.id if capture.info is not None else "",
        "metrics": recorder is not None,
        "sinks": sinks,
        "rows_written": max((s["rows"] for s in sinks.values()), default=0),
        "bytes_written": max((s["bytes"] for s in sinks.values()), default=0),
        "batches": recorder.batches if recorder is not None else 0,
    }
    if stats is not None:
        part.update(
            checkpoint_ts=stats.checkpoint_ts,
            resolved_ts=stats.resolved_ts,
            spans=dict(stats.spans_by_state),
            rows_read=stats.rows_read,
            bytes_read=stats.bytes_read,
            event_store_memory_bytes=stats.memory_bytes,
            event_store_spilled_bytes=stats.spilled_bytes,
            chunks_pending=stats.chunks_pending,
            regions=stats.feed.regions if stats.feed is not None else None,
        )
    part["stages"] = _stages(server, changefeed_id, stats)
    return part


def _stages(server: ApiServer, changefeed_id: str, stats: ExecutorStats | None) -> dict[str, int | None]:
    """Where a change is on its way through this capture, as the ts each stage reached
    (None: the stage does not run here). In order: the source's resolved ts (lowest
    over replicating spans), the event store's published ts, the end of the newest
    micro-batch Spark began, the ts every sink flushed (the spans' checkpoint here),
    the maintainer's changefeed checkpoint, the coordinator's (before its metastore
    write; the persisted one is the answer's ``checkpoint_tso``)."""
    capture = server.capture
    maintainer = capture.manager.maintainers.get(changefeed_id) if capture.manager is not None else None
    coordinator = capture.coordinator
    runtime = coordinator.controller.changefeeds.get(changefeed_id) if coordinator is not None else None
    return {
        "source_resolved_ts": stats.source_resolved_ts if stats is not None else None,
        "published_ts": stats.resolved_ts if stats is not None else None,
        "batch_end_ts": stats.batch_end_ts if stats is not None else None,
        "flushed_ts": stats.checkpoint_ts if stats is not None else None,
        "maintainer_checkpoint_ts": maintainer.checkpoint_ts if maintainer is not None else None,
        "coordinator_checkpoint_ts": runtime.status.checkpoint_ts if runtime is not None else None,
    }


def _lag(now: float, ts: int) -> float:
    return round(max(0.0, now - tso_physical_ms(ts) / 1000), 3)


def add_statistics_routes(server: ApiServer) -> None:
    """Register the statistics route on ``server``'s router."""

    async def statistics(request: web.Request) -> web.Response:
        cf = request.match_info["id"]
        record = await server.capture.store.get_changefeed(cf)
        if record is None:
            raise ChangefeedNotFoundError(f"changefeed {cf} does not exist", detail={"changefeed_id": cf})
        info, status = record
        local = local_statistics(server, cf)
        if request.query.get("local") in ("1", "true"):
            return web.json_response({"captures": [local] if local is not None else []})
        parts = [local] if local is not None else []
        me = server.capture.info.id if server.capture.info is not None else ""
        for peer in await server.capture.store.list_captures():
            if peer.id != me:
                parts.extend(await _peer_parts(server, request, peer.api_addr, cf))
        now = time.time()
        body = {
            "id": cf,
            "state": info.state.value,
            "time": now,
            "checkpoint_tso": status.checkpoint_ts,
            "resolved_ts": status.resolved_ts,
            "checkpoint_lag_seconds": _lag(now, status.checkpoint_ts),
            "resolved_lag_seconds": _lag(now, status.resolved_ts),
            "rows_read": sum(p.get("rows_read", 0) for p in parts),
            "bytes_read": sum(p.get("bytes_read", 0) for p in parts),
            "rows_written": sum(p["rows_written"] for p in parts),
            "bytes_written": sum(p["bytes_written"] for p in parts),
            "batches": sum(p["batches"] for p in parts),
            "captures": parts,
        }
        return web.json_response(body)

    server.app.router.add_get("/api/v2/changefeeds/{id}/statistics", statistics)


async def _peer_parts(server: ApiServer, request: web.Request, address: str, cf: str) -> list[dict[str, Any]]:
    """Another capture's part (none when it cannot be reached: its counters are then missing)."""
    headers, ssl_options = server.peer_options(request)
    url = f"{server.security.scheme}://{address}{request.path}?local=true"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_PEER_TIMEOUT)) as session,
            session.get(url, headers=headers, **ssl_options) as resp,
        ):
            if resp.status != 200:
                return []
            parts: list[dict[str, Any]] = (await resp.json()).get("captures", [])
            return parts
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []
