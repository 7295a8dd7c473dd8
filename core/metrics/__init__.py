"""Prometheus metrics of a capture (``GET /metrics``), with ``prometheus_client``.

Every metric is declared once in :data:`METRICS` (name, type, labels, unit,
meaning): the reference page ``docs/reference/metrics.md`` is generated from it
(:func:`reference_markdown`) and the Grafana dashboard is checked against it.

Each capture has its own :class:`CaptureMetrics` with its own
``CollectorRegistry`` — several captures in one process (as the tests run
them) never mix their numbers. Two kinds of metric live in it:

* **recorded** as things happen (counters and histograms: rows written per sink,
  flush durations, Spark micro-batches, retries and errors, metastore latency).
  The data plane records them per micro-batch, never per row; rows written by
  Spark tasks reach them through the task summaries the driver collects, not
  from the Python workers;
* **read at scrape time** (gauges, and counters the components keep as plain
  integers: rows and bytes read, incremental-scan rows): the persisted progress
  and states from the metastore, and each local changefeed's in-memory
  progress, event store, feeds and EventFeed regions (:class:`ExecutorStats`).

With ``server.metrics: false`` a capture records nothing on the data plane;
``/metrics`` then serves only what is read at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from cdcflow.core.control.changefeed import ChangeFeedInfo, ChangeFeedStatus
    from cdcflow.core.errors import CdcflowError

__all__ = [
    "CONTENT_TYPE",
    "METRICS",
    "CaptureMetrics",
    "ChangefeedMetrics",
    "ExecutorStats",
    "FeedStats",
    "MetricSpec",
    "Snapshot",
    "error_code",
    "metric_names",
    "reference_markdown",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# No ``*_created`` series beside every counter and histogram: they double the series for
# nothing an operator reads (Prometheus handles counter resets without them).
disable_created_metrics()  # type: ignore[no-untyped-call]

Kind = Literal["counter", "gauge", "histogram"]

#: Buckets (seconds) of flush, micro-batch and task durations: 5 ms to 2 min.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: Buckets (seconds) of metastore operations: 0.5 ms to 10 s.
METASTORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
#: Buckets (rows) of batch sizes.
ROWS_BUCKETS = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
#: A region whose resolved ts is older than this many seconds counts as lagging
#: (CockroachDB's ``changefeed.lagging_ranges_threshold`` default).
LAGGING_REGION_SECONDS = 180.0
#: TiCDC's ``ticdc_owner_status`` codes of the changefeed states.
STATE_CODES = {"normal": 0, "failed": 2, "paused": 3, "finished": 4, "removed": 5, "warning": 6}


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric as Prometheus shows it (counters end in ``_total``)."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    unit: str
    help: str
    #: Read at scrape time (False: recorded as things happen).
    scraped: bool = True


def _m(name: str, kind: Kind, labels: str, unit: str, help: str, *, scraped: bool = True) -> MetricSpec:
    return MetricSpec(name, kind, tuple(labels.split()) if labels else (), unit, help, scraped)


CF = "changefeed"
#: Every metric a capture exports.
METRICS: tuple[MetricSpec, ...] = (
    # -- the cluster, from the metastore (the same on every capture) ------------------------
    _m("cdcflow_changefeed_checkpoint_lag_seconds", "gauge", CF, "seconds",
       "Now minus the physical time of the changefeed's persisted checkpoint (TiCDC's owner checkpoint lag)."),
    _m("cdcflow_changefeed_resolved_lag_seconds", "gauge", CF, "seconds",
       "Now minus the physical time of the changefeed's persisted resolved ts."),
    _m("cdcflow_changefeed_checkpoint_timestamp_seconds", "gauge", CF, "seconds",
       "Physical time of the persisted checkpoint, as Unix time."),
    _m("cdcflow_changefeed_resolved_timestamp_seconds", "gauge", CF, "seconds",
       "Physical time of the persisted resolved ts, as Unix time."),
    _m("cdcflow_changefeed_state", "gauge", CF, "code",
       "State of each changefeed in TiCDC's codes: normal 0, failed 2, paused 3, finished 4, removed 5, warning 6."),
    _m("cdcflow_changefeeds", "gauge", "state", "changefeeds", "Changefeeds in each state."),
    _m("cdcflow_captures", "gauge", "", "captures", "Captures registered in the metastore."),
    _m("cdcflow_capture_is_owner", "gauge", "", "boolean",
       "1 when this capture is the owner (runs the coordinator); the sum over captures should be 1."),
    _m("cdcflow_capture_rejoins_total", "counter", "", "rejoins",
       "Times this capture lost its metastore session and joined again (a suicide, seed 001)."),
    _m("cdcflow_coordinator_term", "gauge", "", "term",
       "Owner term of the coordinator this capture runs (0: not the owner)."),
    _m("cdcflow_reclaimed_changefeed_dirs_total", "counter", "", "directories",
       "Directories of changefeeds that no longer exist deleted from this capture's data-dir by its sweep.",
       scraped=False),
    _m("cdcflow_reclaimed_bytes_total", "counter", "", "bytes",
       "Bytes the files of those directories held.", scraped=False),
    _m("cdcflow_metastore_operation_duration_seconds", "histogram", "operation", "seconds",
       "Duration of metastore operations, by operation (get_changefeed, update_checkpoints, campaign ...).",
       scraped=False),
    _m("cdcflow_metastore_errors_total", "counter", "operation", "errors",
       "Metastore operations that raised, by operation.", scraped=False),
    # -- this capture's part of each changefeed, in memory ------------------------------------
    _m("cdcflow_processor_checkpoint_lag_seconds", "gauge", CF, "seconds",
       "Now minus this capture's in-memory checkpoint of the changefeed (what its sinks flushed; not yet persisted)."),
    _m("cdcflow_processor_resolved_lag_seconds", "gauge", CF, "seconds",
       "Now minus this capture's in-memory resolved ts (the event store's published ts)."),
    _m("cdcflow_processor_spans", "gauge", f"{CF} state", "spans",
       "Spans of the changefeed loaded on this capture, by state (preparing, prepared, replicating, ...)."),
    _m("cdcflow_source_rows_read_total", "counter", f"{CF} source", "rows",
       "Row changes the source's feeds delivered into the event store."),
    _m("cdcflow_source_read_bytes_total", "counter", f"{CF} source", "bytes",
       "Bytes (event store record size) of the row changes the feeds delivered."),
    _m("cdcflow_event_store_memory_bytes", "gauge", CF, "bytes", "Bytes of events the event store holds in memory."),
    _m("cdcflow_event_store_memory_quota_bytes", "gauge", CF, "bytes", "The event store's share of the memory quota."),
    _m("cdcflow_event_store_spilled_bytes", "gauge", CF, "bytes",
       "Bytes of unresolved events the event store spilled to disk (sorted runs)."),
    _m("cdcflow_event_store_chunk_bytes", "gauge", CF, "bytes",
       "Bytes of resolved chunks on disk, published and not yet released."),
    _m("cdcflow_event_store_chunks_pending", "gauge", CF, "chunks",
       "Resolved chunks published and not yet released (waiting for the pipeline or its checkpoint)."),
    _m("cdcflow_event_store_dropped_duplicates_total", "counter", CF, "events",
       "Events dropped as repeats (at or below a span's resolved floor)."),
    _m("cdcflow_feed_memory_bytes", "gauge", f"{CF} source", "bytes",
       "Bytes the source's feeds hold before events reach the event store (TiKV: pending prewrites)."),
    _m("cdcflow_feed_spilled_entries_total", "counter", f"{CF} source", "entries",
       "Entries the source's feeds wrote to disk because their memory share was full."),
    _m("cdcflow_eventfeed_regions", "gauge", f"{CF} source", "regions", "Regions subscribed by the EventFeed client."),
    _m("cdcflow_eventfeed_regions_initializing", "gauge", f"{CF} source", "regions",
       "Subscribed regions whose incremental scan has not finished (no INITIALIZED yet)."),
    _m("cdcflow_eventfeed_regions_lagging", "gauge", f"{CF} source", "regions",
       f"Initialized regions whose resolved ts is more than {LAGGING_REGION_SECONDS:.0f} s behind "
       "(CockroachDB's lagging ranges)."),
    _m("cdcflow_eventfeed_incremental_scan_rows_total", "counter", f"{CF} source", "rows",
       "Changes received during regions' incremental scans (before INITIALIZED)."),
    # -- the pipeline and the sinks, recorded per micro-batch ----------------------------------
    _m("cdcflow_sink_rows_written_total", "counter", f"{CF} sink", "rows",
       "Rows each sink flushed (written by Spark tasks: counted from the tasks' summaries).", scraped=False),
    _m("cdcflow_sink_written_bytes_total", "counter", f"{CF} sink", "bytes",
       "Bytes (Arrow record size) of the changes handed to each sink; a sink that writes the batch's "
       "Spark frame itself (spark) counts rows only.", scraped=False),
    _m("cdcflow_sink_flush_duration_seconds", "histogram", f"{CF} sink", "seconds",
       "Time from a micro-batch's first write to the sink's commit of it (TiCDC's sink flush duration).",
       scraped=False),
    _m("cdcflow_sink_batch_rows", "histogram", f"{CF} sink", "rows", "Rows per micro-batch flushed by each sink.",
       scraped=False),
    _m("cdcflow_spark_batch_duration_seconds", "histogram", CF, "seconds",
       "Duration of each Spark micro-batch on the driver, from planning to the checkpoint (retries included).",
       scraped=False),
    _m("cdcflow_spark_batch_rows", "histogram", CF, "rows", "Rows per Spark micro-batch.", scraped=False),
    _m("cdcflow_spark_task_duration_seconds", "histogram", CF, "seconds",
       "Duration of each write task of a micro-batch (from the task summaries).", scraped=False),
    _m("cdcflow_retries_total", "counter", f"{CF} code", "retries",
       "Retries after a retryable error (a sink's downstream, the pipeline's start), by error code.", scraped=False),
    _m("cdcflow_errors_total", "counter", f"{CF} code", "errors",
       "Errors raised on the data plane by error code (retried or not).", scraped=False),
)  # fmt: skip

_SPECS = {spec.name: spec for spec in METRICS}


def metric_names() -> set[str]:
    """Every series name a scrape can show (histograms' ``_bucket``, ``_sum``, ``_count`` included)."""
    names = set()
    for spec in METRICS:
        names.add(spec.name)
        if spec.kind == "histogram":
            names.update(f"{spec.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
    return names


def error_code(error: BaseException) -> str:
    """The label of an error: its numeric code ("unknown" when it has none)."""
    code = getattr(error, "code", None)
    return str(int(code)) if code is not None else "unknown"


# -- what executors report at scrape time ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class FeedStats:
    """What a source's feeds report (:meth:`~cdcflow.core.data.source.Source.feed_stats`)."""

    memory_bytes: int = 0
    spilled_entries: int = 0
    #: EventFeed regions; None: the source has no regions (only TiKV does).
    regions: int | None = None
    regions_initializing: int = 0
    regions_lagging: int = 0
    incremental_scan_rows: int = 0


@dataclass(frozen=True, slots=True)
class ExecutorStats:
    """One changefeed's state on this capture (:meth:`~cdcflow.core.data.span_executor.SpanExecutor.stats`)."""

    source: str
    checkpoint_ts: int
    resolved_ts: int
    spans_by_state: Mapping[str, int]
    rows_read: int = 0
    bytes_read: int = 0
    memory_bytes: int | None = None
    memory_quota_bytes: int = 0
    spilled_bytes: int = 0
    chunk_bytes: int = 0
    chunks_pending: int = 0
    dropped_duplicates: int = 0
    feed: FeedStats | None = None
    #: The lowest over replicating spans of the newest resolved ts their feeds delivered
    #: (0: none yet): what the event store publishes next.
    source_resolved_ts: int = 0
    #: The end offset of the newest micro-batch Spark began (0: none yet).
    batch_end_ts: int = 0


@dataclass(frozen=True)
class Snapshot:
    """What a scrape reads, gathered on the event loop (then exposed off it)."""

    changefeeds: Sequence[tuple[ChangeFeedInfo, ChangeFeedStatus]]
    captures: int
    is_owner: bool
    term: int
    rejoins: int
    executors: Mapping[str, ExecutorStats] = field(default_factory=dict)
    now: float = field(default_factory=time.time)


def _physical_seconds(ts: int) -> float:
    return (ts >> 18) / 1000.0


def _lag(now: float, ts: int) -> float:
    return max(0.0, now - _physical_seconds(ts))


def _family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    spec = _SPECS[name]
    if spec.kind == "counter":
        return CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=spec.labels, unit="")
    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)


