"""The boundary between the control plane and the data plane on one capture.

A maintainer places a changefeed's spans on captures (through its scheduler
plugin). On each capture, the changefeed's :class:`SpanExecutor` carries out
those decisions: it loads a span from a checkpoint (feeds it from the source
into the event store), starts replicating it to the sinks, stops it, and
reports each span's progress. This is seed 002's ``TableExecutor`` for spans.

Two-phase scheduling (seed 002) uses ``prepare``: a prepared span catches up
from its checkpoint — its feed runs and events are buffered — but nothing is
written downstream until the span is added again with ``prepare=False``.

How a capture gets its executors: an :data:`ExecutorFactory` makes one per
changefeed incarnation (epoch) per capture from an :class:`ExecutorContext`.
Factories are registered by name through the ``cdcflow_register_executors``
hook (:class:`ExecutorRegistry`); the built-ins are ``spark`` (the data
pipeline, the default) and ``in-process`` (the test kit's executor, for the
control plane without Spark). ``cdcflow run`` and ``cdcflow server`` pick one
with ``--executor NAME``. There is no silent fallback: a capture runs the
executor it was told to, or fails naming the ones that exist.
"""

from __future__ import annotations

import abc
import enum
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcflow.core.data.events import Span
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue, PluginConflictError
from cdcflow.core.plugin.base import TYPE_NAME_PATTERN

if TYPE_CHECKING:
    from cdcflow.core.config.loader import Connector
    from cdcflow.core.config.settings import ServerSettings
    from cdcflow.core.control.changefeed import ChangeFeedInfo
    from cdcflow.core.metrics import CaptureMetrics, ExecutorStats
    from cdcflow.core.plugin.manager import PluginManager
    from cdcflow.core.plugin.registry import PluginOrigin

__all__ = [
    "DEFAULT_EXECUTOR",
    "ExecutorContext",
    "ExecutorEntry",
    "ExecutorFactory",
    "ExecutorRegistrar",
    "ExecutorRegistry",
    "SnapshotReport",
    "SpanExecutor",
    "SpanState",
    "SpanStatus",
]

log = logging.getLogger(__name__)

#: The executor a capture runs when none is named: the Spark data pipeline.
DEFAULT_EXECUTOR = "spark"


class SpanState(enum.Enum):
    """The state of one span on one capture (seed 002's table state)."""

    ABSENT = "absent"
    PREPARING = "preparing"
    PREPARED = "prepared"
    REPLICATING = "replicating"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class SpanStatus:
    """Progress of one span on one capture.

    ``checkpoint_ts``: every change of the span at or below it is flushed by
    every sink. ``resolved_ts``: every change at or below it has been received
    from the upstream. Neither goes backwards while the span stays loaded.
    """

    span: Span
    state: SpanState
    checkpoint_ts: int
    resolved_ts: int


@dataclass(frozen=True, slots=True)
class SnapshotReport:
    """Where an initial snapshot read on one capture is, sent to the maintainer with the
    capture's heartbeat (:class:`~cdcflow.core.control.scheduling.HeartbeatResponse`).

    ``span``: the snapshot range placed on the capture that this report is about
    (:mod:`cdcflow.core.data.snapshot_ranges`), or None for the snapshot the capture
    takes of its own spans. ``unit`` names a part (``region``, ``range``); ``phase`` is
    ``read``, ``deliver`` or ``done``; ``started_at`` is the wall-clock second the read
    started (``time.time()``); ``rows_estimate`` extrapolates the rows of all the parts
    from those read.
    """

    span: Span | None
    unit: str
    phase: str
    parts_done: int
    parts_total: int
    rows_done: int
    rows_estimate: int
    started_at: float


