"""The ``spark`` sink: change tables and current-state tables in Parquet.

``changelog`` mode appends every row change of a table to
``{root}/{schema}/{table}/changelog`` — columns ``op``, ``commit_ts``,
``start_ts``, ``seq`` (order in the batch), ``before`` and ``after`` (structs
of the table's columns) — partitioned by ``commit_date`` (UTC day of the
commit ts), ``writer`` and ``batch_id``. A batch is written with dynamic
partition overwrite, so writing it again replaces exactly its own partitions
(idempotent per batch id). Batch ids count within one writer
(:attr:`SinkContext.writer_id <cdcflow.core.data.sink.SinkContext.writer_id>`:
every capture running the changefeed has its own, and so has a changefeed
created again under the same id), so the writer is part of a batch's
partitions: writers sharing a root never replace each other's batches. A
change log an earlier version made (no ``writer`` level) keeps its layout.

``snapshot`` mode keeps ``{root}/{schema}/{table}/snapshot`` equal to the
upstream table as of the last applied resolved ts (see :mod:`.snapshot`).

After every batch the sink records ``{batch-id, resolved-ts}`` in
``{root}/_cdcflow/{changefeed}/writers/{writer}.json`` (``checkpoint.json``
there for a sink without writer id); a replayed batch of the writer (the
batch id recorded or an earlier one; a snapshot's negative id only when the
same) at or below it is skipped. A later batch that ends at the same ts (the
bounded batches of a span that joined behind the others, the snapshot ranges
of a cluster) is written. A writer that inherits (upgraded from a version without
writer ids) starts from ``checkpoint.json``. With ``catalog-database`` set, the tables are also
registered in that Spark catalog database (``{schema}__{table}`` and
``{schema}__{table}__changelog``), the snapshot table's location switched to
each new version.

``table-format``: with a catalog whose tables support ``MERGE INTO`` (Delta
Lake, Iceberg) the snapshot is merged into the catalog table instead of
written as versions (see :mod:`.merge`); ``auto`` detects it from the
existing table's provider. Plain Parquet never supports it.

DDL, from the upstream schema a DDL event carries (``schema_after``): the
snapshot follows ADD, DROP, RENAME and MODIFY/CHANGE COLUMN at the DDL's
place among the rows — after the rows below its commit ts, before those at or
above it — in the batch's new version (see :mod:`.evolve`): rows written
before an ADD COLUMN get the column's origin default, as the upstream reads
them; a type change Spark cannot cast stops the sink with ``DDLBlockedError``
(2003) naming table, column and DDL. TRUNCATE and DROP TABLE empty it. The
change log keeps each change's images as they were: a new column appears
from the first batch whose rows carry it (older changes read NULL there), a
dropped one stays (NULL in newer changes). Partitions of a table share its
directories.

RENAME TABLE (a DDL event with ``renamed_from``): the snapshot moves to the
new name in the batch that ends at the RENAME — the new name's version is the
old name's state with the old name's rows below the RENAME applied, and the
old name gets an empty version (as after DROP TABLE); a merged catalog table is
renamed with ``ALTER TABLE … RENAME TO``. The change log stays where it was
written: changes before the RENAME under the old name, later ones under the new.

In the pipeline the sink can write a batch from its Spark frame
(``Sink.write_frame``, see :mod:`.batchframe`): the Spark tasks that mount
the rows turn them into typed columns in the same pass, and Spark writes the
change log and the snapshot from those; no row is brought to the driver.
``frame-writes`` says which batches: every batch (``true``), an initial
snapshot's batch and batches of more than 50,000 rows (``auto``, the
default: a catch-up's), or none (``false``); the others have their rows
mounted by Spark tasks and written from the driver. Batches with a
RENAME TABLE, and catalog tables that may be merged (``table-format`` other
than ``versioned`` with ``catalog-database``), are always written from the
driver; both ways leave the same tables.

Not interpreted: a DDL event without ``schema_after`` (columns then appear
when rows carry them).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cdcflow.core.data.events import ColumnInfo, DDLEvent, MicroBatch, RowChange, TableName
from cdcflow.core.data.pipeline.runtime import DEFAULT_COLLECT_ROWS
from cdcflow.core.data.pipeline.session import run_in_threads
from cdcflow.core.data.sink import BatchFrame, Sink, SinkContext
from cdcflow.core.errors import CdcflowError, DownstreamUnavailableError, Retryable
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.plugins.sinks.spark.batchframe import (
    CHANGELOG,
    PARTS_DDL,
    Part,
    PartsTask,
    TableRows,
    UnpackTask,
    changelog_columns,
    changelog_ddl,
    changes_columns,
    read_parts,
)
from cdcflow.plugins.sinks.spark.config import SparkSinkConfig, describe_issues, path_of
from cdcflow.plugins.sinks.spark.evolve import TargetColumn, column_plan, cut_at_ddl, ddl_by_table, ddl_error, evolve
from cdcflow.plugins.sinks.spark.frames import (
    change_records,
    changelog_records,
    decimal_ints,
    delta_records,
    image_columns,
)
from cdcflow.plugins.sinks.spark.merge import MERGE_PROVIDERS, alter_table, merge_sql, provider_of
from cdcflow.plugins.sinks.spark.session import spark_session
from cdcflow.plugins.sinks.spark.snapshot import latest_per_key, next_state, next_state_keyless, write_snapshot_version
from cdcflow.plugins.sinks.spark.storage import Storage

__all__ = ["AUTO_FRAME_ROWS", "SparkSink", "cdcflow_register_sinks", "table_dir"]

log = logging.getLogger(__name__)

#: TiDB action types (Open Protocol §2.6) that empty a table.
_DROP_TABLE, _TRUNCATE_TABLE = 4, 11
#: The change log's ``writer`` of a sink opened without a writer id (the test kit, the in-process executor).
LOCAL_WRITER = "local"
#: ``frame-writes: auto`` writes a batch of more than this many rows from its frame: a batch
#: the pipeline would otherwise sort with Spark and stage for the driver (above its default
#: ``collect_rows``), as in a catch-up. Smaller batches, a live changefeed's, are written
#: sooner from the driver.
AUTO_FRAME_ROWS = DEFAULT_COLLECT_ROWS


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_dir(storage: Storage, table: TableName) -> str:
    return storage.path(table.schema, table.table)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """Rows of one table with their Spark column types (unsigned BIGINT values as Decimal)."""

    rows: list[RowChange]
    types: dict[str, str]

    @classmethod
    def of(cls, rows: list[RowChange]) -> _Prepared:
        types = image_columns(rows)
        return cls(decimal_ints(rows, types), types)

    @property
    def count(self) -> int:
        return len(self.rows)

    def state(self, sink: SparkSink, table: TableName) -> Any:
        return sink._state_function(table, self.rows, self.types)


@dataclass(frozen=True, slots=True)
class _FramePart:
    """Rows of one table (one step) as parts of the batch's parts frame: Spark tasks unpack them."""

    parts: Any
    part: Part

    @property
    def count(self) -> int:
        return self.part.rows

    @property
    def types(self) -> dict[str, str]:
        return self.part.types

    def state(self, sink: SparkSink, table: TableName) -> Any:
        types, keys = self.types, self.part.keys
        fields = ", ".join(f"{_q(c)} {t}" for c, t in types.items())
        if not keys:
            deltas = self.parts.mapInArrow(UnpackTask(changes_columns(types, False), {}), f"{fields}, _delta bigint")
            return lambda existing: next_state_keyless(existing, deltas)
        task = UnpackTask(changes_columns(types, True), self.part.offsets, "_seq", 2)
        changes = self.parts.mapInArrow(task, f"{fields}, _deleted boolean, _commit_ts bigint, _seq bigint")
        return lambda existing: next_state(existing, latest_per_key(changes, keys), keys)