def scraped_families(snapshot: Snapshot) -> list[Metric]:
    """The metrics read at scrape time, from ``snapshot``."""
    fams: dict[str, Any] = {spec.name: _family(spec.name) for spec in METRICS if spec.scraped}

    def add(name: str, labels: Sequence[str], value: float) -> None:
        fams[name].add_metric(list(labels), value)

    now = snapshot.now
    by_state = dict.fromkeys(STATE_CODES, 0)
    for info, status in snapshot.changefeeds:
        cf = info.id
        add("cdcflow_changefeed_checkpoint_lag_seconds", [cf], _lag(now, status.checkpoint_ts))
        add("cdcflow_changefeed_resolved_lag_seconds", [cf], _lag(now, status.resolved_ts))
        add("cdcflow_changefeed_checkpoint_timestamp_seconds", [cf], _physical_seconds(status.checkpoint_ts))
        add("cdcflow_changefeed_resolved_timestamp_seconds", [cf], _physical_seconds(status.resolved_ts))
        add("cdcflow_changefeed_state", [cf], STATE_CODES.get(info.state.value, -1))
        by_state[info.state.value] = by_state.get(info.state.value, 0) + 1
    for state, count in by_state.items():
        add("cdcflow_changefeeds", [state], count)
    add("cdcflow_captures", [], snapshot.captures)
    add("cdcflow_capture_is_owner", [], 1 if snapshot.is_owner else 0)
    add("cdcflow_capture_rejoins_total", [], snapshot.rejoins)
    add("cdcflow_coordinator_term", [], snapshot.term)
    for cf, stats in snapshot.executors.items():
        src = [cf, stats.source]
        if stats.checkpoint_ts:
            add("cdcflow_processor_checkpoint_lag_seconds", [cf], _lag(now, stats.checkpoint_ts))
        if stats.resolved_ts:
            add("cdcflow_processor_resolved_lag_seconds", [cf], _lag(now, stats.resolved_ts))
        for state, count in stats.spans_by_state.items():
            add("cdcflow_processor_spans", [cf, state], count)
        add("cdcflow_source_rows_read_total", src, stats.rows_read)
        add("cdcflow_source_read_bytes_total", src, stats.bytes_read)
        if stats.memory_bytes is not None:
            add("cdcflow_event_store_memory_bytes", [cf], stats.memory_bytes)
            add("cdcflow_event_store_memory_quota_bytes", [cf], stats.memory_quota_bytes)
            add("cdcflow_event_store_spilled_bytes", [cf], stats.spilled_bytes)
            add("cdcflow_event_store_chunk_bytes", [cf], stats.chunk_bytes)
            add("cdcflow_event_store_chunks_pending", [cf], stats.chunks_pending)
            add("cdcflow_event_store_dropped_duplicates_total", [cf], stats.dropped_duplicates)
        feed = stats.feed
        if feed is not None:
            add("cdcflow_feed_memory_bytes", src, feed.memory_bytes)
            add("cdcflow_feed_spilled_entries_total", src, feed.spilled_entries)
            if feed.regions is not None:
                add("cdcflow_eventfeed_regions", src, feed.regions)
                add("cdcflow_eventfeed_regions_initializing", src, feed.regions_initializing)
                add("cdcflow_eventfeed_regions_lagging", src, feed.regions_lagging)
                add("cdcflow_eventfeed_incremental_scan_rows_total", src, feed.incremental_scan_rows)
    return list(fams.values())


