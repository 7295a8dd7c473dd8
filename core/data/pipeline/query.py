"""The parts of a changefeed's query that Spark evaluates: the table filter as a
column predicate, and the micro-batch's order."""

from __future__ import annotations

from typing import Any

from cdcflow.core.data.filter import SYSTEM_SCHEMAS, TableFilter
from cdcflow.core.data.logservice.records import KIND_RAW

__all__ = ["ORDER_COLUMNS", "table_filter_predicate"]

#: A micro-batch's rows are delivered in this order (the event store's order).
ORDER_COLUMNS = ("commit_ts", "start_ts", "key")


def table_filter_predicate(table_filter: TableFilter) -> Any:
    """A Spark column that keeps rows of replicated tables (the last matching rule
    decides, as in :meth:`TableFilter.matches`). Raw key-value events pass: their
    table is known only after mounting, and the driver filters them then."""
    from pyspark.sql import functions as F

    decision = F.lit(False)
    for exclude, schema_re, table_re, ignore_case in table_filter.patterns():
        flags = "(?i)" if ignore_case else ""
        match = F.col("schema_name").rlike(f"{flags}^(?:{schema_re})$") & F.col("table_name").rlike(
            f"{flags}^(?:{table_re})$"
        )
        decision = F.when(match, F.lit(not exclude)).otherwise(decision)
    system = F.lower(F.col("schema_name")).isin(sorted(SYSTEM_SCHEMAS))
    return (F.col("kind") == F.lit(KIND_RAW)) | (~system & decision)
