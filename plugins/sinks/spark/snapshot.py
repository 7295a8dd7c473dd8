"""Snapshot mode: a table's current state as a new version per batch.

For a batch touching a table, a Spark job takes the latest change per key
by ``(commit ts, order in the batch)``, removes every key it touched from
the current version, adds back the keys whose latest change is not a delete,
and writes the result as a new version directory named after the batch's
end ts. The version becomes visible when its ``_COMMITTED`` marker is
written (see :mod:`.storage`), so readers see the state as of one resolved
ts or the previous one, never a half-applied batch; a column DDL in the
batch (see :mod:`.evolve`) is part of the same version. A replayed batch
whose version already exists is skipped. A table without a key is kept as a
multiset: per distinct row, the old count plus inserts minus deletes.

Cost: each version rewrites the whole table (plain Parquet has no row-level
MERGE); fine for small and medium tables, and the price of not needing a
table format.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

from cdcflow.plugins.sinks.spark.storage import Storage, version_name

__all__ = ["latest_per_key", "next_state", "next_state_keyless", "read_snapshot", "write_snapshot_version"]


def latest_per_key(changes: Any, keys: Sequence[str]) -> Any:
    """One change per key: the one with the greatest (_commit_ts, _seq)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*[F.col(_q(k)) for k in keys]).orderBy(F.col("_commit_ts").desc(), F.col("_seq").desc())
    return changes.withColumn("_rank", F.row_number().over(order)).filter(F.col("_rank") == 1).drop("_rank")


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _aligned(frame: Any, like: Any) -> Any:
    """``frame`` with the columns it shares with ``like`` cast to ``like``'s types."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in like.schema.fields}
    return frame.select(
        *[
            F.col(_q(f.name)).cast(types[f.name]).alias(f.name) if f.name in types else F.col(_q(f.name))
            for f in frame.schema.fields
        ]
    )


def next_state(existing: Any | None, latest: Any, keys: Sequence[str]) -> Any:
    """The new table state: untouched rows of ``existing`` plus surviving latest images."""
    from pyspark.sql import functions as F

    upserts = latest.filter(~F.col("_deleted")).drop("_deleted", "_commit_ts", "_seq")
    if existing is None:
        return upserts
    touched = latest.select(*[F.col(_q(k)) for k in keys])
    condition = functools.reduce(operator.and_, [existing[_q(k)].eqNullSafe(touched[_q(k)]) for k in keys])
    survivors = existing.join(touched, condition, "left_anti")
    return survivors.unionByName(_aligned(upserts, existing), allowMissingColumns=True)


def next_state_keyless(existing: Any | None, deltas: Any) -> Any:
    """A table without a key is a multiset: per distinct row, old count + inserts − deletes."""
    from pyspark.sql import functions as F

    columns = [c for c in deltas.columns if c != "_delta"]
    if existing is not None:
        deltas = _aligned(deltas, existing).unionByName(
            existing.withColumn("_delta", F.lit(1).cast("bigint")), allowMissingColumns=True
        )
    counts = deltas.groupBy(*[F.col(_q(c)) for c in deltas.columns if c != "_delta"]).agg(
        F.sum("_delta").alias("_count")
    )
    survivors = counts.filter(F.col("_count") > 0)
    exploded = survivors.withColumn("_copy", F.explode(F.array_repeat(F.lit(1), F.col("_count").cast("int"))))
    ordered = [c for c in (existing.columns if existing is not None else []) if c != "_delta"]
    ordered += [c for c in columns if c not in ordered]
    return exploded.select(*[F.col(_q(c)) for c in ordered])


def write_snapshot_version(
    spark: Any,
    storage: Storage,
    snapshot_dir: str,
    compute: Callable[[Any | None], Any | None],
    *,
    end_ts: int,
    batch_id: int,
    keep_versions: int,
    seed_dir: str | None = None,
) -> str | None:
    """Write and commit the version for ``end_ts``; None when it exists already or nothing changed.

    ``compute(existing)`` returns the new state from the current one (None
    before the first version); returning ``existing`` itself, or None, means
    that the batch changed nothing (a DDL that leaves the columns as they are).
    With ``seed_dir`` the current state is that directory's current version
    instead (a renamed table: the state it had under its old name).
    """
    version = version_name(end_ts)
    current = storage.current_version(snapshot_dir)
    if current is not None and current >= version:
        return None
    source_dir = seed_dir or snapshot_dir
    source = storage.current_version(seed_dir) if seed_dir else current
    existing = spark.read.parquet(f"{source_dir}/{source}") if source else None
    state = compute(existing)
    if state is None or (state is existing and seed_dir is None):
        return None
    state.write.mode("overwrite").parquet(f"{snapshot_dir}/{version}")
    storage.commit_version(snapshot_dir, version, {"batch-id": batch_id, "resolved-ts": end_ts})
    storage.prune_versions(snapshot_dir, keep_versions)
    return version


def read_snapshot(spark: Any, storage: Storage, snapshot_dir: str) -> Any | None:
    """The table's current state as a DataFrame (None before the first version)."""
    current = storage.current_version(snapshot_dir)
    return spark.read.parquet(f"{snapshot_dir}/{current}") if current else None