# -- recorded metrics ----------------------------------------------------------------------------


class ChangefeedMetrics:
    """What one changefeed's pipeline records on its capture (label values bound once)."""

    def __init__(self, owner: CaptureMetrics, changefeed_id: str) -> None:
        self._owner = owner
        self.changefeed_id = changefeed_id
        cf = changefeed_id
        self._batch_seconds = owner.batch_seconds.labels(cf)
        self._batch_rows = owner.batch_rows.labels(cf)
        self._task_seconds = owner.task_seconds.labels(cf)
        self._sinks: dict[str, tuple[Any, Any, Any, Any]] = {}
        #: Rows and bytes each sink flushed, and the micro-batches done (for the statistics API).
        self.written: dict[str, list[int]] = {}
        self.batches = 0

    def _sink(self, sink: str) -> tuple[Any, Any, Any, Any]:
        bound = self._sinks.get(sink)
        if bound is None:
            o, labels = self._owner, (self.changefeed_id, sink)
            bound = (
                o.sink_rows.labels(*labels),
                o.sink_bytes.labels(*labels),
                o.flush_seconds.labels(*labels),
                o.sink_batch_rows.labels(*labels),
            )
            self._sinks[sink] = bound
        return bound

    def sink_flushed(self, sink: str, rows: int, nbytes: int | None, seconds: float) -> None:
        """``sink`` flushed a micro-batch of ``rows`` rows (``nbytes`` bytes; None: not known) in ``seconds``."""
        written, size, flush, batch = self._sink(sink)
        totals = self.written.setdefault(sink, [0, 0])
        totals[0] += rows
        totals[1] += nbytes or 0
        written.inc(rows)
        if nbytes:
            size.inc(nbytes)
        flush.observe(seconds)
        batch.observe(rows)

    def batch_done(self, rows: int, seconds: float) -> None:
        self.batches += 1
        self._batch_rows.observe(rows)
        self._batch_seconds.observe(seconds)

    def tasks_done(self, durations: Iterable[float]) -> None:
        for seconds in durations:
            self._task_seconds.observe(seconds)

    def error(self, error: BaseException, *, retried: bool) -> None:
        code = error_code(error)
        self._owner.errors.labels(self.changefeed_id, code).inc()
        if retried:
            self._owner.retries.labels(self.changefeed_id, code).inc()


