"""TiDB's status-port HTTP API as the playground serves it (aiohttp).

Routes and shapes follow a real TiDB (docs: reference/tidb-status-api.md):
``/status``, ``/schema`` (array of DBInfo; ``?table_id=`` one TableInfo),
``/schema/{db}`` (array of TableInfo), ``/schema/{db}/{table}``,
``/db-table/{id}``, ``/ddl/history`` (``limit``, ``start_job_id``; newest
first). Success is 200 with pretty-printed JSON (one-space indent); every
handler failure is 400 with TiDB's plain-text error; unknown paths are 404.
Names match case-insensitively. Schemas are served as of now.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from cdcflow.plugins.sources.playground.catalog import Catalog

__all__ = ["build_app"]

MAX_HISTORY = 2048


def _json(data: Any) -> web.Response:
    # Exactly TiDB's content type (aiohttp would append a charset).
    return web.Response(body=json.dumps(data, indent=1).encode(), headers={"Content-Type": "application/json"})


def _error(text: str) -> web.Response:
    return web.Response(status=400, body=text.encode(), headers={"Content-Type": "text/plain"})


def _parse_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def build_app(catalog: Catalog) -> web.Application:
    """The aiohttp application serving ``catalog``."""

    async def status(request: web.Request) -> web.Response:
        return _json(
            {"connections": 0, "version": "8.0.11-TiDB-v8.5.0-cdcflow-playground", "git_hash": "", "status": {}}
        )

    async def schemas(request: web.Request) -> web.Response:
        if "table_id" in request.query:
            raw = request.query["table_id"]
            table_id = _parse_int(raw)
            if table_id is None:
                return _error(f'strconv.ParseInt: parsing "{raw}": invalid syntax')
            table = catalog.version_at(table_id) if table_id >= 0 else None
            if table is None:
                return _error(f"[schema:1146]Table which ID = {table_id} does not exist.")
            return _json(catalog.table_json(table))
        with catalog.lock:
            return _json([catalog.db_json(db) for db in catalog.databases.values()])

    async def db_tables(request: web.Request) -> web.Response:
        name = request.match_info["db"].lower()
        db = next((d for d in catalog.databases.values() if d.name.lower() == name), None)
        if db is None:
            return _error(f"[schema:1049]Unknown database '{request.match_info['db']}'")
        return _json([catalog.table_json(t) for t in sorted(catalog.tables(db.name), key=lambda t: t.id)])

    async def one_table(request: web.Request) -> web.Response:
        db_name, table_name = request.match_info["db"], request.match_info["table"]
        db = next((d for d in catalog.databases.values() if d.name.lower() == db_name.lower()), None)
        table = None
        if db is not None:
            table = next((t for t in catalog.tables(db.name) if t.name.lower() == table_name.lower()), None)
        if table is None:
            return _error(f"[schema:1146]Table '{db_name}.{table_name}' doesn't exist")
        return _json(catalog.table_json(table))

    async def db_table(request: web.Request) -> web.Response:
        raw = request.match_info["table_id"]
        table_id = _parse_int(raw)
        if table_id is None:
            return _error(f"Wrong tableID: {raw}")
        table = catalog.version_at(table_id)
        if table is None:
            return _error(f"[schema:1146]Table which ID = {table_id} does not exist.")
        return _json(
            {
                "db_info": catalog.db_json(catalog.db_of(table_id)),
                "table_info": catalog.table_json(table),
                "schema_version": catalog.schema_version,
            }
        )

    async def ddl_history(request: web.Request) -> web.Response:
        limit, start = MAX_HISTORY, None
        if "start_job_id" in request.query:
            start = _parse_int(request.query["start_job_id"])
            if start is None or start < 1:
                return _error("ddl history start_job_id must be greater than 0")
            if "limit" not in request.query:
                return _error("when 'start_job_id' is specified, it must work with a 'limit'")
        if "limit" in request.query:
            parsed = _parse_int(request.query["limit"])
            if parsed is None or not 0 < parsed <= MAX_HISTORY:
                return _error(f"ddl history limit must be greater than 0 and less than or equal to {MAX_HISTORY}")
            limit = parsed
        return _json(catalog.history_json(limit, start))

    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_get("/schema", schemas)
    app.router.add_get("/schema/{db}", db_tables)
    app.router.add_get("/schema/{db}/{table}", one_table)
    app.router.add_get("/db-table/{table_id}", db_table)
    app.router.add_get("/ddl/history", ddl_history)
    return app
