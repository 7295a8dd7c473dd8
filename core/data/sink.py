"""What a sink plugin is: where micro-batches of a changefeed go.

The contract (the runtime relies on each point):

* **flush before return** — when :meth:`Sink.write_batch` returns, the batch's
  rows and DDL are durable downstream (or in the downstream's client with
  delivery confirmed). Only after every sink of a changefeed returned does the
  checkpoint advance to the batch's ``end_ts``.
* **idempotent on replay** — after a crash the runtime may deliver a batch
  again with the same ``batch_id`` and the same or a superset of its rows
  (at-least-once). Writing it again must leave the downstream as if it had
  been written once (upserts, a checkpoint table, deterministic file names …).
  Where the downstream is an append-only log (Kafka), replay is inherently
  at-least-once: the batch's messages are produced again, duplicates are
  allowed (as TiCDC documents), and consumers deduplicate by the resolved
  ts the sink writes at each changefeed checkpoint (see below).
* **order** — rows arrive in ``(commit_ts, start_ts, key)`` order; a sink keeps
  the order of rows of one key downstream. DDL in ``batch.ddl`` is applied
  after the batch's rows.
* **errors** — raise a :class:`~cdcflow.core.errors.CdcflowError`
  (``DownstreamUnavailableError`` for a downstream that cannot be reached: the
  runtime retries with backoff and the changefeed goes Warning). This holds
  for :meth:`Sink.open` too; after an ``open`` that raised, the runtime calls
  :meth:`Sink.close` before the next attempt, so ``close`` must accept a sink
  that is not (or only partly) open.
* **checkpoints (opt-in)** — :meth:`Sink.write_checkpoint` receives the
  *changefeed* checkpoint: every row of every span of the changefeed with a
  commit ts at or below it has been flushed by every sink of every capture.
  It is the value a sink may promise downstream consumers (Open Protocol's
  resolved events, canal-json and Avro watermarks). A batch's ``end_ts`` is
  not: it is only this capture's frontier, and spans that run elsewhere or
  join later may still deliver rows below it. ``write_checkpoint`` is called
  only with a ts above the last one it accepted, never during a batch's
  writes, and must flush before it returns; errors are raised and retried
  as for batches. Before the first call nothing has been promised: a consumer
  that waits for a resolved ts applies nothing yet. Not every checkpoint is
  delivered (a newer one replaces one not yet written), and none is written
  after a crash until the changefeed runs again.
* **parts (opt-in)** — a sink with ``accepts_partial_batches = True`` may get
  a large batch as several parts with the same ``batch_id`` (``part`` 0, 1, …;
  ``last_part`` on the last, which alone carries the DDL), so that a huge
  transaction never has to be held in memory at once. Flush each part before
  returning; a replay starts again at part 0. Other sinks always get whole
  batches.

* **writes in Spark tasks (opt-in)** — a sink whose :meth:`Sink.task_writer`
  returns a :class:`TaskWriter` has each micro-batch's rows written by Spark
  tasks, in parallel: the batch is partitioned by (table, key hash), so every
  change of a key is in one partition, sorted within it by
  ``(commit_ts, start_ts, key)``; each task opens one :class:`PartitionWriter`
  per (batch id, partition), writes its rows, flushes and closes it. Once every
  partition of every sink flushed, the driver calls :meth:`Sink.commit_batch`
  with the batch's DDL (and no rows), and only then does the checkpoint move.
  A task may run again (Spark retries a failed or lost task, the runtime
  replays a batch after an error or a crash), alone or with any subset of the
  batch's partitions: writing a partition again must leave the downstream as
  if it had been written once, as for ``write_batch``.
* **encoded apart, written in order (opt-in)** — a sink whose rows are
  partitioned by table (``task_partitioning() == "table"``: a downstream that
  keeps every row of a table in one ordered lane, as Kafka's table dispatcher
  does) would have a table's whole batch on one task. Its task writer may be a
  :class:`LaneTaskWriter` instead: the batch then runs in two steps. Tasks
  (those that read the batch, or split by (table, key hash) when it was read by
  fewer) mount the rows and :meth:`~LaneTaskWriter.encode` each into parts
  (bytes) bound for a *lane*
  (a route and a number: Kafka's topic and partition); the parts, with their
  rows' ``(commit_ts, start_ts, key)``, are repartitioned by lane and sorted,
  and tasks write each lane's parts in that order through a
  :class:`LaneWriter`. The costly per-row work scales with the executors; a
  lane's order is the order a single task would have given it. An initial
  snapshot's batch (every row at one ts, each key once: any order in a lane)
  is written in one step by the tasks that read it. When the writer knows the
  lanes of each table (:meth:`~LaneTaskWriter.table_lanes`) and the batch's
  tables fall into groups that share no lane and weigh about evenly, tasks
  take whole groups instead: each reads its tables' files, sorts them and
  writes them in one step, which saves the hand-over of every part. Replays as
  for any task writer.
* **writes as a Spark frame (opt-in)** — a sink without a task writer whose
  :meth:`Sink.write_frame` takes the batch (returns a row count, not None) is
  handed the batch's rows as a Spark DataFrame (a :class:`BatchFrame`), on the
  driver, instead of having them collected there: it writes them with Spark
  (``mapInArrow``, a native DataFrame write), the DDL after the rows, and flushes
  before returning, as ``write_batch`` would. Its rows are the event store's
  records (mounted, table filter applied, in no particular order: sort by
  ``ORDER_COLUMNS``, unless ``BatchFrame.one_ts`` says any order will do, or take
  ``BatchFrame.ordered``, the same rows already in order, when it is set); tasks
  turn a record batch of them back into rows with :meth:`RowDecoder.rows`, which
  applies the column selection and raises a mount error as the CdcflowError it
  is. The same contract holds: idempotent on replay (same ``batch_id``), errors
  as for ``write_batch``. ``write_frame`` returning None has the batch
  delivered through ``write_batch`` after all (a sink may decline a batch it
  only handles on the driver); a batch without rows
  in the event store (only DDL or a resolved ts) always goes to ``write_batch``,
  and so does every batch when the pipeline runs without Spark (the test kit).

Where it runs: the Spark pipeline calls ``write_batch`` and ``commit_batch``
on the capture's driver process, from Spark's micro-batch thread
(``foreachBatch``), one batch at a time per changefeed, and
``write_checkpoint`` from a thread of its own, never at the same time as a
batch; ``open`` and ``close`` are called from the same process. A
:class:`TaskWriter` is pickled and its partition writers run in Spark's
Python workers (other processes, possibly other machines): it must carry
what it needs (addresses, credentials, encoders), not handles of the
driver's. Every capture that runs spans of a changefeed has its own sink
instances, and each of them gets the changefeed checkpoint.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from cdcflow.core.data.codec import EncodedMessage
from cdcflow.core.data.events import InsertRun, MicroBatch, RowChange, TableName
from cdcflow.core.errors import CdcflowError
from cdcflow.core.plugin.base import ConfigT, Plugin

if TYPE_CHECKING:
    import pyarrow as pa

    from cdcflow.core.plugin.manager import PluginManager

__all__ = [
    "BatchFrame",
    "DecodedRows",
    "LaneTaskWriter",
    "LaneWriter",
    "PartitionWriter",
    "RowDecoder",
    "RowsFunction",
    "Sink",
    "SinkContext",
    "TaskWriter",
]


class PartitionWriter(abc.ABC):
    """Writes one partition of one micro-batch, in a Spark task (see the module docs)."""

    @abc.abstractmethod
    def write(self, rows: Sequence[RowChange]) -> None:
        """Write the next rows of the partition, in the order given (they continue it)."""

    def write_inserts(self, run: InsertRun) -> None:
        """Write the rows of ``run`` next (an initial snapshot's, mounted together), as
        :meth:`write` would write ``run.rows()`` — which the default does. A writer
        that encodes a table's inserts faster without a row object each overrides it."""
        self.write(run.rows())

    @abc.abstractmethod
    def flush(self) -> None:
        """Make every row written so far durable downstream before returning."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the writer holds. Called after :meth:`flush`, and after an error."""


class TaskWriter(abc.ABC):
    """A picklable factory of :class:`PartitionWriter` s, shipped to Spark's workers."""

    @abc.abstractmethod
    def open(self, batch: MicroBatch, partition: int) -> PartitionWriter:
        """A writer for ``partition`` of ``batch`` (whose ``rows`` and ``ddl`` are empty:
        only its changefeed id, batch id and ts range are set)."""


class LaneWriter(abc.ABC):
    """Writes lanes of encoded parts of one micro-batch, in a Spark task (see the module docs)."""

    @abc.abstractmethod
    def write(self, route: str, lane: int, parts: Sequence[EncodedMessage]) -> None:
        """Write the next parts of lane ``(route, lane)``, in the order given (they continue it)."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Make every part written so far durable downstream before returning."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the writer holds. Called after :meth:`flush`, and after an error."""


class LaneTaskWriter(TaskWriter):
    """A task writer whose rows are encoded where they are and written, in order, per lane.

    :meth:`open` (the one-step path, used when a batch fits one task, rows are
    partitioned by key or the batch is an initial snapshot's) encodes and writes in
    one task through the same two methods, so both paths encode and pack alike."""

    @abc.abstractmethod
    def encode(self, rows: Sequence[RowChange]) -> list[tuple[int, str, int, EncodedMessage]]:
        """``(index of its row in rows, route, lane, part)`` for every part of every row,
        a row's parts in the order they are written (a row may give several, to different
        lanes). Raises a CdcflowError for a row that cannot be encoded."""

    @abc.abstractmethod
    def open_lanes(self, batch: MicroBatch, partition: int) -> LaneWriter:
        """A writer of the lanes hashed to ``partition`` of ``batch`` (a head: no rows)."""

    def table_lanes(self, table: TableName) -> Collection[tuple[str, int]] | None:
        """The lanes ``(route, lane)`` that any row of ``table`` (a replicated table, as
        this writer gets its rows: transforms applied) may be written to, when they are
        known without the rows: Kafka's table dispatcher gives one, a dispatcher that
        hashes each row's columns every partition of the table's topic. None (the
        default): not known. When every table of a batch has its lanes known, tasks may
        take whole lanes and write them in one step (see the module docs)."""
        return None

    def encode_lanes(self, rows: Sequence[RowChange]) -> Mapping[tuple[str, int], Sequence[EncodedMessage]]:
        """The parts of ``rows`` by lane ``(route, lane)``, each lane's in the order they
        are written: :meth:`encode`'s parts without their rows' indexes, which a task
        writing its rows itself does not need. A writer may give them more cheaply."""
        by_lane: dict[tuple[str, int], list[EncodedMessage]] = {}
        for _, route, lane, part in self.encode(rows):
            by_lane.setdefault((route, lane), []).append(part)
        return by_lane

    def encode_insert_lanes(self, run: InsertRun) -> Mapping[tuple[str, int], Sequence[EncodedMessage]]:
        """:meth:`encode_lanes` of ``run.rows()`` (which the default gives), for a writer
        that routes and encodes a run of one table's inserts faster whole."""
        return self.encode_lanes(run.rows())

    def open(self, batch: MicroBatch, partition: int) -> PartitionWriter:
        return _EncodingPartitionWriter(self, self.open_lanes(batch, partition))


class _EncodingPartitionWriter(PartitionWriter):
    def __init__(self, target: LaneTaskWriter, lanes: LaneWriter) -> None:
        self._target = target
        self._lanes = lanes

    def write(self, rows: Sequence[RowChange]) -> None:
        for (route, lane), parts in self._target.encode_lanes(rows).items():
            self._lanes.write(route, lane, parts)

    def write_inserts(self, run: InsertRun) -> None:
        for (route, lane), parts in self._target.encode_insert_lanes(run).items():
            self._lanes.write(route, lane, parts)

    def flush(self) -> None:
        self._lanes.flush()

    def close(self) -> None:
        self._lanes.close()


class RowDecoder(abc.ABC):
    """Turns record batches of a :class:`BatchFrame` back into rows; picklable, for Spark tasks."""

    @abc.abstractmethod
    def rows(self, batch: pa.RecordBatch) -> list[RowChange]:
        """The rows of ``batch`` (records of :attr:`BatchFrame.frame`), in its order, with the
        connector's column selection applied; raises the CdcflowError a record carries
        instead of a row (a row that did not mount)."""


_NO_DEFAULT = object()


class _MadeOnRead:
    """A field of :class:`BatchFrame` that may be given as a function of no arguments:
    the function is called when the field is first read, once, and its result kept."""

    def __init__(self, default: Any = _NO_DEFAULT) -> None:
        self.default = default
        self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}"

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:  # the dataclass asks for the field's default
            if self.default is _NO_DEFAULT:
                raise AttributeError(self.slot[1:])
            return self.default
        state = instance.__dict__
        value = state[self.slot]
        if callable(value):
            with state.setdefault("_made_on_read", threading.Lock()):
                value = state[self.slot]
                if callable(value):
                    value = state[self.slot] = value()
        return value

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[self.slot] = value


