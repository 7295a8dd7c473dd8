"""The MySQL sink's writers in Spark tasks: one connection per partition of a batch.

The driver's :meth:`MySQLSink.task_writer <cdcflow.plugins.sinks.mysql.sink.MySQLSink.task_writer>`
gives a :class:`MySQLTaskWriter`: the sink's options (connection settings,
not connections), the changefeed id, the flushed ts and the restart point
(up to which rows are upserts). Pickled to Spark's workers, it opens a
:class:`MySQLPartitionWriter` per (batch, partition), which

1. connects (one connection, retried with backoff like the driver's workers)
   and reads what the checkpoint schema says of the batch's partitions;
2. in a batch flushed before (its id at or below the flushed batch's: Spark
   replays it after a crash), drops rows at or below the flushed ts (a batch
   with DDL records its rows flushed below its DDL); in any batch, rows of
   tables a flushed partition of the batch listed (the batch is partitioned by
   table: those are all downstream). A newer batch's rows at or below the
   flushed ts are of a span that joined behind the others (moved here, or
   added after the first batches): they are written, as upserts;
3. records its partition as *applying* before its first statement;
4. splits the rows into units (one upstream transaction on one table) and
   applies them in order, consecutive units packed into downstream
   transactions of up to ``max-txn-row`` rows, never splitting a unit; it
   holds at most one downstream transaction's rows (plus the unit being
   read) at a time;
5. on flush, applies the rest and records its partition as *flushed* with
   the tables it wrote.

Rows are upserts when ``safe-mode`` is set, when they are at or below the
restart point, or when the checkpoint schema shows the partition begun before
(a task retried by Spark, or the batch replayed): its rows may be partly
downstream. Table metadata (keys, columns) is read by the writer itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from cdcflow.core.data.events import MicroBatch, RowChange, TableName
from cdcflow.core.data.sink import PartitionWriter, TaskWriter
from cdcflow.plugins.sinks.mysql.apply import all_upserts, apply_transaction, progress_scope, segments_of
from cdcflow.plugins.sinks.mysql.catalog import load_table_meta
from cdcflow.plugins.sinks.mysql.causality import group_for_transactions, split_units
from cdcflow.plugins.sinks.mysql.checkpoint import CheckpointState, CheckpointTable
from cdcflow.plugins.sinks.mysql.config import MySQLSinkConfig
from cdcflow.plugins.sinks.mysql.dml import TableMeta
from cdcflow.plugins.sinks.mysql.downstream import Downstream

__all__ = ["MySQLPartitionWriter", "MySQLTaskWriter", "ready_rows"]

log = logging.getLogger(__name__)


class MySQLTaskWriter(TaskWriter):
    """What a Spark task needs to write a partition: settings and the driver's decisions."""

    def __init__(
        self,
        config: MySQLSinkConfig,
        changefeed_id: str,
        *,
        writer_id: str = "",
        flushed_ts: int,
        safe_until: int,
        flushed_batch_id: int = -1,
    ) -> None:
        self.config = config
        self.changefeed_id = changefeed_id
        #: The pipeline that writes (its batch ids are its own: see :mod:`.checkpoint`).
        self.writer_id = writer_id
        #: What the checkpoint table said was flushed (see :meth:`CheckpointState.replays`).
        self.flushed = CheckpointState(flushed_batch_id, flushed_ts)
        #: Rows at or below it may be downstream already: they are upserts.
        self.safe_until = safe_until

    @property
    def flushed_ts(self) -> int:
        """Every change at or below it of the batches flushed so far is downstream."""
        return self.flushed.flushed_ts

    def open(self, batch: MicroBatch, partition: int) -> MySQLPartitionWriter:
        return MySQLPartitionWriter(self, batch, partition)


def ready_rows(
    pending: list[RowChange], max_rows: int, *, final: bool
) -> tuple[list[list[RowChange]], list[RowChange]]:
    """The downstream transactions ``pending`` holds now (as lists of rows, in order),
    and the rows left for later.

    Rows come in ``(commit_ts, start_ts, key)`` order, so every unit is complete but
    the last upstream transaction's, which more rows may continue. Units are packed
    into transactions of up to ``max_rows`` rows (a larger unit stays whole); unless
    ``final``, a transaction that is not full yet is left for later rows to fill."""
    if not pending:
        return [], []
    cut = len(pending)
    if not final:
        last = (pending[-1].commit_ts, pending[-1].start_ts)
        while cut > 0 and (pending[cut - 1].commit_ts, pending[cut - 1].start_ts) == last:
            cut -= 1
    groups = group_for_transactions(split_units(pending[:cut]), max_rows)
    rest = pending[cut:]
    if not final and groups and sum(len(u.rows) for u in groups[-1]) < max_rows:
        rest = [row for u in groups.pop() for row in u.rows] + rest
    return [[row for u in group for row in u.rows] for group in groups], rest


