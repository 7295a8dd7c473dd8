"""Table schemas over time: which TableInfo decodes a row committed at ts.

Each physical table id has a list of :class:`TableVersion` sorted by ``ts``;
a version is valid for rows with ``commit_ts − 1 >= ts`` (TiDB and TiCDC
decode a row with the schema snapshot at ``commit_ts − 1``), until the next
version. A version with ``table=None`` marks the id as dropped.

Where versions come from:

* :meth:`SchemaStore.load` — the status API: current tables (``/schema``,
  ``/schema/{db}``) as the base, and ``/ddl/history`` jobs finished after the
  start ts as *provisional* versions at their ``FinishedTS``;
* :meth:`SchemaStore.apply_job` with the commit ts of the job's write in
  TiKV (:mod:`.ddl_job`) — the exact version; it replaces a provisional one of
  the same job id, and a job id applied exactly once is never applied again.

A job that finished after the start ts may have committed its *done* write at
or before it (the write precedes ``FinishedTS``); a feed from the start ts
never delivers that write. :meth:`SchemaStore.settle`, called with the
resolved ts of the DDL job spans, detects this — once the DDL spans are
resolved past a provisional job's ``FinishedTS`` without its write, the
write was at or below the load ts — and moves the version there.

Not guaranteed: the base loaded from the status API is the *current* schema,
so a DDL that finished before the start ts but after the newest job kept in
``/ddl/history`` is not reflected as history. Decoding is by column id, and
ids are never reused, so adjacent versions decode each other's rows (missing
ids take their default, unknown ids are ignored).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcflow.core.data.events import TableName
from cdcflow.plugins.sources.tikv.tidb.ddl_job import ACTION_CREATE_TABLE, ACTION_CREATE_TABLES, DDLJob
from cdcflow.plugins.sources.tikv.tidb.schema import TiDBDatabase, TiDBTable

if TYPE_CHECKING:
    from cdcflow.plugins.sources.tikv.tidb.status_api import StatusAPIClient

__all__ = ["DROP_ACTIONS", "LiveTable", "SchemaStore", "TableVersion"]

ACTION_DROP_SCHEMA = 2
ACTION_DROP_TABLE = 4
ACTION_TRUNCATE_TABLE = 11
ACTION_DROP_VIEW = 24
ACTION_DROP_SEQUENCE = 36
_DROPS = frozenset({ACTION_DROP_TABLE, ACTION_DROP_VIEW, ACTION_DROP_SEQUENCE})
#: ActionTypes that give a table id its first version: CREATE TABLE, CREATE TABLES, TRUNCATE (the new id).
_CREATING = frozenset({ACTION_CREATE_TABLE, ACTION_CREATE_TABLES, ACTION_TRUNCATE_TABLE})
#: ActionTypes after which the object is gone (no schema after the DDL).
DROP_ACTIONS = _DROPS | {ACTION_DROP_SCHEMA}


#: A table with rows as the table set knows it: its name and its physical ids.
LiveTable = tuple[TableName, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class TableVersion:
    """One schema version of a physical table, valid from ``ts`` on."""

    ts: int
    schema_id: int
    db_name: str
    table: TiDBTable | None
    job_id: int = 0
    #: True when ``ts`` is the DDL's observed commit ts, False for a FinishedTS estimate.
    exact: bool = True
    schema_version: int = 0


class SchemaStore:
    """Schema versions of every physical table id, queried by ts."""

    def __init__(self) -> None:
        self._versions: dict[int, list[TableVersion]] = {}
        self._databases: dict[int, str] = {}
        self._logical: dict[int, tuple[int, ...]] = {}
        self._jobs: dict[int, bool] = {}  # job id → applied exactly
        self._provisional: dict[int, DDLJob] = {}
        self._loaded_at = 0
        #: Physical ids by the ts of a version of theirs (entries may be stale: checked on use).
        self._changed: dict[int, set[int]] = {}

    # ------------------------------------------------------------------ queries

    def table_at(self, physical_id: int, ts: int) -> TableVersion | None:
        """The version of ``physical_id`` valid at ``ts`` (None if unknown then)."""
        return self.table_between(physical_id, ts)[0]

    def table_between(self, physical_id: int, ts: int) -> tuple[TableVersion | None, int, int]:
        """:meth:`table_at` with the ts range ``[low, high)`` around ``ts`` that has the same
        answer while the store takes no new version of the table (so that a run of rows
        looks the version up once)."""
        versions = self._versions.get(physical_id)
        if not versions:
            return None, ts, ts + 1
        i = bisect.bisect_right(versions, ts, key=_version_ts)
        low = versions[i - 1].ts if i else -(1 << 63)
        high = versions[i].ts if i < len(versions) else 1 << 64
        return (versions[i - 1] if i else None), low, high

    def logical_at(self, table_id: int, ts: int) -> TableVersion | None:
        """The version of the logical table ``table_id`` valid at ``ts``: its own for a
        table without partitions, else the one its partitions share (versions are kept per
        physical id, and a partitioned table's own id holds no rows)."""
        version = self.table_at(table_id, ts)
        if version is not None:
            return version
        for pid in self._logical.get(table_id, ()):
            version = self.table_at(pid, ts)
            if version is not None and version.table is not None and version.table.id == table_id:
                return version
        return None

    def table_for_row(self, physical_id: int, commit_ts: int) -> TableVersion | None:
        """The version that decodes a row committed at ``commit_ts`` (the one at ``commit_ts − 1``)."""
        return self.table_at(physical_id, commit_ts - 1)

    def snapshot(self, start_ts: int, end_ts: int) -> SchemaStore:
        """A store with only what decoding rows committed in ``(start_ts, end_ts]``
        needs: per physical table, the versions valid at ``commit_ts − 1`` for some
        commit ts in that range (small enough to ship to Spark tasks with a batch)."""
        snapshot = SchemaStore()
        for pid, versions in self._versions.items():
            first = max(0, bisect.bisect_right(versions, start_ts, key=_version_ts) - 1)
            last = bisect.bisect_right(versions, end_ts - 1, key=_version_ts)
            kept = [v for v in versions[first:last] if v.ts <= end_ts - 1]
            if kept:
                snapshot._versions[pid] = kept
        snapshot._databases = dict(self._databases)
        snapshot._logical = dict(self._logical)
        snapshot._loaded_at = self._loaded_at
        return snapshot

    def versions(self) -> Iterator[tuple[int, TableVersion]]:
        """Every (physical id, version) the store holds."""
        for pid, versions in self._versions.items():
            for version in versions:
                yield pid, version

    def knows(self, physical_id: int) -> bool:
        return physical_id in self._versions

    def live_tables(self, ts: int) -> list[TableVersion]:
        """Every table (one entry per logical table) alive at ``ts``."""
        seen: dict[int, TableVersion] = {}
        for pid in self._versions:
            v = self.table_at(pid, ts)
            if v is not None and v.table is not None:
                seen.setdefault(v.table.id, v)
        return sorted(seen.values(), key=lambda v: (v.db_name, v.table.name if v.table else ""))

    def tables_changed_at(self, ts: int) -> tuple[dict[int, LiveTable], dict[int, LiveTable]]:
        """The tables with rows that a DDL at exactly ``ts`` touched, as they were just
        before ``ts`` and as they are from ``ts`` on: logical id → (name, physical ids)."""
        before: dict[int, LiveTable] = {}
        after: dict[int, LiveTable] = {}
        for pid in sorted(self._changed.get(ts, ())):
            current = self.table_at(pid, ts)
            if current is None or current.ts != ts:
                continue  # a version since forgotten (a provisional job made exact)
            for version, out in ((self.table_at(pid, ts - 1), before), (current, after)):
                table = version.table if version is not None else None
                if version is not None and table is not None and table.has_rows:
                    out[table.id] = (TableName(version.db_name, table.name, table.id), table.physical_ids())
        return before, after

    def database_name(self, schema_id: int) -> str | None:
        return self._databases.get(schema_id)

    # ------------------------------------------------------------------ building

    def add_database(self, db: TiDBDatabase) -> None:
        self._databases[db.id] = db.name

    def add_table(
        self,
        schema_id: int,
        db_name: str,
        table: TiDBTable,
        ts: int,
        *,
        job_id: int = 0,
        exact: bool = True,
        schema_version: int = 0,
    ) -> None:
        """Record ``table`` (all its physical ids) as valid from ``ts``; ids it lost are dropped."""
        new_ids = table.physical_ids()
        for pid in set(self._logical.get(table.id, ())) - set(new_ids):
            self._insert(pid, TableVersion(ts, schema_id, db_name, None, job_id, exact, schema_version))
        for pid in new_ids:
            self._insert(pid, TableVersion(ts, schema_id, db_name, table, job_id, exact, schema_version))
        self._logical[table.id] = new_ids

    def drop_table(self, logical_id: int, ts: int, *, job_id: int = 0, exact: bool = True) -> None:
        for pid in self._logical.pop(logical_id, (logical_id,)):
            previous = self.table_at(pid, ts)
            schema_id, db = (previous.schema_id, previous.db_name) if previous else (0, "")
            self._insert(pid, TableVersion(ts, schema_id, db, None, job_id, exact))

    def _insert(self, pid: int, version: TableVersion) -> None:
        versions = self._versions.setdefault(pid, [])
        # same ts: the later call wins (a job may rewrite a table twice in one ts)
        versions[:] = [v for v in versions if v.ts != version.ts]
        bisect.insort(versions, version, key=_version_ts)
        self._changed.setdefault(version.ts, set()).add(pid)

    def _forget_job(self, job_id: int) -> None:
        for versions in self._versions.values():
            versions[:] = [v for v in versions if v.job_id != job_id]

    def apply_job(self, job: DDLJob, ts: int, *, exact: bool = True) -> bool:
        """Apply a finished DDL job as of ``ts``. Returns False if it was applied exactly before.

        A provisional application (``exact=False``) is replaced by an exact one.
        """
        if self._jobs.get(job.id):
            return False
        if job.id in self._jobs:
            self._forget_job(job.id)
        self._jobs[job.id] = exact
        if exact:
            self._provisional.pop(job.id, None)
        else:
            self._provisional[job.id] = job
        if job.db_info is not None:
            self._databases[job.db_info.id] = job.db_info.name
        db_name = self._databases.get(job.schema_id, job.schema_name)
        if job.type == ACTION_DROP_SCHEMA:
            self._drop_schema(job.schema_id, ts, job.id, exact)
            return True
        if job.type in _DROPS or job.type == ACTION_TRUNCATE_TABLE:
            self.drop_table(job.table_id, ts, job_id=job.id, exact=exact)
            if job.type in _DROPS:
                return True
        tables = job.multiple_table_infos or ((job.table_info,) if job.table_info else ())
        for table in tables:
            self.add_table(
                job.schema_id, db_name, table, ts, job_id=job.id, exact=exact, schema_version=job.schema_version
            )
        return True

    def settle(self, ddl_resolved_ts: int) -> int:
        """The DDL job spans are resolved to ``ddl_resolved_ts``: pin unconfirmed jobs to the load ts.

        A provisional job with ``FinishedTS <= ddl_resolved_ts`` whose write
        was not seen committed at or before the load ts (its done write
        precedes FinishedTS), so its schema was live from the load ts on.
        Returns how many jobs were settled.
        """
        due = [j for j in self._provisional.values() if j.finished_ts <= ddl_resolved_ts]
        for job in sorted(due, key=lambda j: j.id):
            self.apply_job(job, self._loaded_at, exact=True)
        return len(due)

    def unsettled_until(self) -> int:
        """The highest ``FinishedTS`` of a job still provisional (0 when none): once the DDL
        job spans are resolved past it, every version is at its exact ts."""
        return max((job.finished_ts for job in self._provisional.values()), default=0)

    def _drop_schema(self, schema_id: int, ts: int, job_id: int, exact: bool) -> None:
        for logical_id in list(self._logical):
            pids = self._logical[logical_id]
            latest = self.table_at(pids[0], ts) if pids else None
            if latest is not None and latest.schema_id == schema_id:
                self.drop_table(logical_id, ts, job_id=job_id, exact=exact)

    # ------------------------------------------------------------------ the status API

    async def load(self, client: StatusAPIClient, start_ts: int) -> None:
        """Fill the store from a TiDB status API for a changefeed starting at ``start_ts``.

        A table a later job created (CREATE TABLE, or the new id of a TRUNCATE) gets no
        base version: it did not exist at ``start_ts``. A table a later job dropped or
        truncated gets its last version before ``start_ts`` as base when the history
        keeps it (the status API no longer lists it)."""
        self._loaded_at = start_ts
        jobs = [j for j in await client.ddl_jobs_since(0) if j.is_done]
        later = [j for j in jobs if j.finished_ts > start_ts]
        touched = {tid for j in later for tid in _job_table_ids(j)}
        earlier = {tid: j for j in jobs if j.finished_ts <= start_ts for tid in _job_table_ids(j)}
        created_later = {t.id for j in later if j.type in _CREATING for t in _job_tables(j)}
        listed: set[int] = set()
        for db in await client.databases():
            if db.is_memory_schema:
                continue
            self.add_database(db)
            for table in await client.tables(db.name):
                listed.add(table.id)
                base = earlier.get(table.id)
                if table.id in created_later and base is None:
                    continue  # created after start_ts: its job adds it
                if table.id in touched and base is not None and base.table_info is not None:
                    table = base.table_info  # noqa: PLW2901 - the version before the later jobs
                self.add_table(db.id, db.name, table, 0, exact=False)
        for job in later:
            gone = job.table_id
            if job.type not in _DROPS | {ACTION_TRUNCATE_TABLE} or gone in listed or gone in created_later:
                continue
            base = earlier.get(gone)
            info = base.table_info if base is not None else None
            if info is None and job.type in _DROPS and job.table_info is not None and job.table_info.id == gone:
                info = job.table_info  # TiDB records the dropped table's info in the job
            if info is not None:
                self.add_table(job.schema_id, self._databases.get(job.schema_id, job.schema_name), info, 0, exact=False)
        for job in sorted(later, key=lambda j: j.id):
            self.apply_job(job, job.finished_ts, exact=False)

    async def resolve(self, client: StatusAPIClient, physical_id: int) -> bool:
        """Learn an id the store has never seen (a table created before the history it loaded)."""
        if self.knows(physical_id):
            return True
        found = await client.db_table(physical_id)
        if found is None:
            return False
        db, table = found
        self.add_database(db)
        self.add_table(db.id, db.name, table, 0, exact=False)
        return self.knows(physical_id)


def _version_ts(version: TableVersion) -> int:
    return version.ts


def _job_tables(job: DDLJob) -> Iterable[TiDBTable]:
    if job.table_info is not None:
        yield job.table_info
    yield from job.multiple_table_infos


def _job_table_ids(job: DDLJob) -> Iterable[int]:
    yield job.table_id
    if job.table_info is not None:
        yield job.table_info.id
    for t in job.multiple_table_infos:
        yield t.id