@dataclass(frozen=True)
class BatchFrame:
    """A micro-batch's rows as a Spark DataFrame, for :meth:`Sink.write_frame`.

    :attr:`frame` and :attr:`ordered` may be given as functions of no arguments that
    make them: each is made when first read, once (the runtime's are: planning them
    costs the driver a tenth of a second per batch, which a sink that only
    :meth:`map_rows` never pays)."""

    #: The records (``cdcflow.core.data.logservice.records.SPARK_SCHEMA_DDL``): ``commit_ts``,
    #: ``start_ts``, ``key`` (the order), ``schema_name``, ``table_name``, … and the
    #: encoded row in the other columns; unordered. Reading it runs the batch's scan
    #: and mount again: a sink that reads it more than once persists it.
    frame: Any = _MadeOnRead()  # no default: the descriptor says so when the dataclass asks
    #: Decodes the record batches of ``frame`` into rows, in tasks.
    decoder: RowDecoder  # type: ignore[misc]  # (mypy takes the descriptor for a default)
    #: At most this many rows (the records in the batch's chunks, before filtering).
    expected_rows: int  # type: ignore[misc]
    #: Every row has commit ts ``end_ts`` and each key appears once (an initial
    #: snapshot's batch): any order of the rows is the batch's order, so a sink
    #: need not sort them.
    one_ts: bool = False
    #: The same rows in the batch's order (``ORDER_COLUMNS``: partitions in order, each
    #: sorted), when the runtime gives them so for less than a sort of :attr:`frame`
    #: costs (it sorts the records before mounting them); None: sort :attr:`frame`.
    ordered: Any = _MadeOnRead(None)
    #: The runtime's :meth:`map_rows` (its tasks mount the rows and hand them on in the
    #: same pass); None: over :attr:`ordered` (or :attr:`frame` sorted) and :attr:`decoder`.
    rows_mapper: Callable[[RowsFunction, str], Any] | None = None

    def map_rows(self, function: RowsFunction, schema: str) -> Any:
        """A DataFrame (DDL ``schema``) of what ``function`` yields when Spark tasks hand it
        the batch's rows: a partition's rows as lists, in the batch's order (partitions in
        order, each in order; any order for a :attr:`one_ts` batch), columns selected and
        transformed. A row that did not mount raises its CdcflowError from the iterator,
        for ``function`` to report. ``function`` is pickled to the tasks. On the pipeline
        the rows are mounted in the same Python pass, never encoded as records between."""
        if self.rows_mapper is not None:
            return self.rows_mapper(function, schema)
        from cdcflow.core.data.pipeline.query import ORDER_COLUMNS

        source = self.ordered
        if source is None:
            source = self.frame if self.one_ts else self.frame.orderBy(*ORDER_COLUMNS)
        return source.mapInArrow(DecodedRows(self.decoder, function), schema)