class MySQLPartitionWriter(PartitionWriter):
    """One partition of one batch through one connection (see the module docs)."""

    def __init__(self, target: MySQLTaskWriter, batch: MicroBatch, partition: int) -> None:
        self._target = target
        self._config = target.config
        self._batch = batch
        self._partition = partition
        self._downstream = Downstream(self._config, 1)
        self._checkpoint = CheckpointTable(self._config.checkpoint_schema, target.changefeed_id, target.writer_id)
        self._metas: dict[TableName, TableMeta] = {}
        self._pending: list[RowChange] = []
        #: Tables of the partition's rows (above the flushed ts), recorded when it is flushed.
        self._tables: set[TableName] = set()
        self._begun = False
        self.rows_applied = 0
        #: A batch flushed before (Spark replays a batch id after a crash): rows at or
        #: below the flushed ts are downstream. A newer batch may hold rows below it too —
        #: of a span that joined behind the others (moved here, added late): those are
        #: not downstream, and are written as upserts.
        self._replayed = target.flushed.replays(batch)
        #: The whole batch is downstream: nothing to do.
        self.skipped = target.flushed.has_all_of(batch)
        self._done: frozenset[TableName] = frozenset()
        self._flushed_before: frozenset[TableName] = frozenset()
        #: The partition was begun before: every row is an upsert.
        self.replay = False
        if not self.skipped:
            checkpoint = self._checkpoint
            records = self._downstream.run(
                0,
                f"reading the partitions of batch {batch.batch_id}",
                lambda c, _r: checkpoint.partitions(c, batch.batch_id, batch.end_ts),
            )
            self._done = frozenset(t for r in records if r.flushed for t in r.tables)
            own = [r for r in records if r.partition == partition]
            self.replay = bool(own)
            # What an earlier attempt of this partition flushed stays recorded.
            self._flushed_before = frozenset(t for r in own if r.flushed for t in r.tables)

    # -- PartitionWriter -------------------------------------------------------

    def write(self, rows: Sequence[RowChange]) -> None:
        if self.skipped:
            return
        flushed_ts, done = self._target.flushed_ts if self._replayed else 0, self._done
        for row in rows:
            if row.commit_ts <= flushed_ts:
                continue
            self._tables.add(row.table)
            if row.table not in done:
                self._pending.append(row)
        if len(self._pending) >= self._config.max_txn_row:
            self._apply(final=False)

    def flush(self) -> None:
        if self.skipped:
            return
        self._apply(final=True)
        if not self._begun:
            return  # nothing applied (every row was downstream already): nothing to record
        batch, partition, checkpoint = self._batch, self._partition, self._checkpoint
        tables = frozenset(self._tables | self._flushed_before)
        self._downstream.run(
            0,
            f"recording partition {partition} of batch {batch.batch_id} flushed",
            lambda c, _r: checkpoint.mark_partition_flushed(c, batch.batch_id, partition, batch.end_ts, tables),
        )

    def close(self) -> None:
        self._downstream.close()

    # -- applying ----------------------------------------------------------------

    def _apply(self, *, final: bool) -> None:
        transactions, rest = ready_rows(self._pending, self._config.max_txn_row, final=final)
        if not transactions:
            return
        if not self._begun:
            self._begin()
        for rows in transactions:
            self._apply_transaction(rows)
        self._pending = rest

    def _begin(self) -> None:
        batch, partition, checkpoint = self._batch, self._partition, self._checkpoint
        self._downstream.run(
            0,
            f"recording partition {partition} of batch {batch.batch_id} begun",
            lambda c, _r: checkpoint.mark_partition_applying(c, batch.batch_id, partition, batch.end_ts),
        )
        self._begun = True

    def _upsert(self, row: RowChange) -> bool:
        target = self._target
        return (
            self._config.safe_mode
            or self.replay
            or row.commit_ts <= target.safe_until
            or row.commit_ts <= target.flushed_ts  # a span that joined behind: see _replayed
        )

    def _meta(self, table: TableName) -> TableMeta:
        meta = self._metas.get(table)
        if meta is None:
            meta = self._downstream.run(
                0, f"reading the keys of {table}", lambda c, _r: load_table_meta(c, table.schema, table.table)
            )
            self._metas[table] = meta
        return meta

    def _apply_transaction(self, rows: list[RowChange]) -> None:
        units = split_units(rows)
        for unit in units:
            self._meta(unit.table)
        segments = segments_of(units, self._metas.__getitem__, self._upsert)
        checkpoint, zone, scope = self._checkpoint, self._downstream.zone, progress_scope(self._batch.batch_id)
        self._downstream.run(
            0,
            f"applying {len(rows)} rows",
            lambda c, retried: apply_transaction(
                c, all_upserts(segments) if retried else segments, checkpoint, zone, scope
            ),
        )
        self.rows_applied += len(rows)