class SpanExecutor(abc.ABC):
    """Runs a changefeed's spans that are placed on this capture."""

    @abc.abstractmethod
    async def add_span(self, span: Span, checkpoint_ts: int, *, prepare: bool) -> bool:
        """Load ``span`` from ``checkpoint_ts`` (``prepare=True``: catch up
        without writing downstream) or start replicating it (``prepare=False``).

        Idempotent; returns whether the requested state has been reached.
        """

    @abc.abstractmethod
    async def remove_span(self, span: Span) -> int | None:
        """Stop ``span`` and release it. Idempotent; returns the span's final
        checkpoint once it is fully stopped, None while it is still stopping."""

    @abc.abstractmethod
    def status(self, span: Span) -> SpanStatus:
        """The span's state and progress (``ABSENT`` when not loaded here)."""

    @abc.abstractmethod
    def spans(self) -> list[Span]:
        """Every span loaded here: being added, replicating or being removed.

        Two calls with no add/remove in between return the same spans.
        """

    def snapshot_reports(self) -> list[SnapshotReport]:
        """Where the initial snapshots read here are (its own spans', and each snapshot
        range's); sent with every heartbeat. None by default: an executor that takes no
        snapshot has nothing to report."""
        return []

    async def set_barrier(self, ts: int) -> None:  # noqa: B027 - optional hook
        """Do not write changes with commit ts above ``ts`` downstream until the
        barrier moves (the DDL barrier, set by the maintainer)."""

    async def set_changefeed_checkpoint(self, ts: int) -> None:  # noqa: B027 - optional hook
        """The changefeed's checkpoint, computed by its maintainer: the minimum
        checkpoint over *all* the changefeed's spans (on every capture), withheld
        while a span runs nowhere. Every change at or below ``ts`` has been
        flushed by every sink of every capture.

        Executors hand it to their sinks (``Sink.write_checkpoint``), which may
        promise it to consumers (Kafka resolved events); a span's own
        checkpoint or this capture's frontier may not be promised, since spans
        elsewhere or joining later can still deliver rows below them. Called
        with every heartbeat of the maintainer (a repeat or a lower value after
        a maintainer moved is ignored: it only moves forward). Must not block:
        writing happens in the background."""

    def stats(self) -> ExecutorStats | None:
        """This changefeed's progress and buffers on this capture, for ``/metrics``
        (called on the event loop at every scrape); None (the default): nothing to report."""
        return None

    def error(self) -> BaseException | None:
        """The error that stopped this executor's spans, if any (a
        :class:`~cdcflow.core.errors.CdcflowError` for known failures). The span
        agent reports it to the maintainer, which reports it to the coordinator."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop every span and release resources."""


# -- how a capture gets an executor ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecutorContext:
    """What an executor factory is told about its changefeed and capture."""

    info: ChangeFeedInfo
    #: The changefeed's validated connector (source, sinks, filter, quotas).
    connector: Connector
    capture_id: str
    plugins: PluginManager
    #: The capture's data directory; the changefeed's files go below it.
    data_dir: str
    #: The checkpoint the executor's first span starts from.
    start_ts: int = 0
    #: The capture's server settings (Spark); None: the defaults.
    server: ServerSettings | None = None
    #: The capture's metrics, which the executor records into; None: metrics are off.
    metrics: CaptureMetrics | None = None

    @property
    def changefeed_id(self) -> str:
        return self.info.id

    @property
    def epoch(self) -> int:
        return self.info.epoch


#: Makes the executor of one changefeed incarnation on this capture.
ExecutorFactory = Callable[[ExecutorContext], SpanExecutor]


#: What an executor starts once per capture: called with the capture's server settings.
ExecutorStart = Callable[["ServerSettings", "PluginManager"], object]
#: What an executor stops once per capture, after its changefeeds' executors closed.
ExecutorStop = Callable[[], object]


@dataclass(frozen=True, slots=True)
class ExecutorEntry:
    """One registered executor factory and where it came from."""

    name: str
    factory: ExecutorFactory
    summary: str
    origin: PluginOrigin
    #: Called once when a capture that runs this executor starts (see :meth:`ExecutorRegistry.start`).
    start: ExecutorStart | None = None
    #: Called once when that capture stopped (see :meth:`ExecutorRegistry.stop`).
    stop: ExecutorStop | None = None


