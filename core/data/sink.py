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

Where it runs: the Spark pipeline calls ``write_batch`` on the capture's
driver process, from Spark's micro-batch thread (``foreachBatch``), one batch
at a time per changefeed, and ``write_checkpoint`` from a thread of its own,
never at the same time as ``write_batch``; ``open`` and ``close`` are called
from the same process. Every capture that runs spans of a changefeed has its
own sink instances, and each of them gets the changefeed checkpoint.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from cdcflow.core.data.events import MicroBatch
from cdcflow.core.errors import CdcflowError
from cdcflow.core.plugin.base import ConfigT, Plugin

if TYPE_CHECKING:
    from cdcflow.core.plugin.manager import PluginManager

__all__ = ["Sink", "SinkContext"]


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

    def write_checkpoint(self, ts: int) -> None:
        """Tell the downstream that the changefeed is complete up to ``ts``
        (see "checkpoints" in the module docs) and flush before returning.

        Called after :meth:`open`, with ``ts`` rising, never during a batch's
        writes. The default does nothing: sinks whose downstream keeps no
        progress marker ignore it."""

    def close(self) -> None:
        """Flush and release the downstream. Not called on abrupt shutdown."""
