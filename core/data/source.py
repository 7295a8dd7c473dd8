"""What a source plugin is: long-lived feeds of changes per span.

A source connects to one upstream (a TiKV cluster through PD, a CockroachDB
cluster, an in-memory list in tests). The log service asks it which spans a
changefeed's table filter covers, opens one feed per span from a start ts,
and turns the feed into resolved chunks (ARCHITECTURE.md, "Log service").

Guarantees a feed must give (they are what makes the checkpoint safe):

* every change with ``commit_ts > start_ts`` in the span is yielded at least
  once; a change may repeat after a reconnect, never go missing;
* after ``ResolvedEvent(span, t)`` no change with ``commit_ts <= t`` follows;
* resolved timestamps of a span never go backwards.

Not guaranteed: order between changes of different keys before they are
resolved (the event store sorts), or exactly-once delivery.

Sources whose table set changes while a changefeed runs (TiDB: CREATE,
DROP, TRUNCATE, RENAME TABLE) implement three more hooks, which the
changefeed's maintainer uses to follow it (docs/explanation/control-plane.md,
"Tables that come and go"):

* :meth:`Source.trigger_span` — the *table-trigger span*, scheduled like any
  other span: its feed yields the DDL that no table's feed can carry (the
  creation of a table, schema-level DDL) and the DDL resolved ts, so that a
  changefeed whose filter matches no table yet still advances;
* :meth:`Source.tables_at` — the tables that existed at a past ts (where a
  changefeed resumes);
* :meth:`Source.table_changes` — each table-set change with its commit ts,
  and how far the changes are known (resolved ts).

Sources without them (raw key-value spans, the test kit's list source) have a
fixed table set: :meth:`list_tables` once, at the start.

Sources that can read their tables as of one ts (TiKV's transactional scan)
implement :meth:`Source.snapshot_plan`, which a changefeed with
``initial-snapshot: true`` uses to copy every row of its tables as of its
start ts before it streams the changes above it
(docs/how-to/start-from-a-full-copy.md): the plan is a list of picklable
:class:`SnapshotTask` s, each read in its own Spark task, whose records (the
event store's record format, commit ts and start ts = the snapshot ts, op
insert) the pipeline mounts and writes like one batch. A source that cannot
do it says why in :meth:`Source.snapshot_refusal`, and a connector asking for
it is refused at validation (1001).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from cdcflow.core.control.gc.keeper import GCSafepointKeeper
from cdcflow.core.data.events import (
    InsertRun,
    RawKVEvent,
    ResolvedEvent,
    RowChange,
    SourceEvent,
    Span,
    TableName,
    TableSchema,
    TableSetChange,
)
from cdcflow.core.metrics import FeedStats
from cdcflow.core.plugin.base import ConfigT, Plugin, PluginConfig

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["BatchMounter", "Mounter", "SnapshotPlan", "SnapshotTask", "Source"]


class SnapshotTask(abc.ABC):
    """One part of an initial snapshot (a key range of a table), read in one Spark task.

    **Picklable**: it carries what reading needs (addresses, credentials, the
    range, the ts), not connections; Spark's Python workers unpickle it and
    call :meth:`read`. Reading the same task again gives the same records.
    """

    @abc.abstractmethod
    def read(self) -> Iterator[pa.RecordBatch]:
        """The rows of the part as of the snapshot ts, as record batches of the event
        store's record schema (:data:`~cdcflow.core.data.logservice.records.ARROW_SCHEMA`):
        raw key-value records (mounted by the pipeline with the schema at the ts) or row
        records, each with commit ts and start ts = the snapshot ts and the span id the
        plan was asked for. Raises a CdcflowError (retryable when the upstream may
        recover: the phase is retried, the parts already read are kept)."""

    def key_range(self) -> Span | None:
        """The table and raw key range ``[start, end)`` this part reads, or None when the
        source cannot say. A changefeed on a cluster of captures places the parts of its
        snapshot on the captures by these ranges (:mod:`cdcflow.core.data.snapshot_ranges`);
        a plan with a part that names none is read by one capture."""
        return None


@dataclass(frozen=True)
class SnapshotPlan:
    """What :meth:`Source.snapshot_plan` returns: the parts of one snapshot, in key order."""

    ts: int
    tasks: Sequence[SnapshotTask]
    #: Shown to users (progress, logs): what a part is (``region``, ``range``).
    unit: str = "range"


class BatchMounter(abc.ABC):
    """Turns the raw key-value changes of one micro-batch into rows, inside a Spark task.

    A batch mounter is **picklable and pure**: it holds everything decoding
    needs for commit timestamps in its batch's range (the table schemas valid
    there), makes no call back into the capture, and the same event always
    gives the same row. The pipeline ships it to Spark's Python workers with
    the batch, where each partition mounts its own events, in parallel.
    """

    @abc.abstractmethod
    def mount(self, event: RawKVEvent) -> RowChange | None:
        """The row change for ``event`` (schema valid at ``commit_ts - 1``), or None
        for keys that are not rows of a replicated table. Raises a
        :class:`~cdcflow.core.errors.CdcflowError` naming table, key and commit ts
        when the value cannot be decoded."""

    def mount_many(self, events: Sequence[RawKVEvent]) -> list[RowChange | None]:
        """:meth:`mount` of each event, in order (one list entry per event).

        Tasks hand a mounter all the raw events of an Arrow batch at once; a
        mounter that decodes many rows of one table and schema version faster
        together overrides this. The default mounts one event at a time.
        """
        return [self.mount(event) for event in events]

    def mount_inserts(
        self, span: Span, keys: Sequence[bytes], values: Sequence[bytes], commit_ts: int, start_ts: int
    ) -> InsertRun | None:
        """The rows of the puts of ``keys`` with ``values`` (no old values), all of one span
        and committed at ``commit_ts`` (an initial snapshot's pairs), as one
        :class:`~cdcflow.core.data.events.InsertRun` — the same rows, in the same order,
        :meth:`mount_many` gives them — when every one is an insert of one table and schema
        version that the mounter decodes together. None (the default) for any other:
        the caller mounts them with :meth:`mount_many`, which also raises the coded error
        of a row that does not decode."""
        return None

    @abc.abstractmethod
    def schemas(self) -> Sequence[TableSchema]:
        """Every table schema that the rows :meth:`mount` returns may carry (the
        driver registers them before the batch runs, so rows mounted in tasks
        refer to them by id)."""


class Mounter(abc.ABC):
    """Turns raw key-value changes into rows (TiDB keys and rowcodec values, …)."""

    async def for_batch(self, start_ts: int, end_ts: int) -> BatchMounter | None:
        """A :class:`BatchMounter` for the events committed in ``(start_ts, end_ts]``.

        Called on the capture's event loop before a micro-batch runs; it may wait
        until the schemas of that range are known (every DDL below ``end_ts``
        applied). Returns None when this mounter can only run on the capture
        (the default, for mounters written before batch mounting): the pipeline
        then mounts that batch on the driver with :meth:`mount`, one event at a
        time, which does not scale with Spark's executors.
        """
        return None

    @abc.abstractmethod
    async def mount(self, event: RawKVEvent) -> RowChange | None:
        """The row change for ``event``, using the schema valid at ``commit_ts - 1``.

        Returns None for keys that are not rows of a replicated table (index
        keys, system tables). Raises a :class:`~cdcflow.core.errors.CdcflowError`
        naming table, key and commit ts when the value cannot be decoded.
        """


class Source(Plugin[ConfigT], abc.ABC):
    """Base class of source plugins. Methods are coroutines; the log service
    runs them on the capture's event loop."""

    #: Whether feeds yield :class:`RawKVEvent` (and need :meth:`mounter`) or rows.
    yields_raw_kv: ClassVar[bool] = False

    async def open(self) -> None:
        """Connect to the upstream. Called once before any other coroutine."""

    async def close(self) -> None:
        """Release connections; open feeds end. Not called on abrupt shutdown."""

    @abc.abstractmethod
    async def list_tables(self) -> Sequence[TableName]:
        """Every table the upstream has now (the table filter is applied by the caller)."""

    @abc.abstractmethod
    async def spans_for(self, table: TableName) -> Sequence[Span]:
        """The spans that hold ``table``'s rows (usually one per table)."""

    @abc.abstractmethod
    async def table_schema(self, table: TableName, ts: int) -> TableSchema:
        """The schema of ``table`` valid at ``ts``."""

    @abc.abstractmethod
    def feed(self, span: Span, start_ts: int) -> AsyncIterator[SourceEvent]:
        """Changes of ``span`` with commit ts above ``start_ts``, and resolved timestamps.

        The iterator runs until cancelled or closed; it reconnects by itself on
        retryable upstream errors and raises a CdcflowError on fatal ones.
        """

    def mounter(self) -> Mounter | None:
        """The mounter for raw key-value events, or None if feeds yield rows."""
        return None

    async def prepare_mounter(self, ts: int) -> None:
        """Make :meth:`mounter` decode every event committed after ``ts``.

        Called once after :meth:`open` and before the first :meth:`feed`, with
        the lowest commit ts the log service may still mount: after a restart
        it mounts its stored, not yet flushed events again, which can be older
        than the start ts of the feeds it resumes. A source whose decoding
        depends on history (TiDB's schemas over time) loads that history from
        ``ts``; the default does nothing.
        """

    # -- a table set that changes (optional) ----------------------------------------------

    def trigger_span(self) -> Span | None:
        """The table-trigger span, or None when the table set never changes (the default).

        A changefeed replicates it like a table's span, on one capture. Its
        :meth:`feed` yields the :class:`DDLEvent` s no table's feed carries
        (the creation of a table: no feed of it exists yet; schema-level DDL)
        and resolved timestamps that follow the upstream's DDL, so a
        changefeed with no table still advances. Only a source that returns a
        span here and implements :meth:`table_changes` gets tables added and
        removed while the changefeed runs.
        """
        return None

    async def tables_at(self, ts: int) -> Sequence[TableName]:
        """Every table that existed at ``ts`` (the table filter is applied by the caller).

        A changefeed resuming from checkpoint ``ts`` starts with these tables
        and takes later changes from :meth:`table_changes`. The default is
        :meth:`list_tables` (right for a table set that never changes).
        """
        return await self.list_tables()

    def table_changes(self, start_ts: int) -> AsyncIterator[TableSetChange | ResolvedEvent] | None:
        """The table-set changes committed above ``start_ts``, or None when the
        table set never changes (the default).

        The iterator yields each :class:`TableSetChange` in commit-ts order and
        ``ResolvedEvent(trigger_span, t)`` promises: no change at or below
        ``t`` follows. It runs until cancelled or closed; resolved timestamps
        never go backwards. Its resolved ts bounds the changefeed's progress,
        so it must move on while nothing changes.
        """
        return None

    def limit_memory(self, quota: int, spill_dir: Path) -> int:
        """Bound what the feeds hold in memory before their events reach the event store.

        Called once, before :meth:`open`, with the changefeed's memory quota
        and a directory the source may spill to (its contents are not kept
        across restarts). Returns the share of ``quota`` the feeds may use;
        the event store gets the rest. The default, for sources whose feeds
        hold no per-row state, takes nothing.
        """
        return 0

    def feed_stats(self) -> FeedStats | None:
        """What the open feeds hold and how their upstream subscriptions do, for the
        capture's metrics (memory, spill, EventFeed regions); None (the default): nothing
        to report. Called on the event loop at every scrape: must be cheap and not block."""
        return None

    def gc_safepoint_keeper(self) -> GCSafepointKeeper | None:
        """The keeper of this upstream's service GC safepoint (see :mod:`cdcflow.core.control.gc.keeper`),
        or None when the upstream does not garbage-collect history.

        Called on the coordinator before :meth:`open`; the keeper manages its
        own connection.
        """
        return None

    # -- an initial snapshot (optional) ---------------------------------------------------

    @classmethod
    def snapshot_refusal(cls, config: PluginConfig) -> str | None:
        """Why a connector of this source with ``config`` cannot take an initial snapshot
        (``initial-snapshot: true``), or None when it can. The default refuses: a source
        that implements :meth:`snapshot_plan` overrides both."""
        return (
            f"the {getattr(cls, 'type_name', cls.__name__)} source cannot read its tables as of one ts, "
            "so it cannot take an initial snapshot"
        )

    async def snapshot_plan(self, spans: Mapping[int, Span], ts: int) -> SnapshotPlan:
        """The parts that read every row of ``spans`` (event-store span id → span) as of ``ts``.

        Called on the capture's event loop after :meth:`open`, once per snapshot (the
        plan is kept on disk, so a restart reads the parts not done yet of the same
        plan). Each :class:`SnapshotTask` records the span id it reads under."""
        raise NotImplementedError(f"{type(self).__name__} cannot take an initial snapshot")

    async def current_ts(self) -> int:
        """The upstream's current timestamp (TSO), used for lag and ``start-ts: now``."""
        raise NotImplementedError(f"{type(self).__name__} does not report a current timestamp")