#: A function of Spark tasks over the rows of a batch (:meth:`BatchFrame.map_rows`).
RowsFunction = Callable[[Iterator[list[RowChange]]], Iterator["pa.RecordBatch"]]


@dataclass(frozen=True)
class DecodedRows:
    """``mapInArrow`` function: the records decoded by ``decoder`` into rows for ``function``."""

    decoder: RowDecoder
    function: RowsFunction

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.function(self.decoder.rows(batch) for batch in batches)


@dataclass(frozen=True)
class SinkContext:
    """What the runtime tells a sink when it opens it.

    Everything a sink needs from the runtime arrives here, never through a
    process-wide default: the plugin manager (to look up codecs and other
    plugins by type name) and, on the Spark pipeline, the capture's Spark
    session.
    """

    changefeed_id: str
    _: KW_ONLY
    #: The checkpoint the changefeed (re)started from: rows at or below it may
    #: have been written before, so sinks apply them idempotently.
    restart_ts: int = 0
    options: Mapping[str, str] = field(default_factory=dict)
    #: The plugin manager the changefeed runs with. The runtime always sets it;
    #: None only when a test opens a sink by hand (see :meth:`require_plugins`).
    plugins: PluginManager | None = None
    #: The runtime's SparkSession (the Spark pipeline's); None outside Spark (the
    #: in-process executor, the test kit), where a sink that writes with Spark
    #: starts a session from its own settings.
    spark: Any = None
    #: Who writes the batches: the pipeline's writer identity. Batch ids are only
    #: ordered within one pipeline (Spark's checkpoint directory: a restart on it
    #: replays them, a new directory starts them again at 0), and several captures
    #: running one changefeed are several pipelines; so a sink that recognises
    #: replays by batch id keeps its record per (changefeed, writer). The Spark
    #: pipeline keeps the id in its checkpoint directory: a restart on the same
    #: directory keeps it, a lost directory gets a new one.
    #: The in-process executor has a new one per executor (its batch ids start at 0).
    #: "" when the runtime has one writer only (the test kit's ``drive``).
    writer_id: str = ""
    #: The writer's directory holds batches written before writers had ids (an
    #: upgrade): what a sink recorded then under no writer ("") is this writer's
    #: to take over, if no other writer took it first.
    writer_inherits: bool = False

    def require_plugins(self, sink: str) -> PluginManager:
        """The plugin manager, for a sink that cannot work without it."""
        if self.plugins is None:
            raise CdcflowError(
                f"the {sink} sink looks plugins up (its codec) in SinkContext.plugins, which is None; "
                "open it with SinkContext(changefeed_id, plugins=PluginManager.default())"
            )
        return self.plugins