class CaptureMetrics:
    """One capture's metrics, in a registry of its own (see the module docs)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)

        def counter(name: str) -> Counter:
            spec = _SPECS[name]
            return Counter(spec.name.removesuffix("_total"), spec.help, spec.labels, registry=registry)

        def histogram(name: str, buckets: Sequence[float]) -> Histogram:
            spec = _SPECS[name]
            return Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=buckets)

        self.metastore_seconds = histogram("cdcflow_metastore_operation_duration_seconds", METASTORE_BUCKETS)
        self.metastore_errors = counter("cdcflow_metastore_errors_total")
        self.sink_rows = counter("cdcflow_sink_rows_written_total")
        self.sink_bytes = counter("cdcflow_sink_written_bytes_total")
        self.flush_seconds = histogram("cdcflow_sink_flush_duration_seconds", DURATION_BUCKETS)
        self.sink_batch_rows = histogram("cdcflow_sink_batch_rows", ROWS_BUCKETS)
        self.batch_seconds = histogram("cdcflow_spark_batch_duration_seconds", DURATION_BUCKETS)
        self.batch_rows = histogram("cdcflow_spark_batch_rows", ROWS_BUCKETS)
        self.task_seconds = histogram("cdcflow_spark_task_duration_seconds", DURATION_BUCKETS)
        self.reclaimed_dirs = counter("cdcflow_reclaimed_changefeed_dirs_total")
        self.reclaimed_bytes = counter("cdcflow_reclaimed_bytes_total")
        self.retries = counter("cdcflow_retries_total")
        self.errors = counter("cdcflow_errors_total")
        self._changefeeds: dict[str, ChangefeedMetrics] = {}

    @classmethod
    def disabled(cls) -> CaptureMetrics:
        """An empty registry: what a capture with metrics off exposes besides the scraped metrics."""
        return _DISABLED

    def changefeed(self, changefeed_id: str) -> ChangefeedMetrics:
        """The recorder of ``changefeed_id`` (the same one for every executor of it)."""
        recorder = self._changefeeds.get(changefeed_id)
        if recorder is None:
            recorder = self._changefeeds[changefeed_id] = ChangefeedMetrics(self, changefeed_id)
        return recorder

    def recorder(self, changefeed_id: str) -> ChangefeedMetrics | None:
        """The recorder of ``changefeed_id`` if it recorded anything on this capture."""
        return self._changefeeds.get(changefeed_id)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the recorded series of changefeeds not in ``keep`` (removed ones), so that
        label cardinality follows the changefeeds that exist."""
        kept = set(keep)
        per_changefeed = (
            self.sink_rows, self.sink_bytes, self.flush_seconds, self.sink_batch_rows, self.batch_seconds,
            self.batch_rows, self.task_seconds, self.retries, self.errors,
        )  # fmt: skip
        for gone in set(self._changefeeds) - kept:
            del self._changefeeds[gone]
        for metric in per_changefeed:
            children = cast("dict[tuple[str, ...], Any]", metric._metrics)
            for labels in [labels for labels in list(children) if labels[0] not in kept]:
                metric.remove(*labels)

    def metastore_call(self, operation: str, seconds: float, error: CdcflowError | BaseException | None) -> None:
        self.metastore_seconds.labels(operation).observe(seconds)
        if error is not None:
            self.metastore_errors.labels(operation).inc()

    def reclaimed(self, nbytes: int) -> None:
        """A removed changefeed's directory of ``nbytes`` was deleted from the data dir."""
        self.reclaimed_dirs.inc()
        self.reclaimed_bytes.inc(nbytes)

    def exposition(self, snapshot: Snapshot) -> bytes:
        """The Prometheus text of everything: recorded metrics and ``snapshot``'s."""
        return generate_latest(cast("CollectorRegistry", _Scrape(self.registry, scraped_families(snapshot))))


