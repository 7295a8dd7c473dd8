"""Client of TiDB's status-port HTTP API (table schemas and DDL history).

Endpoints used (all ``GET``, JSON bodies on 200):

``/schema``                     every DBInfo
``/schema/{db}``                every TableInfo of a database
``/schema/{db}/{table}``        one TableInfo
``/schema?table_id={id}``       the (logical) TableInfo owning a table or partition id
``/db-table/{id}``              ``{db_info, table_info, schema_version}`` for an id
``/ddl/history``                jobs, newest first; ``limit`` 1…2048, ``start_job_id`` (with ``limit``)

TiDB answers a missing database or table with **HTTP 400** and a plain-text
body such as ``[schema:1146]Table 'test.t4' doesn't exist`` (1049: unknown
database); the client turns those into None / :class:`TiDBObjectNotFoundError`.
Any other failure — connection refused, timeout, 5xx, a 400 without a
schema code — raises :class:`StatusAPIUnavailableError` (retryable); callers
back off and retry. Large ids and TSOs are parsed as exact Python ints.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from cdcflow.core.errors import CdcflowError, PDUnavailableError
from cdcflow.plugins.sources.tikv.tidb.ddl_job import DDLJob
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBDatabase, TiDBTable

__all__ = ["MAX_HISTORY_PAGE", "StatusAPIClient", "StatusAPIUnavailableError", "TiDBObjectNotFoundError"]

MAX_HISTORY_PAGE = 2048
_NOT_FOUND_CODES = ("[schema:1146]", "[schema:1049]")


def _seg(name: str) -> str:
    """A database or table name as one URL path segment."""
    return quote(name, safe="")


class StatusAPIUnavailableError(PDUnavailableError):
    """The TiDB status API cannot be reached or answered with an error."""


class TiDBObjectNotFoundError(CdcflowError):
    """A database or table the request named does not exist in TiDB."""


class _Transient(Exception):
    """Wraps an error worth retrying."""

    def __init__(self, error: StatusAPIUnavailableError) -> None:
        super().__init__(str(error))
        self.error = error


class StatusAPIClient:
    """Asyncio client of one TiDB status address (``host:port`` or a URL)."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        attempts: int = 3,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.attempts = max(1, attempts)
        self.base_url = address.rstrip("/") if "://" in address else f"http://{address.rstrip('/')}"
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> StatusAPIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
            self._owns_session = True
        return self._session

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """The JSON of ``GET path``; None when TiDB says the object does not exist.

        Unreachable servers and 5xx answers are retried ``attempts`` times with
        exponential backoff (0.1 s, 0.2 s, … at most 2 s) before the error is raised.
        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            retry=retry_if_exception_type(_Transient),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._get_once(path, params)
        except _Transient as e:
            raise e.error from e.__cause__
        raise AssertionError("unreachable")  # pragma: no cover - AsyncRetrying always runs once

    async def _get_once(self, path: str, params: Mapping[str, str] | None) -> Any:
        url = self.base_url + path
        try:
            async with self._client().get(url, params=params) as resp:
                body = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as e:
            raise _Transient(
                StatusAPIUnavailableError(
                    f"TiDB status API {self.base_url} unreachable: {e!r}; check tidb-status and that TiDB is up",
                    detail={"url": url, "attempts": self.attempts},
                )
            ) from e
        if status == 200:
            return json.loads(body)
        if status == 400 and body.startswith(_NOT_FOUND_CODES):
            return None
        error = StatusAPIUnavailableError(
            f"TiDB status API answered {status} for {path}: {body.strip()[:200]}",
            detail={"url": url, "status": status},
        )
        if status >= 500:
            raise _Transient(error)
        raise error

    # ------------------------------------------------------------------ schemas

    async def databases(self) -> list[TiDBDatabase]:
        data = await self._get("/schema")
        return [TiDBDatabase.from_json(d) for d in data or ()]

    async def tables(self, db: str) -> list[TiDBTable]:
        data = await self._get(f"/schema/{_seg(db)}")
        if data is None:
            raise TiDBObjectNotFoundError(f"database {db!r} does not exist in TiDB", detail={"db": db})
        return [TiDBTable.from_json(t) for t in data]

    async def table(self, db: str, table: str) -> TiDBTable | None:
        data = await self._get(f"/schema/{_seg(db)}/{_seg(table)}")
        return TiDBTable.from_json(data) if data is not None else None

    async def table_by_id(self, table_id: int) -> TiDBTable | None:
        """The logical table owning ``table_id`` (a table or partition id)."""
        data = await self._get("/schema", {"table_id": str(table_id)})
        return TiDBTable.from_json(data) if data is not None else None

    async def db_table(self, table_id: int) -> tuple[TiDBDatabase, TiDBTable] | None:
        data = await self._get(f"/db-table/{table_id}")
        if data is None:
            return None
        return TiDBDatabase.from_json(data["db_info"]), TiDBTable.from_json(data["table_info"])

    # ------------------------------------------------------------------ DDL history

    async def ddl_history(self, *, limit: int | None = None, start_job_id: int | None = None) -> list[DDLJob]:
        """One page of ``/ddl/history`` as served (newest first on current TiDB)."""
        params: dict[str, str] = {}
        if limit is not None:
            if not 1 <= limit <= MAX_HISTORY_PAGE:
                raise ValueError(f"limit must be 1…{MAX_HISTORY_PAGE}, got {limit}")
            params["limit"] = str(limit)
        if start_job_id is not None:
            if limit is None or start_job_id < 1:
                raise ValueError("start_job_id must be ≥ 1 and needs a limit")
            params["start_job_id"] = str(start_job_id)
        data = await self._get("/ddl/history", params)
        return [DDLJob.from_json(j) for j in data or ()]

    async def ddl_jobs_since(self, after_job_id: int, *, page: int = MAX_HISTORY_PAGE) -> list[DDLJob]:
        """Every history job with id > ``after_job_id``, ascending by id.

        Pages backwards with ``start_job_id`` until it reaches ``after_job_id``
        (job ids are not dense, so ranges are never guessed). Servers that
        ignore ``start_job_id`` (old TiDB) are detected and not looped on.
        """
        jobs: dict[int, DDLJob] = {}
        start: int | None = None
        while True:
            batch = await self.ddl_history(limit=page, start_job_id=start)
            fresh = [j for j in batch if j.id > after_job_id and j.id not in jobs]
            for job in fresh:
                jobs[job.id] = job
            if len(batch) < page or not fresh:
                break
            oldest = min(j.id for j in batch)
            if oldest <= after_job_id + 1:
                break
            start = oldest - 1
        return [jobs[i] for i in sorted(jobs)]
