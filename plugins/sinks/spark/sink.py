"""The ``spark`` sink: change tables and current-state tables in Parquet.

``changelog`` mode appends every row change of a table to
``{root}/{schema}/{table}/changelog`` — columns ``op``, ``commit_ts``,
``start_ts``, ``seq`` (order in the batch), ``before`` and ``after`` (structs
of the table's columns) — partitioned by ``commit_date`` (UTC day of the
commit ts) and ``batch_id``. A batch is written with dynamic partition
overwrite, so writing it again replaces exactly its own partitions
(idempotent per batch id).

``snapshot`` mode keeps ``{root}/{schema}/{table}/snapshot`` equal to the
upstream table as of the last applied resolved ts (see :mod:`.snapshot`).

After every batch the sink records ``{batch-id, resolved-ts}`` in
``{root}/_cdcflow/{changefeed}/checkpoint.json``; a replayed batch at or
below it is skipped. With ``catalog-database`` set, the tables are also
registered in that Spark catalog database (``{schema}__{table}`` and
``{schema}__{table}__changelog``), the snapshot table's location switched to
each new version.

``table-format``: with a catalog whose tables support ``MERGE INTO`` (Delta
Lake, Iceberg) the snapshot is merged into the catalog table instead of
written as versions (see :mod:`.merge`); ``auto`` detects it from the
existing table's provider. Plain Parquet never supports it.

Not guaranteed: DDL other than TRUNCATE and DROP TABLE is not interpreted —
new columns appear when rows carry them, and dropped columns stay in the
snapshot's old rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cdcflow.core.errors import DownstreamUnavailableError, Retryable
from cdcflow.core.events import ColumnInfo, DDLEvent, MicroBatch, RowChange, TableName
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.sink import Sink, SinkContext
from cdcflow.plugins.sinks.spark.config import SparkSinkConfig, describe_issues, path_of
from cdcflow.plugins.sinks.spark.frames import (
    change_records,
    changelog_records,
    decimal_ints,
    delta_records,
    image_columns,
)
from cdcflow.plugins.sinks.spark.merge import MERGE_PROVIDERS, merge_sql, provider_of
from cdcflow.plugins.sinks.spark.session import spark_session
from cdcflow.plugins.sinks.spark.snapshot import latest_per_key, next_state, next_state_keyless, write_snapshot_version
from cdcflow.plugins.sinks.spark.storage import Storage

__all__ = ["SparkSink", "cdcflow_register_sinks", "table_dir"]

log = logging.getLogger(__name__)

#: TiDB action types (Open Protocol §2.6) that empty a table.
_DROP_TABLE, _TRUNCATE_TABLE = 4, 11


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_dir(storage: Storage, table: TableName) -> str:
    return storage.path(table.schema, table.table)


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
        self._done_ts = 0

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, SparkSinkConfig)
        return describe_issues(config)

    def open(self, context: SinkContext) -> None:
        cfg = self.config
        self.spark = spark_session(cfg.master, cfg.warehouse_dir, cfg.spark_conf)
        root = path_of(cfg) or str(self.spark.conf.get("spark.sql.warehouse.dir"))
        self.storage = Storage(self.spark, root)
        self._changefeed = context.changefeed_id
        self._done_ts = int(self.storage.checkpoint(self._changefeed).get("resolved-ts", 0))
        if cfg.catalog_database:
            self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {cfg.catalog_database}")
        log.info("Spark sink writing %s tables under %s (done up to ts %d)", cfg.mode, root, self._done_ts)

    def write_batch(self, batch: MicroBatch) -> None:
        storage = self._require_storage()
        if 0 < batch.end_ts <= self._done_ts:
            log.info("Spark sink: batch %d (end ts %d) was written before; skipped", batch.batch_id, batch.end_ts)
            return
        try:
            by_table: dict[TableName, list[RowChange]] = {}
            for row in batch.rows:
                by_table.setdefault(row.table, []).append(row)
            # A TRUNCATE/DROP at the batch's end makes the rows before it moot for the snapshot.
            emptied = {d.table for d in batch.ddl if d.table is not None and _empties(d)}
            for table, rows in by_table.items():
                self._write_table(storage, table, rows, batch, emptied=table in emptied)
            for ddl in batch.ddl:
                if ddl.table in emptied and self.config.mode != "changelog":
                    self._empty_snapshot(storage, ddl.table, batch)
            storage.write_checkpoint(self._changefeed, batch.batch_id, batch.end_ts)
        except Exception as exc:
            if not _is_spark_or_io_error(exc):
                raise
            raise DownstreamUnavailableError(
                f"Spark sink cannot write batch {batch.batch_id} under {storage.root}: {exc}",
                detail={"batch_id": batch.batch_id, "root": storage.root},
            ) from exc
        self._done_ts = batch.end_ts

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
        self, storage: Storage, table: TableName, rows: list[RowChange], batch: MicroBatch, *, emptied: bool
    ) -> None:
        types = image_columns(rows)
        rows = decimal_ints(rows, types)
        base = table_dir(storage, table)
        if self.config.mode in ("changelog", "both"):
            self._write_changelog(base, table, rows, types, batch.batch_id)
        if self.config.mode in ("snapshot", "both") and not emptied and self._merges(table, rows):
            self._merge_snapshot(table, rows, types)
        elif self.config.mode in ("snapshot", "both") and not emptied:
            version = write_snapshot_version(
                self.spark,
                storage,
                f"{base}/snapshot",
                self._state_function(table, rows, types),
                end_ts=batch.end_ts,
                batch_id=batch.batch_id,
                keep_versions=self.config.keep_versions,
            )
            if version and self.config.catalog_database:
                self._register_snapshot(table, f"{base}/snapshot/{version}")

    def _snapshot_table_name(self, table: TableName) -> str:
        return f"{self.config.catalog_database}.{_q(f'{table.schema}__{table.table}')}"

    def _merges(self, table: TableName, rows: list[RowChange]) -> bool:
        """Whether this table's snapshot is written with MERGE INTO (see :mod:`.merge`)."""
        fmt = self.config.table_format
        if fmt == "versioned" or not self.config.catalog_database:
            return False
        if not self.keys_of(table, rows):
            if fmt == "merge":
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

    def _merge_snapshot(self, table: TableName, rows: list[RowChange], types: dict[str, str]) -> None:
        keys = self.keys_of(table, rows)
        columns = list(types)
        fields = ", ".join(f"{_q(c)} {t}" for c, t in types.items())
        changes = self.spark.createDataFrame(
            change_records(rows, columns, keys),
            schema=f"{fields}, _deleted boolean, _commit_ts bigint, _seq bigint",
            verifySchema=False,
        )
        latest = latest_per_key(changes, keys)
        target = self._snapshot_table_name(table)
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
        image = "struct<" + ", ".join(f"{_q(c)}: {t}" for c, t in types.items()) + ">"
        schema = (
            f"op string, commit_ts bigint, start_ts bigint, seq bigint, before {image}, after {image}, "
            "commit_date date, batch_id bigint"
        )
        frame = self.spark.createDataFrame(
            changelog_records(rows, list(types), batch_id), schema=schema, verifySchema=False
        )
        path = f"{base}/changelog"
        (
            frame.write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy("commit_date", "batch_id")
            .parquet(path)
        )
        if self.config.catalog_database:
            name = f"{self.config.catalog_database}.{_q(f'{table.schema}__{table.table}__changelog')}"
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING parquet LOCATION {_literal(path)}")
            self.spark.sql(f"ALTER TABLE {name} RECOVER PARTITIONS")

    def _register_snapshot(self, table: TableName, location: str) -> None:
        name = f"{self.config.catalog_database}.{_q(f'{table.schema}__{table.table}')}"
        if self.spark.catalog.tableExists(name.replace("`", "")):
            current = set(self.spark.table(name).columns)
            if current == set(self.spark.read.parquet(location).columns):
                self.spark.sql(f"ALTER TABLE {name} SET LOCATION {_literal(location)}")
                self.spark.sql(f"REFRESH TABLE {name}")
                return
            self.spark.sql(f"DROP TABLE {name}")  # columns changed: re-create with the new schema
        self.spark.sql(f"CREATE TABLE {name} USING parquet LOCATION {_literal(location)}")

    # -- DDL ---------------------------------------------------------------------

    def _empty_snapshot(self, storage: Storage, table: TableName, batch: MicroBatch) -> None:
        if self.config.catalog_database and self.config.table_format != "versioned":
            target = self._snapshot_table_name(table)
            if provider_of(self.spark, target) in MERGE_PROVIDERS:
                self.spark.sql(f"DELETE FROM {target}")
                return
        write_snapshot_version(
            self.spark,
            storage,
            f"{table_dir(storage, table)}/snapshot",
            None,
            end_ts=batch.end_ts,
            batch_id=batch.batch_id,
            keep_versions=self.config.keep_versions,
        )


def _empties(ddl: DDLEvent) -> bool:
    """TRUNCATE TABLE and DROP TABLE leave the snapshot empty."""
    if ddl.table is None or not ddl.table.table:
        return False
    words = ddl.query.strip().upper().split()
    return (
        ddl.action_type in (_DROP_TABLE, _TRUNCATE_TABLE) or words[:1] == ["TRUNCATE"] or words[:2] == ["DROP", "TABLE"]
    )


def _is_spark_or_io_error(exc: Exception) -> bool:
    """A failure of Spark, the JVM bridge or the file system (not a bug of ours)."""
    module = type(exc).__module__
    return isinstance(exc, OSError) or module.startswith(("py4j", "pyspark.errors"))


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@hookimpl
def cdcflow_register_sinks(registry: Registrar[Sink[Any]]) -> None:
    registry.add(SparkSink)
