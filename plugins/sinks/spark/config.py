"""Options of the Spark table sink and how ``spark://`` URIs map onto them.

``spark://`` alone writes under the session's warehouse directory
(``server.spark.warehouse-dir``, ``./data/lake`` by default);
``spark:///abs/dir`` and ``spark://./rel/dir`` name another directory; any
Hadoop file-system URI (``hdfs://…``, ``s3a://…``) goes in ``path``.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field

from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin import PluginConfig

__all__ = ["SparkSinkConfig", "path_of"]


class SparkSinkConfig(PluginConfig):
    """Options of the Spark table sink."""

    uri: str = Field("", description="Sink URI: spark:// (warehouse dir), spark:///abs/dir or spark://./rel/dir.")
    path: str = Field(
        "", description="Root directory of the tables (any Hadoop URI); empty: the Spark warehouse directory."
    )
    mode: Literal["changelog", "snapshot", "both"] = Field(
        "both", description="changelog: every change appended; snapshot: current state per table; both."
    )
    key_columns: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Key columns per table ('schema.table': [cols]) when the upstream schema does not say; "
        "a table with neither is keyed on all its columns.",
    )
    keep_versions: int = Field(3, ge=1, description="Snapshot versions kept per table (readers may be on an old one).")
    table_format: Literal["auto", "versioned", "merge"] = Field(
        "auto",
        description="Snapshot writes: versioned Parquet directories, MERGE INTO a catalog table (Delta/Iceberg), "
        "or auto: MERGE when the catalog table exists with a delta/iceberg provider, else versioned.",
    )
    catalog_database: str = Field(
        "", description="Also register the tables in this Spark catalog database (catalog.db or db); empty: do not."
    )
    frame_writes: bool | Literal["auto"] = Field(
        "auto",
        description=(
            "Write batches from their Spark frame (rows decoded by Spark tasks, no row on the driver), "
            "the way that scales with a cluster's executors. true: every batch; auto: an initial "
            "snapshot's batch and batches of more than 50,000 rows (a catch-up's), written faster "
            "from their frame even on one machine; false: none. auto leaves smaller micro-batches "
            "to the driver because on one machine that is faster "
            "(docs/explanation/log-service-and-pipeline.md)."
        ),
    )
    write_threads: int = Field(
        4,
        ge=1,
        description=(
            "Tables of a batch written at once, from its frame or from the driver (each table's Spark jobs "
            "from a thread of their own, so that one table's tasks run while another's write is planned and "
            "committed; a batch that renames a table, or whose tables may be merged into catalog tables, "
            "writes one after the other); 1: one table after the other."
        ),
    )
    write_task_rows: int = Field(
        50_000,
        ge=1,
        description=(
            "Rows per Spark task of a table's change-log write from its frame: a table with fewer rows in "
            "the batch is written by one task, a larger one by one task per this many rows (at most as many "
            "tasks as made the batch's rows). Each task costs its start, its own Parquet files and their "
            "commit, so small tasks write fewer rows per second."
        ),
    )
    master: str = Field("local[*]", description="spark.master when the sink has to start a Spark session itself.")
    warehouse_dir: str = Field(
        "./data/lake", description="spark.sql.warehouse.dir when the sink has to start a Spark session itself."
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="Extra Spark properties when the sink starts the session itself."
    )

    def keys_for(self, schema: str, table: str) -> tuple[str, ...]:
        return tuple(self.key_columns.get(f"{schema}.{table}", ()))


def path_of(config: SparkSinkConfig) -> str:
    """The root directory named by ``uri`` or ``path``; empty for "the warehouse"."""
    if not config.uri:
        return config.path
    parts = urlsplit(config.uri)
    if parts.scheme != "spark":
        raise ConfigInvalidError(f"Spark sink URI must start with spark://, got {config.uri!r}")
    raw = unquote(parts.path)
    if parts.netloc == ".":
        return "." + raw
    if parts.netloc:
        raise ConfigInvalidError(
            f"Spark sink URI {config.uri!r} names host {parts.netloc!r}; write spark:///absolute/dir, "
            "spark://./relative/dir, or put an hdfs:// or s3a:// URI in 'path'"
        )
    return raw if raw not in ("", "/") else config.path


def describe_issues(config: SparkSinkConfig) -> list[tuple[str, str]]:
    issues: list[tuple[str, str]] = []
    try:
        path_of(config)
    except ConfigInvalidError as exc:
        issues.append(("uri", exc.message))
    if config.table_format == "merge" and not config.catalog_database:
        issues.append(("table-format", "merge needs catalog-database: MERGE INTO writes to catalog tables"))
    for name, cols in config.key_columns.items():
        if name.count(".") != 1 or not cols:
            issues.append(("key-columns", f"{name!r}: write 'schema.table': [column, ...]"))
    return issues