_DISABLED = CaptureMetrics.__new__(CaptureMetrics)
_DISABLED.registry = CollectorRegistry()


class _Scrape:
    """What ``generate_latest`` reads: the registry's metrics, then the scraped ones."""

    def __init__(self, registry: Collector, extra: list[Metric]) -> None:
        self._registry, self._extra = registry, extra

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
        yield from self._extra


def reference_markdown() -> str:
    """docs/reference/metrics.md, generated from :data:`METRICS`."""
    lines = [
        "# Metrics reference",
        "",
        "<!-- Generated from cdcflow.core.metrics.METRICS by `python -m cdcflow.core.metrics`; do not edit. -->",
        "",
        "Every capture serves these on `GET /metrics` (Prometheus text format). *Scraped* metrics are read",
        "when Prometheus scrapes (from the metastore, or from this capture's changefeeds in memory);",
        "*recorded* ones are counted as micro-batches and metastore calls happen, and are not recorded",
        "when `server.metrics` is false. Series of a changefeed appear on the captures that run its spans;",
        "the `changefeed_*` series (read from the metastore) are the same on every capture.",
        "How to scrape them, the dashboard and alerts: [Monitor cdcflow](../how-to/monitor.md).",
        "",
        "| Metric | Type | Labels | Unit | How | Meaning |",
        "|---|---|---|---|---|---|",
    ]
    for spec in METRICS:
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "—"
        how = "scraped" if spec.scraped else "recorded"
        lines.append(f"| `{spec.name}` | {spec.kind} | {labels} | {spec.unit} | {how} | {spec.help} |")
    return "\n".join(lines) + "\n"