class Sink(Plugin[ConfigT], abc.ABC):
    """Base class of sink plugins."""

    #: URI schemes this sink accepts (``kafka``, ``kafka+ssl``); a sink entry
    #: written as ``uri: kafka://…`` selects the plugin by scheme.
    uri_schemes: ClassVar[tuple[str, ...]] = ()

    #: Whether the runtime may split a batch into parts (see the module docs).
    accepts_partial_batches: ClassVar[bool] = False

    @classmethod
    def options_from_uri(cls, uri: str) -> dict[str, object]:
        """Config options expressed by a sink URI: ``uri`` itself plus its query
        parameters (``kafka://h:9092/t?max-batch-size=8`` → ``max-batch-size: "8"``).

        A repeated query parameter becomes a list. Override to map host, path
        or user info onto other fields.
        """
        query = parse_qs(urlsplit(uri).query, keep_blank_values=True)
        options: dict[str, object] = {"uri": uri}
        for key, values in query.items():
            options[key] = values[0] if len(values) == 1 else values
        return options

    def open(self, context: SinkContext) -> None:
        """Connect to the downstream. Called once before the first batch."""

    @abc.abstractmethod
    def write_batch(self, batch: MicroBatch) -> None:
        """Write ``batch`` (rows, then DDL) and flush it before returning."""

    def task_writer(self, tables: Sequence[TableName]) -> TaskWriter | None:
        """The writer Spark tasks use for this sink's rows, or None (the default) for
        a sink written from the driver through :meth:`write_batch` only.

        Called on the driver after :meth:`open`, once per micro-batch, with the
        tables whose rows the batch may hold (a sink prepares what its tasks
        cannot, such as creating topics)."""
        return None

    def task_partitioning(self) -> str:
        """How the rows of a batch are split among tasks for this sink: ``"key"``
        (the default: by (table, key), every change of a key in one partition) or
        ``"table"`` (every row of a table in one partition, for a downstream that
        needs a table's rows in commit order, or one transaction of a table whole)."""
        return "key"

    def commit_batch(self, batch: MicroBatch) -> None:
        """Complete a batch whose rows every partition writer flushed: apply its DDL
        (``batch.ddl``; ``batch.rows`` is empty) and whatever the sink records per
        batch, and flush before returning. Called on the driver, only for sinks
        with a :meth:`task_writer`; the default hands the DDL to :meth:`write_batch`."""
        self.write_batch(batch)

    def write_frame(self, batch: MicroBatch, rows: BatchFrame) -> int | None:
        """Write ``batch`` (its DDL in ``batch.ddl``; ``batch.rows`` is empty) with its rows
        given as ``rows``, a Spark DataFrame, and flush before returning; return the
        number of rows written. None (the default): not taken, the batch goes to
        :meth:`write_batch` (see "writes as a Spark frame" in the module docs).

        Called on the driver, only for sinks without a :meth:`task_writer`, and only
        for batches with rows in the event store."""
        return None

    def write_checkpoint(self, ts: int) -> None:
        """Tell the downstream that the changefeed is complete up to ``ts``
        (see "checkpoints" in the module docs) and flush before returning.

        Called after :meth:`open`, with ``ts`` rising, never during a batch's
        writes. The default does nothing: sinks whose downstream keeps no
        progress marker ignore it."""

    def close(self) -> None:
        """Flush and release the downstream. Not called on abrupt shutdown."""