class ExecutorRegistry:
    """Every executor factory, by the name ``--executor`` takes."""

    kind = "executors"

    def __init__(self) -> None:
        self._entries: dict[str, ExecutorEntry] = {}

    def add(
        self,
        name: str,
        factory: ExecutorFactory,
        origin: PluginOrigin,
        *,
        summary: str = "",
        start: ExecutorStart | None = None,
        stop: ExecutorStop | None = None,
    ) -> None:
        """Register ``factory`` under ``name``; a name taken by another factory is an
        error naming both origins."""
        if not isinstance(name, str) or not TYPE_NAME_PATTERN.match(name):
            raise ConfigInvalidError(
                f"executor {name!r} from {origin}: a name is lower-case words joined by dashes, e.g. 'in-process'"
            )
        if not callable(factory):
            raise ConfigInvalidError(f"executor '{name}' from {origin}: the factory {factory!r} is not callable")
        existing = self._entries.get(name)
        if existing is not None:
            if existing.factory is factory:
                return
            raise PluginConflictError(
                f"two plugins register executor '{name}': {existing.origin} and {origin}; "
                "uninstall one of them or register one under another name",
                detail={"kind": self.kind, "type": name},
            )
        self._entries[name] = ExecutorEntry(name, factory, summary, origin, start, stop)

    def factory(self, name: str) -> ExecutorFactory:
        """The factory registered as ``name``; ConfigInvalidError naming the known ones otherwise."""
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(self.names()) or "none"
            message = f"unknown executor {name!r}; known: {known} (plugins register more)"
            raise ConfigInvalidError(message, [ConfigIssue(message, path="executor")])
        return entry.factory

    def get(self, name: str) -> ExecutorEntry | None:
        return self._entries.get(name)

    def start(self, name: str, server: ServerSettings, plugins: PluginManager) -> threading.Thread | None:
        """Run the ``start`` of executor ``name`` for a capture starting with ``server``, in a
        thread of its own (None when the executor has none). What it starts — Spark, for the
        pipeline — is then ready beside the capture's other connections when the first
        span arrives, instead of after it; an error is logged, and the executor's own
        start tries again."""
        entry = self._entries.get(name)
        if entry is None or entry.start is None:
            return None
        start = entry.start

        def run() -> None:
            try:
                start(server, plugins)
            except Exception as exc:  # noqa: BLE001 - the executor starts it again when it needs it
                log.warning("executor %s: starting at capture start failed (%s); it starts on first use", name, exc)

        thread = threading.Thread(target=run, name=f"executor-start-{name}", daemon=True)
        thread.start()
        return thread

    def stop(self, name: str) -> None:
        """Run the ``stop`` of executor ``name`` once its capture stopped (every changefeed's
        executor closed, every batch flushed): what its ``start`` started ends before the
        process does — Spark's JVM and Python workers, whose sink clients would otherwise
        outlive the capture's in-process servers. An error is logged."""
        entry = self._entries.get(name)
        if entry is None or entry.stop is None:
            return
        try:
            entry.stop()
        except Exception as exc:  # noqa: BLE001 - the process ends anyway
            log.warning("executor %s: stopping at capture stop failed (%s)", name, exc)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[ExecutorEntry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)


class ExecutorRegistrar:
    """What ``cdcflow_register_executors`` receives: ``registry.add("spark", factory)``.

    Entries record the plugin whose hook is running as their origin.
    """

    kind = ExecutorRegistry.kind

    def __init__(self, registry: ExecutorRegistry, origin: Callable[[], PluginOrigin]) -> None:
        self._registry = registry
        self._origin = origin

    def add(
        self,
        name: str,
        factory: ExecutorFactory,
        *,
        summary: str = "",
        start: ExecutorStart | None = None,
        stop: ExecutorStop | None = None,
    ) -> None:
        """Register ``factory`` (ExecutorContext → SpanExecutor) under ``name``; ``start``,
        if given, is called (in a thread) when a capture that runs it starts, ``stop`` when
        that capture stopped."""
        self._registry.add(name, factory, self._origin(), summary=summary, start=start, stop=stop)
