"""The parts of a changefeed's query that Spark evaluates: the table filter as a
column predicate, the micro-batch's order, and where a batch's lanes are written."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any, TypeVar

from cdcflow.core.data.filter import SYSTEM_SCHEMAS, TableFilter
from cdcflow.core.data.logservice.records import KIND_RAW

__all__ = [
    "ARROW_ORDER",
    "ORDER_COLUMNS",
    "WHOLE_LANES_SLACK",
    "deal_largest_first",
    "lane_placement",
    "spark_int_hash",
    "table_filter_predicate",
    "whole_lane_shares",
]

#: A micro-batch's rows are delivered in this order (the event store's order).
ORDER_COLUMNS = ("commit_ts", "start_ts", "key")
#: The same order as Arrow's ``sort_by`` takes it (keys compared as unsigned bytes, as Spark does).
ARROW_ORDER = tuple((column, "ascending") for column in ORDER_COLUMNS)
#: How far over an even share of a batch's rows the busiest task may be when tasks take
#: whole lanes (:func:`whole_lane_shares`). A row written in one step costs about 11.5 µs
#: of a task's CPU, in two (encode, then the lane's parts handed to a lane task) about
#: 14.8 µs (``benchmarks/bench_rowpath.py``: task, encode step and lane step, per CPU-second),
#: and the second step is a Spark job of its own per batch. A catch-up of the shop tables to
#: a 3-partition topic (two tables on one partition: shares of 2/3 and 1/3 on two tasks) ran
#: at 65,198 and 72,740 rows/s in one step against 50,656 and 52,155 in two
#: (``benchmarks/bench_catchup.py --sinks kafka --masters local[2]``, alternating runs).
WHOLE_LANES_SLACK = 1.5

_K = TypeVar("_K", bound=Hashable)
#: A lane of a batch: (writer, route, lane), the writer its index among the batch's task writers.
Lane = tuple[int, str, int]


def deal_largest_first(sizes: Mapping[_K, int], tasks: int) -> list[tuple[int, list[_K]]]:
    """``sizes``' keys dealt to at most ``tasks`` tasks, the largest first, each to the task
    with the least so far (ties: the earlier task, and the smaller key first): each
    task's total and keys. Fewer tasks than ``tasks`` when there are fewer keys."""
    shares: list[tuple[int, list[_K]]] = [(0, []) for _ in range(min(tasks, len(sizes)))]
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        i = min(range(len(shares)), key=lambda n: shares[n][0])
        shares[i] = (shares[i][0] + sizes[key], [*shares[i][1], key])
    return shares


def whole_lane_shares(
    files: Sequence[tuple[str, int, Collection[Lane] | None]], tasks: int, slack: float = WHOLE_LANES_SLACK
) -> list[list[str]] | None:
    """A batch's files dealt to at most ``tasks`` tasks so that each lane is written by
    one task, which sorts its share and writes it in one step; or None when that does
    not pay or cannot be known. ``files``: each file's path, rows, and the lanes its rows
    may go to (None: not known before they are mounted and routed).

    Files whose lanes meet are one group (the spans of a table; tables dispatched to one
    Kafka partition, or sharing a topic whose partitions are chosen per row), and groups
    are dealt as :func:`deal_largest_first` deals them. None when a file with rows has
    lanes not known, fewer than two tasks would get rows, or the busiest would hold more
    than ``slack`` times an even share (:data:`WHOLE_LANES_SLACK`). Each share lists its
    files in the batch's order."""
    group = list(range(len(files)))

    def root(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    first_of: dict[Lane, int] = {}
    for i, (_, rows, lanes) in enumerate(files):
        if not rows:
            continue
        if lanes is None:
            return None
        for lane in lanes:
            group[root(i)] = root(first_of.setdefault(lane, i))
    members: dict[int, list[int]] = {}
    for i, (_, rows, _) in enumerate(files):
        if rows:
            members.setdefault(root(i), []).append(i)
    sizes = {g: sum(files[i][1] for i in items) for g, items in members.items()}
    dealt = deal_largest_first(sizes, tasks)
    if len(dealt) < 2 or max(total for total, _ in dealt) > slack * sum(sizes.values()) / tasks:
        return None
    return [[files[i][0] for i in sorted(i for g in groups for i in members[g])] for _, groups in dealt]


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


_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def spark_int_hash(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of one INT column (Murmur3 x86 32-bit of the 4-byte value,
    seed 42), as a signed 32-bit int: what ``repartition(n, column)`` places a row by,
    in partition ``pmod(hash, n)``."""
    k = (value & _MASK) * 0xCC9E2D51 & _MASK
    k = _rotl(k, 15) * 0x1B873593 & _MASK
    h = _rotl(seed & _MASK ^ k, 13)
    h = (h * 5 + 0xE6546B64) & _MASK
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & _MASK
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _MASK
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def _partition_keys(partitions: int) -> list[int]:
    """For each partition ``p`` of ``partitions``, the least int that Spark's hash
    partitioning places in ``p``."""
    keys: dict[int, int] = {}
    value = 0
    while len(keys) < partitions:
        keys.setdefault(spark_int_hash(value) % partitions, value)
        value += 1
    return [keys[p] for p in range(partitions)]


def lane_placement(partitions: int) -> Any:
    """A Spark column to ``repartition(partitions, ...)`` a batch's encoded parts by:
    the lanes of a route (a Kafka topic's partitions, numbered 0…) go round-robin to
    the tasks, from an offset of the route's CRC-32, so that every lane is written by
    one task and the tasks get as even a share of lanes as there can be. Hashing
    ``(writer, route, lane)`` instead places lanes at random: 3 lanes on 2 tasks land
    all on one task in a quarter of the batches. (Lanes handed over through files are
    shared out by their size instead: :class:`~cdcflow.core.data.pipeline.tasks.LaneHandOff`.)"""
    from pyspark.sql import functions as F

    task = F.pmod(F.col("writer") + F.col("lane") + F.crc32(F.col("route").cast("binary")), F.lit(partitions))
    keys = F.array(*(F.lit(k).cast("int") for k in _partition_keys(partitions)))
    return F.element_at(keys, (task + 1).cast("int"))
