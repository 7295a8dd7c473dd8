"""The ``mysql`` sink: ``mysql://user:pass@host:port/?worker-count=16``.

On Spark, a batch's rows are written by Spark tasks, one connection per task
(see :mod:`.tasks`); the driver writes its DDL and records it:

1. The batch's rows are partitioned by table: one upstream transaction's rows
   of a table are in one partition, and a table's rows keep their commit order
   there. Parallelism is the number of tables with rows in the batch (at most
   the number of partitions; tables whose ids hash alike share one); the rows
   of one table are applied on one connection.
2. Each partition writer applies its rows in order, as units (one upstream
   transaction on one table) packed into downstream transactions of up to
   ``max-txn-row`` rows, never splitting a unit. It records
   (changefeed, batch, partition) in the checkpoint schema's ``batch_partition``
   table as *applying* before its first statement and as *flushed*, with the
   tables it wrote, after its last.
3. A replay of the batch (Spark retrying a task, the runtime retrying the
   batch, a restart) skips the rows of every table a flushed partition of the
   batch listed; a partition found *applying* was cut short and is rewritten
   with upserts. In a batch flushed before (its id at or below the flushed
   batch's), rows at or below the checkpoint table's flushed ts are skipped,
   and a batch at or below it is skipped whole. In a newer batch, such rows
   are of a span that joined behind the others (a table moved here, or added
   after the first batches): they are written, as upserts.
4. Once every partition flushed, ``commit_batch`` on the driver runs the DDL
   (after recording the rows flushed just below it, as in step 4 below) and
   records the batch as flushed, which drops its partitions' records.

The records are the writer's (see the checkpoint schema below): a batch is
"flushed before" only if this capture's pipeline flushed it.

Batches written from the driver (``write_batch``: the test kit, sources whose
rows cannot be mounted in tasks) are applied this way:

1. A batch whose id and end ts are at or below the flushed batch's was
   applied before: it is skipped (replay recognised). A newer batch's rows at
   or below the flushed ts (a span that joined behind) are upserts.
2. The batch is recorded as *applying* in the checkpoint table.
3. Its rows are split into units — one upstream transaction on one table —
   and units that share a primary/unique key value (old or new image) are
   chained into lanes; lanes run in parallel on up to ``worker-count``
   connections (no more than one per ``max-txn-row`` rows of the batch),
   each lane in upstream order (see :mod:`.causality`). A worker packs
   consecutive units into downstream transactions of up to ``max-txn-row``
   rows, never splitting a unit.
4. DDL runs after every row, on one connection (the barrier). Before it, the
   rows are recorded as flushed up to just below the DDL's commit ts, so a
   replay of the batch after the DDL ran (a crash or an outage before step 5)
   applies only the DDL again — never rows of the old schema to the new table.
5. The batch is recorded as *flushed*; then ``write_batch`` returns.

A RENAME TABLE (a DDL event with ``renamed_from``) is skipped when the
downstream already has the new name and not the old one (applied before);
when it has neither — the table was renamed into the changefeed's filter from
a name outside it, so none of its rows came before — the sink stops with an
error that says so and how to go on, instead of MySQL's "table doesn't exist".

A batch that is written again by the same sink (the runtime retries a failed
batch with backoff) is applied with upserts, like a replay after a restart.

Rows committed at or below the restart point (the runtime's restart ts, or
the highest batch end ts begun before a crash, partitions included) are
applied as upserts (REPLACE; an update that moves the key also deletes the
old key), later rows as plain INSERT/UPDATE/DELETE; ``safe-mode=true``
upserts every row.

The checkpoint schema (``checkpoint-schema``, default ``cdcflow``; created
when missing) holds, per changefeed and *writer* — the pipeline of one
capture, whose identity its Spark checkpoint directory keeps (``writer_id``;
``""`` for a runtime with a single writer and no directory, such as the test
kit), because each capture numbers its batches from 0:

* ``checkpoint`` — key ``(changefeed_id, writer_id)``: ``flushed_batch_id``,
  ``flushed_ts`` (the writer's last flushed batch and its end ts),
  ``applying_batch_id``, ``applying_ts`` (a batch begun and not flushed),
  ``updated_at``;
* ``batch_partition`` — key ``(changefeed_id, writer_id, batch_id,
  partition_id)``: ``end_ts``, ``flushed`` (0 while applying), ``tables`` (a
  JSON list of the tables a flushed partition wrote), ``updated_at``; deleted
  once the writer's batch is flushed;
* ``table_progress`` — key ``(changefeed_id, table_name)``: ``commit_ts``,
  ``start_ts`` of the last upstream transaction applied to a key-less table,
  by whichever writer had the table (one at a time); an initial snapshot's
  rows keep one per table and range (``table_name`` ends in `` #<batch id>``).

A writer recognises replays from its own rows only; rows at or below the
highest flushed or begun ts of *any* writer of the changefeed are upserts
(another capture may have applied part of them before their table moved here).
A schema of an earlier version (``checkpoint`` keyed by ``changefeed_id``
alone) gains ``writer_id`` in both keys when the sink opens (``ALTER TABLE``:
the user needs ``ALTER`` on the checkpoint schema once); its rows become
writer ``""``'s, and the first writer whose checkpoint directory predates
writer identities takes them over as its own.

Not guaranteed: if one transaction of a batch fails, transactions of the
same batch that other workers (or partitions) already committed stay
committed; the batch stays *applying*, so its retry (or the restart) rewrites
it idempotently and the downstream converges. A table without a primary key or NOT NULL unique key is matched on
every column (``LIMIT 1``) and applied serially; its progress is recorded in
the same transactions as its rows, so replaying it skips what was applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pymysql

from cdcflow.core.data.events import DDLEvent, MicroBatch, RowChange, TableName
from cdcflow.core.data.sink import Sink, SinkContext
from cdcflow.core.errors import CdcflowError
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.plugins.sinks.mysql.apply import Segment, all_upserts, apply_transaction, progress_scope, segments_of
from cdcflow.plugins.sinks.mysql.catalog import load_table_meta
from cdcflow.plugins.sinks.mysql.causality import Unit, assign_lanes, group_for_transactions, lanes_of, split_units
from cdcflow.plugins.sinks.mysql.checkpoint import CheckpointState, CheckpointTable
from cdcflow.plugins.sinks.mysql.config import SCHEMES, MySQLSinkConfig, describe_issues
from cdcflow.plugins.sinks.mysql.dml import TableMeta, quote
from cdcflow.plugins.sinks.mysql.downstream import Downstream, error_code, is_transient
from cdcflow.plugins.sinks.mysql.errors import DownstreamRejectedError
from cdcflow.plugins.sinks.mysql.tasks import MySQLTaskWriter

__all__ = ["MySQLSink", "cdcflow_register_sinks"]


log = logging.getLogger(__name__)

#: DDL errors meaning "already applied": ignored for DDL inside the replay window.
ALREADY_APPLIED = frozenset(
    {
        1007,  # database exists
        1008,  # database does not exist (drop)
        1050,  # table exists
        1051,  # unknown table (drop)
        1060,  # duplicate column name
        1061,  # duplicate key name
        1068,  # multiple primary key defined
        1091,  # cannot drop: does not exist
        1146,  # table does not exist (drop/alter/truncate of a dropped table)
        1054,  # unknown column (drop/rename of an already changed column)
    }
)


class MySQLSink(Sink[MySQLSinkConfig]):
    """Applies row changes and DDL to MySQL, MariaDB or TiDB, idempotently and in parallel."""

    type_name = "mysql"
    Config = MySQLSinkConfig
    uri_schemes = SCHEMES

    def __init__(self, config: MySQLSinkConfig) -> None:
        super().__init__(config)
        self._downstream: Downstream | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._checkpoint: CheckpointTable | None = None
        self._state = CheckpointState()
        self._safe_until = 0
        #: The highest end ts of a batch recorded as begun by this sink.
        self._begun_ts = 0
        self._metas: dict[TableName, TableMeta] = {}
        #: The key-less tables' progress scope of the batch being written (see progress_scope).
        self._progress_scope = ""

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, MySQLSinkConfig)
        return describe_issues(config)

    # -- lifecycle ---------------------------------------------------------

    def open(self, context: SinkContext) -> None:
        issues = describe_issues(self.config)
        if issues:
            raise DownstreamRejectedError(f"MySQL sink: bad option {issues[0][0]}: {issues[0][1]}")
        self._downstream = Downstream(self.config, self.config.worker_count)
        self._checkpoint = CheckpointTable(
            self.config.checkpoint_schema,
            context.changefeed_id,
            context.writer_id,
            inherits=context.writer_inherits,
        )
        checkpoint = self._checkpoint

        def recover(conn: pymysql.connections.Connection[Any], _retried: bool) -> CheckpointState:
            checkpoint.ensure(conn)
            return checkpoint.read(conn)

        self._state = self._downstream.run(0, "reading the checkpoint table", recover)
        for worker in range(1, self.config.worker_count):  # fail fast, and keep set-up out of the first batch
            self._downstream.run(worker, "connecting", lambda _c, _r: None)
        # Rows up to the restart point, or up to a batch begun before a crash, or up to what
        # any writer of the changefeed flushed or began, may be downstream already.
        self._safe_until = max(context.restart_ts, self._state.applying_ts, self._state.downstream_ts)
        if self.config.worker_count > 1:
            self._pool = ThreadPoolExecutor(self.config.worker_count, thread_name_prefix="mysql-sink")
        log.info(
            "MySQL sink %r opened as writer %r: flushed batch %d (ts %d), upserts up to ts %d",
            self._downstream.target,
            context.writer_id,
            self._state.flushed_batch_id,
            self._state.flushed_ts,
            self._safe_until,
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._downstream is not None:
            self._downstream.close()
            self._downstream = None

    # -- batches -----------------------------------------------------------

    def write_batch(self, batch: MicroBatch) -> None:
        downstream, _ = self._require_open()
        downstream.abort.clear()  # a new attempt: an earlier batch's failure must not cut retries short
        if self._state.has_all_of(batch):
            log.info("MySQL sink: batch %d (end ts %d) was flushed before; skipped", batch.batch_id, batch.end_ts)
            return
        if batch.end_ts <= self._begun_ts:
            # Retried after a failure (the runtime retries a batch with backoff): what the
            # failed attempt committed is downstream already, so this attempt upserts.
            self._safe_until = max(self._safe_until, batch.end_ts)
        # What other writers of the changefeed applied since (a table moved here from a
        # capture that died in the middle of a batch is re-sent from its checkpoint).
        self._safe_until = max(self._safe_until, self._downstream_ts())
        # Rows at or below the flushed ts are applied: a batch with DDL records its rows
        # before its DDL, so that a replay never writes them against the changed table.
        # A replayed batch's rows at or below it are downstream; a newer batch's are of a
        # span that joined behind the others, and are upserts (see _upsert).
        below = self._state.flushed_ts if self._state.replays(batch) else 0
        rows = [row for row in batch.rows if row.commit_ts > below]
        if rows or batch.ddl:
            self._record(batch.batch_id, batch.end_ts, applying=True)
            self._begun_ts = max(self._begun_ts, batch.end_ts)
        if rows:
            self._progress_scope = progress_scope(batch.batch_id)
            self._apply_rows(rows)
            first_ddl = min((ddl.commit_ts for ddl in batch.ddl), default=0)
            if first_ddl > rows[-1].commit_ts:
                self._record(batch.batch_id, first_ddl - 1, applying=False)
        for ddl in batch.ddl:
            self._apply_ddl(ddl)
        self._record(batch.batch_id, batch.end_ts, applying=False)

    # -- batches written by Spark tasks ---------------------------------------------

    def task_partitioning(self) -> str:
        # One upstream transaction's rows of a table in one partition: it stays one
        # downstream transaction, and a table's rows keep their commit order.
        return "table"

    def task_writer(self, tables: Sequence[TableName]) -> MySQLTaskWriter:
        downstream, checkpoint = self._require_open()
        downstream.abort.clear()
        # Partitions recorded and not flushed are of a batch that failed or was cut short:
        # their rows may be downstream, so the batch's replay upserts up to there.
        state = downstream.run(0, "reading the checkpoint table", lambda c, _r: checkpoint.read(c))
        self._state = CheckpointState(state.flushed_batch_id, state.flushed_ts)
        self._safe_until = max(self._safe_until, state.applying_ts, state.downstream_ts)
        return MySQLTaskWriter(
            self.config,
            checkpoint.changefeed_id,
            writer_id=checkpoint.writer_id,
            flushed_ts=state.flushed_ts,
            safe_until=self._safe_until,
            flushed_batch_id=state.flushed_batch_id,
        )

    def commit_batch(self, batch: MicroBatch) -> None:
        """Every partition of ``batch`` flushed: its DDL (rows recorded flushed just below
        the first one), then the batch's flushed mark."""
        downstream, _ = self._require_open()
        downstream.abort.clear()
        if self._state.has_all_of(batch):
            log.info("MySQL sink: batch %d (end ts %d) was flushed before; skipped", batch.batch_id, batch.end_ts)
            return
        if batch.ddl:
            if batch.end_ts <= self._begun_ts:
                self._safe_until = max(self._safe_until, batch.end_ts)
            self._record(batch.batch_id, batch.end_ts, applying=True)
            self._begun_ts = max(self._begun_ts, batch.end_ts)
            first_ddl = min(ddl.commit_ts for ddl in batch.ddl)
            if first_ddl - 1 > self._state.flushed_ts:
                self._record(batch.batch_id, first_ddl - 1, applying=False)
            for ddl in batch.ddl:
                self._apply_ddl(ddl)
        self._record(batch.batch_id, batch.end_ts, applying=False)

    def _record(self, batch_id: int, ts: int, *, applying: bool) -> None:
        """Record a batch as begun (``applying``) or everything up to ``ts`` as flushed."""
        downstream, checkpoint = self._require_open()
        if applying:
            downstream.run(0, "recording the batch start", lambda c, _r: checkpoint.mark_applying(c, batch_id, ts))
            return
        downstream.run(0, "recording the flushed batch", lambda c, _r: checkpoint.mark_flushed(c, batch_id, ts))
        self._state = CheckpointState(batch_id, ts)

    def _downstream_ts(self) -> int:
        downstream, checkpoint = self._require_open()
        return downstream.run(0, "reading the checkpoint table", lambda c, _r: checkpoint.downstream_ts(c))

    def _require_open(self) -> tuple[Downstream, CheckpointTable]:
        if self._downstream is None or self._checkpoint is None:
            raise RuntimeError("MySQLSink.write_batch called before open()")
        return self._downstream, self._checkpoint

    def _apply_rows(self, rows: Sequence[RowChange]) -> None:
        self._require_open()
        units = split_units(rows)
        for table in {u.table for u in units}:
            self._meta(table)
        # A worker only pays off with at least a full downstream transaction to do: small
        # batches run on fewer workers (thread hand-offs and commits cost more than they save).
        useful = max(1, min(self.config.worker_count, len(rows) // self.config.max_txn_row))
        workers = assign_lanes(lanes_of(units, self._metas.__getitem__), useful)
        jobs = [(w, mine) for w, mine in enumerate(workers) if mine]
        if len(jobs) == 1 or self._pool is None:
            for worker, mine in jobs:
                self._apply_units(worker, mine)
            return
        futures = [self._pool.submit(self._apply_units, worker, mine) for worker, mine in jobs]
        errors: list[BaseException] = []
        for future in futures:
            exc = future.exception()
            if exc is not None:
                errors.append(exc)
        if errors:
            # A constraint error is more telling than "aborted because another worker failed".
            errors.sort(key=lambda e: not isinstance(e, CdcflowError))
            raise errors[0]

    def _apply_units(self, worker: int, units: list[Unit]) -> None:
        downstream, _ = self._require_open()
        try:
            for group in group_for_transactions(units, self.config.max_txn_row):
                if downstream.abort.is_set():
                    return
                segments = self._segments(group)
                rows = sum(len(seg.rows) for seg in segments)
                downstream.run(worker, f"applying {rows} rows", self._transaction(segments))
        except BaseException:
            downstream.abort.set()
            raise

    def _segments(self, group: list[Unit]) -> list[Segment]:
        """The units of one downstream transaction as runs of one table each."""
        return segments_of(group, self._metas.__getitem__, self._upsert)

    def _upsert(self, row: RowChange) -> bool:
        # At or below the flushed ts in a batch not replayed: a span that joined behind.
        return self.config.safe_mode or row.commit_ts <= max(self._safe_until, self._state.flushed_ts)

    def _transaction(self, segments: list[Segment]) -> Callable[[pymysql.connections.Connection[Any], bool], None]:
        """The work of one downstream transaction; a retried one upserts every row."""

        def work(conn: pymysql.connections.Connection[Any], retried: bool) -> None:
            self._apply_transaction(conn, all_upserts(segments) if retried else segments)

        return work

    def _apply_transaction(self, conn: pymysql.connections.Connection[Any], segments: list[Segment]) -> None:
        """One downstream transaction; on a refused statement, roll back and say which row."""
        downstream, checkpoint = self._require_open()
        apply_transaction(conn, segments, checkpoint, downstream.zone, self._progress_scope)

    # -- tables and DDL ----------------------------------------------------

    def _meta(self, table: TableName) -> TableMeta:
        meta = self._metas.get(table)
        if meta is None:
            downstream, _ = self._require_open()
            meta = downstream.run(
                0, f"reading the keys of {table}", lambda c, _r: load_table_meta(c, table.schema, table.table)
            )
            self._metas[table] = meta
        return meta

    def _apply_ddl(self, ddl: DDLEvent) -> None:
        downstream, _ = self._require_open()
        replay = self.config.safe_mode or ddl.commit_ts <= self._safe_until

        def run(conn: pymysql.connections.Connection[Any], retried: bool) -> None:
            with conn.cursor() as cur:
                if ddl.table is not None and ddl.table.schema:
                    cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(ddl.table.schema)}")
                    cur.execute(f"USE {quote(ddl.table.schema)}")
                if ddl.renamed_from is not None and ddl.table is not None and _renamed_already(cur, ddl):
                    log.info("MySQL sink: %s is %s downstream already; RENAME skipped", ddl.renamed_from, ddl.table)
                    return
                try:
                    cur.execute(ddl.query)
                except pymysql.err.MySQLError as exc:
                    if is_transient(exc):
                        raise
                    if not ((replay or retried) and error_code(exc) in ALREADY_APPLIED):
                        raise DownstreamRejectedError(
                            f"MySQL sink: DDL at ts {ddl.commit_ts} refused by the downstream: {exc.args[-1]}",
                            detail={"query": ddl.query, "commit_ts": ddl.commit_ts, "error_code": error_code(exc)},
                        ) from exc
                    log.info("MySQL sink: DDL at ts %d already applied (%s); skipped", ddl.commit_ts, exc)
            conn.commit()

        downstream.run(0, f"applying DDL at ts {ddl.commit_ts}", run)
        self._metas.clear()


def _renamed_already(cur: Any, ddl: DDLEvent) -> bool:
    """For a RENAME: True when the downstream has the new name and not the old one (applied
    before). Neither: the table was renamed into the filter from a name it does not match,
    so nothing of it was replicated — a precise error instead of MySQL's 1146."""
    assert ddl.renamed_from is not None and ddl.table is not None
    old, new = ddl.renamed_from, ddl.table

    def exists(table: TableName) -> bool:
        sql = "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s"
        return bool(cur.execute(sql, (table.schema, table.table)))

    if exists(old):
        return False
    if exists(new):
        return True
    raise DownstreamRejectedError(
        f"MySQL sink: cannot apply {ddl.query!r} (ts {ddl.commit_ts}): the downstream has neither "
        f"{quote(old.schema)}.{quote(old.table)} nor {quote(new.schema)}.{quote(new.table)}. The table was "
        "renamed into the changefeed's filter from a name the filter does not match, so none of its rows "
        f"were replicated. Create {quote(new.schema)}.{quote(new.table)} downstream with its rows as of "
        f"ts {ddl.commit_ts}, and the changefeed, which retries by itself, goes on from there; or re-create "
        "the changefeed from a ts before the RENAME with the old name in its filter.",
        detail={"query": ddl.query, "commit_ts": ddl.commit_ts, "from": str(old), "to": str(new)},
    )


@hookimpl
def cdcflow_register_sinks(registry: Registrar[Sink[Any]]) -> None:
    registry.add(MySQLSink)