class SparkSink(Sink[SparkSinkConfig]):
    """Writes change tables and current-state tables with Spark (Parquet, any Hadoop path)."""

    type_name = "spark"
    Config = SparkSinkConfig
    uri_schemes = ("spark",)

    def __init__(self, config: SparkSinkConfig) -> None:
        super().__init__(config)
        self.spark: Any = None
        self.storage: Storage | None = None
        self._changefeed = ""
        self._writer = ""
        self._done_ts = 0
        #: The id of the last batch this writer wrote (None: none, or an old checkpoint without it).
        self._done_batch: int | None = None
        #: Per change-log directory: partitioned by writer (see :meth:`_changelog_by_writer`).
        self._by_writer: dict[str, bool] = {}

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, SparkSinkConfig)
        return describe_issues(config)

    def open(self, context: SinkContext) -> None:
        cfg = self.config
        # The runtime's session on the Spark pipeline; standalone, one of the sink's own.
        self.spark = (
            context.spark if context.spark is not None else spark_session(cfg.master, cfg.warehouse_dir, cfg.spark_conf)
        )
        root = path_of(cfg) or str(self.spark.conf.get("spark.sql.warehouse.dir"))
        self.storage = Storage(self.spark, root)
        self._changefeed = context.changefeed_id
        self._writer = context.writer_id
        done = self.storage.checkpoint(self._changefeed, self._writer)
        if not done and context.writer_inherits:  # upgraded: what it wrote before writers had ids
            done = self.storage.checkpoint(self._changefeed)
        self._done_ts = int(done.get("resolved-ts", 0))
        self._done_batch = int(done["batch-id"]) if "batch-id" in done else None
        self._by_writer = {}
        if cfg.catalog_database:
            self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {cfg.catalog_database}")
        log.info("Spark sink writing %s tables under %s (done up to ts %d)", cfg.mode, root, self._done_ts)

    def _written_before(self, batch: MicroBatch) -> bool:
        """Whether this writer wrote ``batch`` before, so that writing it again is skipped:
        a replay (Spark replays a batch id after a crash, and a writer's ids only grow; a
        snapshot's ids are negative and not ordered, so only the same id is) at or below
        the end ts written. The end ts alone does not tell: the bounded batches of a
        catch-up can share one (the backlog of a span that joined behind the others, cut
        into several batches at the ts already published), and so do the snapshot ranges
        one capture delivers; a later batch taken for a replay was lost. A checkpoint
        without a batch id goes by the end ts."""
        done = self._done_batch
        if done is None:
            replay = True
        elif batch.batch_id < 0 or done < 0:
            replay = batch.batch_id == done
        else:
            replay = batch.batch_id <= done
        return replay and 0 < batch.end_ts <= self._done_ts

    def write_batch(self, batch: MicroBatch) -> None:
        storage = self._require_storage()
        if self._written_before(batch):
            log.info("Spark sink: batch %d (end ts %d) was written before; skipped", batch.batch_id, batch.end_ts)
            return
        try:
            # Partitions of one table share its directories: one write per logical table.
            rows_of: dict[tuple[str, str], list[RowChange]] = {}
            tables: dict[tuple[str, str], TableName] = {}
            for row in batch.rows:
                rows_of.setdefault((row.table.schema, row.table.table), []).append(row)
                tables.setdefault((row.table.schema, row.table.table), row.table)
            ddl_of = ddl_by_table(batch.ddl)
            for name, events in ddl_of.items():
                tables.setdefault(name, events[-1].table or TableName(*name))
            # A renamed table's snapshot moves to its new name, with its rows below the
            # RENAME; its change log stays under the name the changes were made with.
            renamed = {
                (e.table.schema, e.table.table): e.renamed_from
                for e in batch.ddl
                if e.renamed_from is not None and e.table is not None
            }
            old_names = {(old.schema, old.table) for old in renamed.values()}
            writes = []
            for name, table in tables.items():
                old = renamed.get(name)
                moved = rows_of.get((old.schema, old.table), []) if old is not None else []
                writes.append(
                    functools.partial(
                        self._write_table,
                        storage,
                        table,
                        rows_of.get(name, []),
                        ddl_of.get(name, []),
                        batch,
                        renamed_from=old,
                        moved=moved,
                        snapshot=name not in old_names,
                    )
                )
            # Tables apart from each other are written at once, as from a frame; a rename
            # reads another table's snapshot, and MERGE INTO goes through the catalog.
            apart = not renamed and not self._may_merge()
            run_in_threads(self.spark, writes, self.config.write_threads if apart else 1)
            for old in renamed.values():
                if (old.schema, old.table) not in renamed:  # not itself the target of another rename
                    self._retire_snapshot(storage, old, batch)
            storage.write_checkpoint(self._changefeed, batch.batch_id, batch.end_ts, self._writer)
        except Exception as exc:
            _raise_as_downstream_error(exc, storage, batch)
            raise
        self._done_ts, self._done_batch = batch.end_ts, batch.batch_id

    def write_frame(self, batch: MicroBatch, rows: BatchFrame) -> int | None:
        """The batch written by Spark from its frame (see :mod:`.batchframe`): the same tables
        as :meth:`write_batch`, no row on the driver. Declined (None), to go through
        ``write_batch``, when ``frame-writes`` does not take the batch (``auto``: a one-ts
        batch, an initial snapshot's, or one of more than :data:`AUTO_FRAME_ROWS` rows),
        for a batch with a RENAME TABLE and for catalog tables that may be merged."""
        storage = self._require_storage()
        auto = rows.one_ts or rows.expected_rows > AUTO_FRAME_ROWS
        wanted = self.config.frame_writes is True or (self.config.frame_writes == "auto" and auto)
        if not wanted or any(e.renamed_from is not None for e in batch.ddl):
            return None
        if self._may_merge():
            return None
        if self._written_before(batch):
            log.info("Spark sink: batch %d (end ts %d) was written before; skipped", batch.batch_id, batch.end_ts)
            return 0
        try:
            count = self._write_frame(storage, batch, rows)
            storage.write_checkpoint(self._changefeed, batch.batch_id, batch.end_ts, self._writer)
        except Exception as exc:
            _raise_as_downstream_error(exc, storage, batch)
            raise
        self._done_ts, self._done_batch = batch.end_ts, batch.batch_id
        return count

    def _write_frame(self, storage: Storage, batch: MicroBatch, rows: BatchFrame) -> int:
        """One pass of Spark tasks over the batch's rows makes every table's parts (see
        :mod:`.batchframe`), persisted for the batch; then each table is written from its own."""
        from pyspark.sql import functions as F

        ddl_of = ddl_by_table(batch.ddl)
        ddl_ts = {name: tuple(sorted(e.commit_ts for e in events)) for name, events in ddl_of.items()}
        mode = self.config.mode
        task = PartsTask(
            batch.batch_id,
            ddl_ts,
            changelog=mode in ("changelog", "both"),
            changes=mode != "changelog",
            key_columns={name: tuple(keys) for name, keys in self.config.key_columns.items()},
        )
        parts = rows.map_rows(task, PARTS_DDL).persist()
        try:
            found = read_parts([r.asDict() for r in parts.drop("payload").collect()])
            tables: dict[tuple[str, str], TableName] = {name: t.whole.table for name, t in found.items()}
            for name, events in ddl_of.items():
                tables.setdefault(name, events[-1].table or TableName(*name))
            writes = [
                functools.partial(
                    self._write_table_frame,
                    storage,
                    table,
                    found.get(name),
                    parts.where((F.col("schema_name") == name[0]) & (F.col("table_name") == name[1])),
                    ddl_of.get(name, []),
                    batch,
                )
                for name, table in tables.items()
            ]
            run_in_threads(self.spark, writes, self.config.write_threads)
        finally:
            parts.unpersist()
        return sum(t.whole.rows for t in found.values())

    def _write_table_frame(
        self,
        storage: Storage,
        table: TableName,
        found: TableRows | None,
        parts: Any,
        ddl: list[DDLEvent],
        batch: MicroBatch,
    ) -> None:
        """:meth:`_write_table` for rows in the batch's parts frame (``parts``: the table's)."""
        from pyspark.sql import functions as F

        base = table_dir(storage, table)
        if self.config.mode in ("changelog", "both") and found is not None and found.whole.rows:
            types = found.whole.types
            task = UnpackTask(changelog_columns(types), found.whole.offsets, "seq")
            # Spark's coalesce never adds partitions: a table of fewer rows than the batch's
            # partitions hold is written by fewer, larger tasks.
            writers = -(-found.whole.rows // self.config.write_task_rows)
            of_kind = parts.where(F.col("kind") == CHANGELOG).coalesce(writers)
            changelog = of_kind.mapInArrow(task, changelog_ddl(types))
            self._append_changelog(base, table, changelog, types)
        if self.config.mode == "changelog":
            return
        events = sorted(ddl, key=lambda d: d.commit_ts)
        steps: list[tuple[_Prepared | _FramePart, DDLEvent | None]] = []
        for step, event in enumerate([*events, None]):
            part = (found.steps.get(step) if found is not None else None) or Part(table)
            of_step = parts.where((F.col("kind") != CHANGELOG) & (F.col("step") == step))
            steps.append((_FramePart(of_step, part), event))
        self._write_snapshot(storage, table, steps, batch)

    def _require_storage(self) -> Storage:
        if self.storage is None:
            raise RuntimeError("SparkSink.write_batch called before open()")
        return self.storage

    # -- one table -------------------------------------------------------------

    def keys_of(self, table: TableName, rows: Sequence[RowChange]) -> tuple[str, ...]:
        """Key columns: the upstream's handle/primary key, else configured; empty for none."""
        for row in rows:
            if row.schema is not None:
                handle = row.schema.handle_key_columns() or tuple(
                    c.name for c in row.schema.columns if c.flags & ColumnInfo.PRIMARY_KEY
                )
                if handle:
                    return handle
        return self.config.keys_for(table.schema, table.table)

    def _write_table(
        self,
        storage: Storage,
        table: TableName,
        rows: list[RowChange],
        ddl: list[DDLEvent],
        batch: MicroBatch,
        *,
        renamed_from: TableName | None = None,
        moved: list[RowChange] | None = None,
        snapshot: bool = True,
    ) -> None:
        """The table's part of ``batch``: its rows, and its DDL at their place among them.

        ``renamed_from``: a DDL of the batch renamed the table from that name; its
        snapshot starts from the old name's, with ``moved`` (the old name's rows of
        the batch, all below the RENAME) applied first. ``snapshot=False``: only
        the change log (a name renamed away in this batch).
        """
        base = table_dir(storage, table)
        prepared = _Prepared.of(rows)
        if self.config.mode in ("changelog", "both") and rows:
            self._write_changelog(base, table, prepared.rows, prepared.types, batch.batch_id)
        if self.config.mode == "changelog" or not snapshot:
            return
        if moved:
            rows = [*moved, *rows]
            prepared = _Prepared.of(rows)
        steps = [(_Prepared.of(part) if ddl else prepared, event) for part, event in cut_at_ddl(rows, ddl)]
        if self._merges(table, rows, renamed_from):
            if renamed_from is not None:
                self._rename_catalog_table(renamed_from, table)
            self._merge_steps(table, steps)
            return
        self._write_snapshot(storage, table, steps, batch, renamed_from=renamed_from)

    def _write_snapshot(
        self,
        storage: Storage,
        table: TableName,
        steps: Sequence[tuple[_Prepared | _FramePart, DDLEvent | None]],
        batch: MicroBatch,
        *,
        renamed_from: TableName | None = None,
    ) -> None:
        """The table's next snapshot version: ``steps`` (runs of rows, each with the DDL after it)
        applied to the current one."""
        base = table_dir(storage, table)
        casts: list[tuple[DDLEvent, TargetColumn]] = []
        try:
            version = write_snapshot_version(
                self.spark,
                storage,
                f"{base}/snapshot",
                lambda existing: self._next_state(table, existing, steps, casts),
                end_ts=batch.end_ts,
                batch_id=batch.batch_id,
                keep_versions=self.config.keep_versions,
                seed_dir=f"{table_dir(storage, renamed_from)}/snapshot" if renamed_from is not None else None,
            )
        except Exception as exc:
            # Under ANSI, a cast Spark allows can still fail on a value, when the version is written.
            if casts and not isinstance(exc, CdcflowError) and _is_cast_failure(exc):
                event, column = casts[0]
                raise ddl_error(table, event, column, _first_line(exc)) from exc
            raise
        if version and self.config.catalog_database:
            self._register_snapshot(table, f"{base}/snapshot/{version}")

    def _next_state(
        self,
        table: TableName,
        existing: Any | None,
        steps: Sequence[tuple[_Prepared | _FramePart, DDLEvent | None]],
        casts: list[tuple[DDLEvent, TargetColumn]],
    ) -> Any | None:
        """The table after the batch: each run of rows applied, then the DDL that follows it."""
        state = existing
        for part, event in steps:
            if part.count:
                state = part.state(self, table)(state)
            if event is None or state is None:
                continue
            if _empties(event):
                state = state.limit(0)
            plan = column_plan([(f.name, f.dataType.simpleString()) for f in state.schema.fields], event)
            if plan is not None:
                log.info("Spark sink: %s follows %r (commit ts %d)", table, event.query, event.commit_ts)
                casts.extend((event, column) for column in plan.cast)
                state = evolve(state, plan, table)
        return state

    def _retire_snapshot(self, storage: Storage, table: TableName, batch: MicroBatch) -> None:
        """The snapshot of a name renamed away: an empty version, as after DROP TABLE (written
        after the new name's version, so a replay still finds the old state to start from)."""
        if self.config.mode == "changelog" or self._merges(table, []):
            return  # change logs stay; a catalog table that merges was renamed itself
        version = write_snapshot_version(
            self.spark,
            storage,
            f"{table_dir(storage, table)}/snapshot",
            lambda existing: existing.limit(0) if existing is not None else None,
            end_ts=batch.end_ts,
            batch_id=batch.batch_id,
            keep_versions=self.config.keep_versions,
        )
        if version and self.config.catalog_database:
            self._register_snapshot(table, f"{table_dir(storage, table)}/snapshot/{version}")

    def _rename_catalog_table(self, old: TableName, new: TableName) -> None:
        """ALTER TABLE … RENAME TO for a merged snapshot table (once: a replay finds it renamed)."""
        source, target = self._snapshot_table_name(old), self._snapshot_table_name(new)
        if provider_of(self.spark, target) is None and provider_of(self.spark, source) is not None:
            log.info("Spark sink: %s renamed to %s", source, target)
            self.spark.sql(f"ALTER TABLE {source} RENAME TO {target}")

    def _snapshot_table_name(self, table: TableName) -> str:
        return f"{self.config.catalog_database}.{_q(f'{table.schema}__{table.table}')}"

    def _may_merge(self) -> bool:
        """Whether some table's snapshot may be written with MERGE INTO (:meth:`_merges`)."""
        return bool(self.config.catalog_database) and self.config.table_format != "versioned"

    def _merges(self, table: TableName, rows: list[RowChange], renamed_from: TableName | None = None) -> bool:
        """Whether this table's snapshot is written with MERGE INTO (see :mod:`.merge`); a table
        renamed in this batch whose new name has no catalog table yet asks its old one."""
        fmt = self.config.table_format
        if not self._may_merge():
            return False
        if renamed_from is not None and provider_of(self.spark, self._snapshot_table_name(table)) is None:
            table = renamed_from
        if not self.keys_of(table, rows):
            if fmt == "merge" and rows:
                raise DownstreamUnavailableError(
                    f"Spark sink: {table} has no key, and MERGE INTO needs one; set key-columns for it",
                    detail={"table": str(table)},
                    retryable=Retryable.LATER,
                )
            return False
        provider = provider_of(self.spark, self._snapshot_table_name(table))
        if fmt == "merge":
            if provider is not None and provider not in MERGE_PROVIDERS:
                raise DownstreamUnavailableError(
                    f"Spark sink: catalog table {self._snapshot_table_name(table)} is {provider}, which does not "
                    "support MERGE INTO; create it as a Delta or Iceberg table, or set table-format: versioned",
                    detail={"table": str(table), "provider": provider},
                    retryable=Retryable.LATER,
                )
            return True
        return provider in MERGE_PROVIDERS

    def _merge_steps(self, table: TableName, steps: list[tuple[_Prepared, DDLEvent | None]]) -> None:
        """MERGE each run of rows, then ALTER the table for the DDL after it (statement by statement)."""
        target = self._snapshot_table_name(table)
        follows_ddl = len(steps) > 1
        for part, event in steps:
            if part.rows:
                self._merge_snapshot(table, part.rows, part.types, only_existing_columns=follows_ddl)
            if event is None or provider_of(self.spark, target) is None:
                continue
            if _empties(event):
                self.spark.sql(f"DELETE FROM {target}")
            current = [(f.name, f.dataType.simpleString()) for f in self.spark.table(target).schema.fields]
            plan = column_plan(current, event)
            if plan is not None:
                alter_table(self.spark, target, plan, table)

    def _merge_snapshot(
        self, table: TableName, rows: list[RowChange], types: dict[str, str], *, only_existing_columns: bool = False
    ) -> None:
        keys = self.keys_of(table, rows)
        target = self._snapshot_table_name(table)
        columns = list(types)
        if only_existing_columns and provider_of(self.spark, target) is not None:
            # A replay after the DDL was applied: the rows before it may name dropped or renamed columns.
            existing = {c.lower() for c in self.spark.table(target).columns}
            columns = [c for c in columns if c.lower() in existing]
        fields = ", ".join(f"{_q(c)} {t}" for c, t in types.items())
        changes = self.spark.createDataFrame(
            change_records(rows, columns, keys),
            schema=f"{fields}, _deleted boolean, _commit_ts bigint, _seq bigint",
            verifySchema=False,
        )
        latest = latest_per_key(changes, keys)
        if provider_of(self.spark, target) is None:
            # First batch: the table takes the session's default provider for CREATE TABLE.
            latest.filter("NOT _deleted").drop("_deleted", "_commit_ts", "_seq").writeTo(
                target.replace("`", "")
            ).create()
            return
        view = f"cdcflow_changes_{abs(hash(target))}"
        latest.createOrReplaceTempView(view)
        try:
            self.spark.sql(merge_sql(target, view, keys, columns))
        finally:
            self.spark.catalog.dropTempView(view)

    def _state_function(self, table: TableName, rows: list[RowChange], types: dict[str, str]) -> Any:
        columns = list(types)
        keys = self.keys_of(table, rows)
        fields = ", ".join(f"{_q(c)} {t}" for c, t in types.items())
        if not keys:
            deltas = self.spark.createDataFrame(
                delta_records(rows, columns), schema=f"{fields}, _delta bigint", verifySchema=False
            )
            return lambda existing: next_state_keyless(existing, deltas)
        changes = self.spark.createDataFrame(
            change_records(rows, columns, keys),
            schema=f"{fields}, _deleted boolean, _commit_ts bigint, _seq bigint",
            verifySchema=False,
        )
        return lambda existing: next_state(existing, latest_per_key(changes, keys), keys)

    def _write_changelog(
        self, base: str, table: TableName, rows: list[RowChange], types: dict[str, str], batch_id: int
    ) -> None:
        frame = self.spark.createDataFrame(
            changelog_records(rows, list(types), batch_id), schema=changelog_ddl(types), verifySchema=False
        )
        self._append_changelog(base, table, frame, types)

    def _append_changelog(self, base: str, table: TableName, frame: Any, types: dict[str, str]) -> None:
        """Write the batch's change log ``frame`` of ``table`` (replacing the batch's partitions)."""
        from pyspark.sql import functions as F

        path = f"{base}/changelog"
        by_writer = self._changelog_by_writer(path, table)
        partitions = ["commit_date", "writer", "batch_id"] if by_writer else ["commit_date", "batch_id"]
        if by_writer:
            frame = frame.withColumn("writer", F.lit(self._writer or LOCAL_WRITER))
        frame.write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy(*partitions).parquet(path)
        if self.config.catalog_database:
            self._register_changelog(table, path, types, by_writer)

    def _changelog_by_writer(self, path: str, table: TableName) -> bool:
        """The change log's layout, read once per table (see :meth:`Storage.changelog_by_writer`)."""
        by_writer = self._by_writer.get(path)
        if by_writer is None:
            by_writer = self._by_writer[path] = self._require_storage().changelog_by_writer(path)
            if not by_writer:
                log.warning(
                    "Spark sink: the change log of %s was made by an earlier version, partitioned by "
                    "(commit_date, batch_id) alone; it is written so, and another writer's batches of the "
                    "same ids and dates (a capture the table moves to, the changefeed created again under "
                    "this id) replace its partitions. Move each commit_date=D/batch_id=N directory to "
                    "commit_date=D/writer=%s/batch_id=N while no changefeed writes it to keep every "
                    "writer's batches (docs/how-to/replicate-to-spark-tables.md)",
                    table,
                    LOCAL_WRITER,
                )
        return by_writer

    def _register_changelog(self, table: TableName, path: str, types: dict[str, str], by_writer: bool) -> None:
        """The catalog table of the change log, re-created when the batch brings new columns or types.

        Its images keep every column any batch had (older rows read NULL in newer
        columns; newer rows in dropped ones), each with its latest type: Spark reads
        older files through a widened type (INT → BIGINT, FLOAT → DOUBLE …).
        """
        name = f"{self.config.catalog_database}.{_q(f'{table.schema}__{table.table}__changelog')}"
        image: dict[str, str] = {}
        if self.spark.catalog.tableExists(name.replace("`", "")):
            after = self.spark.table(name).schema["after"].dataType
            image = {f.name: f.dataType.simpleString() for f in after.fields}
            if all(image.get(c) == t for c, t in types.items()):
                self.spark.sql(f"ALTER TABLE {name} RECOVER PARTITIONS")
                return
            self.spark.sql(f"DROP TABLE {name}")  # external: the files stay
        image.update(types)
        struct = "struct<" + ", ".join(f"{_q(c)}: {t}" for c, t in image.items()) + ">"
        writer, partitions = (
            ("writer string, ", "commit_date, writer, batch_id") if by_writer else ("", "commit_date, batch_id")
        )
        self.spark.sql(
            f"CREATE TABLE {name} (op string, commit_ts bigint, start_ts bigint, seq bigint, before {struct}, "
            f"after {struct}, commit_date date, {writer}batch_id bigint) USING parquet PARTITIONED BY ({partitions}) "
            f"LOCATION {_literal(path)}"
        )
        self.spark.sql(f"ALTER TABLE {name} RECOVER PARTITIONS")

    def _register_snapshot(self, table: TableName, location: str) -> None:
        name = f"{self.config.catalog_database}.{_q(f'{table.schema}__{table.table}')}"
        if self.spark.catalog.tableExists(name.replace("`", "")):
            current = [(f.name, f.dataType) for f in self.spark.table(name).schema.fields]
            if current == [(f.name, f.dataType) for f in self.spark.read.parquet(location).schema.fields]:
                self.spark.sql(f"ALTER TABLE {name} SET LOCATION {_literal(location)}")
                self.spark.sql(f"REFRESH TABLE {name}")
                return
            self.spark.sql(f"DROP TABLE {name}")  # columns changed: re-create with the new schema
        self.spark.sql(f"CREATE TABLE {name} USING parquet LOCATION {_literal(location)}")


def _empties(ddl: DDLEvent) -> bool:
    """TRUNCATE TABLE and DROP TABLE leave the snapshot empty."""
    if ddl.table is None or not ddl.table.table:
        return False
    words = ddl.query.strip().upper().split()
    return (
        ddl.action_type in (_DROP_TABLE, _TRUNCATE_TABLE) or words[:1] == ["TRUNCATE"] or words[:2] == ["DROP", "TABLE"]
    )


def _raise_as_downstream_error(exc: Exception, storage: Storage, batch: MicroBatch) -> None:
    """A Spark or I/O error of a batch write, raised as DownstreamUnavailableError (2001,
    retried); other errors return, for the caller to raise as they are."""
    if _is_spark_or_io_error(exc):
        raise DownstreamUnavailableError(
            f"Spark sink cannot write batch {batch.batch_id} under {storage.root}: {exc}",
            detail={"batch_id": batch.batch_id, "root": storage.root},
        ) from exc


def _is_spark_or_io_error(exc: Exception) -> bool:
    """A failure of Spark, the JVM bridge or the file system (not a bug of ours)."""
    module = type(exc).__module__
    return isinstance(exc, OSError) or module.startswith(("py4j", "pyspark.errors"))


def _is_cast_failure(exc: Exception) -> bool:
    """A Spark error raised by a CAST on a value (ANSI mode), e.g. 'abc' to BIGINT."""
    text = str(exc)
    return any(f"[{kind}" in text for kind in ("CAST_INVALID_INPUT", "CAST_OVERFLOW", "NUMERIC_VALUE_OUT_OF_RANGE"))


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if "[" in line] or str(exc).splitlines() or [type(exc).__name__]
    return lines[0].strip()


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@hookimpl
def cdcflow_register_sinks(registry: Registrar[Sink[Any]]) -> None:
    registry.add(SparkSink)
