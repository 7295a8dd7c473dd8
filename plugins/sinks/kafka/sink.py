"""The ``kafka`` sink: ``kafka://host:port/topic?protocol=open-protocol&...``.

Dispatch rules (``dispatchers:`` in connectors.yaml, a list; the first whose
``matcher`` table filters match a table wins; unmatched tables use the URI's
topic and the ``table`` rule)::

    dispatchers:
      - matcher: ["shop.orders"]
        topic: "cdc_{schema}_{table}"   # [prefix]{schema}[middle][{table}][suffix] or a plain name
        partition: index-value          # default | table | index-value | ts | columns
      - matcher: ["crm.*"]
        partition: columns
        columns: [region]

TiCDC's ``index`` (hash a named index) is not supported: cdcflow schemas carry
no index definitions.

Per micro-batch the sink

1. routes every row to a topic (``dispatchers`` rules, topic expressions) and
   a partition (its rule's dispatcher); an update that changes the columns the
   partition depends on is split into a delete and an insert, as TiCDC does;
2. encodes each partition's rows in order with the codec (Open Protocol packs
   up to ``max-batch-size`` rows per message) and produces them;
3. sends each DDL of the batch to every partition of its topic (schema-level
   DDL to the default topic);
4. flushes, and raises if any message was not acknowledged.

On Spark the rows of a batch are produced by Spark tasks (steps 1–2, and a
flush, per partition of the batch, each task with the producer of its
Python worker); the driver produces the DDL (step 3) once every partition
flushed. When a rule dispatches by table (``default``, ``table``), a table's
rows must reach its Kafka partition in commit-ts order: the batch runs in two
steps, tasks split by (table, key) routing and encoding rows in parallel, then
tasks split by Kafka partition packing each partition's rows, sorted again by
(commit ts, start ts, key), into messages and producing them (a batch small
enough for one task does both in it; an initial snapshot's batch, every row at
one ts, is produced by the tasks that read it: its order is free). Otherwise the batch is split by
(table, key) and each task routes, encodes and produces its rows, every row of
a key in one task, in order.

Resolved events do not follow batches: a batch's end ts is only the frontier
of the spans on this capture, and a span that joins behind it (added to a
running changefeed, moved, re-added) or runs on another capture may still
deliver rows below it. They carry the *changefeed checkpoint* instead
(``write_checkpoint``, TiCDC's ``WriteCheckpointTs``): the minimum over all
the changefeed's spans, at or below which every sink of every capture has
flushed every row; the maintainer sends it to every capture. Each one goes
to every partition of every topic the sink knows (the default topic, rule
topics without placeholders, and every topic it has written to since it
opened: a ``{schema}_{table}`` topic is known once a row of its table has
come by on this capture), and is flushed before ``write_checkpoint``
returns. Every capture of the changefeed sends them, so a partition may see
one ts several times, or a lower one after a higher: consumers keep the
highest. Codecs without a resolved form (canal-json or Avro without their
watermark options) send nothing.

Guarantees: the producer is idempotent (``enable.idempotence``, acks=all;
with ``required-acks`` 0 or 1 it is not), so the messages produced to one
partition are stored in produce order and rows of one key — which the
``table``, ``index-value`` and ``columns`` rules keep in one partition —
appear in commit-ts order. Replaying a batch (same ``batch_id`` after a
crash) produces its messages again: delivery is at-least-once, as TiCDC
documents, and consumers drop rows at or below the resolved ts they already
applied (docs/reference/open-protocol.md, "Consuming"). With the ``ts`` rule,
versions of one key may sit in different partitions; consumers must order by
commit ts across partitions, which the resolved-ts recipe does.

Topics are created when first used with ``partition-num`` partitions (3 when
0) and ``replication-factor``: through the AdminClient on real Kafka, through
``rd_kafka_mock_topic_create`` on the mock cluster (see
:mod:`cdcflow.plugins.sinks.kafka.mock` for why). An existing topic with fewer
partitions than ``partition-num`` is an error.

A broker that cannot be reached within ``write-timeout`` (librdkafka retries
until then) raises ``DownstreamUnavailableError`` (2001); a row too large for
``max-message-bytes`` raises ``MessageTooLargeError`` (1001) naming the table
and the row's key, unless ``large-message-handle-option=handle-key-only``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from cdcflow.core.data.codec import Codec, EncodedMessage
from cdcflow.core.data.events import InsertRun, MicroBatch, OpType, RowChange, TableName
from cdcflow.core.data.sink import LaneTaskWriter, LaneWriter, Sink, SinkContext, TaskWriter
from cdcflow.core.errors import CdcflowError, ConfigInvalidError, DownstreamUnavailableError
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.plugins.sinks.kafka.config import (
    DEFAULT_PARTITIONS,
    MOCK_HOST,
    PYTHON_CLIENT_BOOLEANS,
    KafkaSinkConfig,
    bootstrap_of,
)
from cdcflow.plugins.sinks.kafka.dispatch import (
    Dispatcher,
    EventRouter,
    TopicExpression,
    key_changed,
)
from cdcflow.plugins.sinks.kafka.mock import MockCluster, mock_cluster

__all__ = ["KafkaSink", "cdcflow_register_sinks"]

log = logging.getLogger(__name__)

#: Options the sink hands to its codec when the codec declares them.
CODEC_OPTIONS = (
    "max_batch_size",
    "max_message_bytes",
    "output_old_value",
    "only_output_updated_columns",
    "delete_only_output_handle_key_columns",
    "large_message_handle_option",
    "enable_tidb_extension",
    "schema_registry",
    "schema_registry_timeout",
    "avro_decimal_handling_mode",
    "avro_bigint_unsigned_handling_mode",
    "avro_time_handling_mode",
    "avro_enable_watermark",
)
#: Slack librdkafka gets over max-message-bytes for its own framing.
_REQUEST_SLACK = 4096


def codec_config_of(config: PluginConfig, codec_cls: type[Codec[Any]]) -> PluginConfig:
    """The codec's config, given the options of the sink's ``config`` it declares."""
    fields = codec_cls.Config.model_fields
    options = {name: getattr(config, name) for name in CODEC_OPTIONS if name in fields and hasattr(config, name)}
    return codec_cls.Config(**options)


def make_codec(config: PluginConfig, protocol: str, plugins: PluginManager) -> Codec[Any]:
    """The codec named ``protocol``, given the options of ``config`` it declares."""
    codec_cls = plugins.codecs[protocol]
    return codec_cls(codec_config_of(config, codec_cls))


class KafkaSink(Sink[KafkaSinkConfig]):
    """Produces row changes, DDL and resolved events to Kafka (TiCDC Open Protocol by default)."""

    type_name = "kafka"
    Config = KafkaSinkConfig
    uri_schemes = ("kafka", "kafka+ssl")
    #: A huge batch may come in parts (runtimes that split batches read this):
    #: each part's rows are produced and flushed; consumers apply none of them
    #: before a resolved event, which comes only with a changefeed checkpoint
    #: past the whole batch, so they never apply half a batch.
    accepts_partial_batches: ClassVar[bool] = True

    def __init__(self, config: KafkaSinkConfig) -> None:
        super().__init__(config)
        self._codec: Codec[Any] | None = None
        self._producer: Any = None
        self._cluster: MockCluster | None = None
        self._router = EventRouter(self.default_topic, config.dispatchers)
        self._partitions: dict[str, int] = {}
        self._errors: list[str] = []
        self._fatal = False
        self._changefeed_id = ""

    # -- configuration ----------------------------------------------------------------

    @classmethod
    def options_from_uri(cls, uri: str) -> dict[str, object]:
        """Query parameters, plus ``topic`` from the path and ``enable-tls`` for kafka+ssl://."""
        options = super().options_from_uri(uri)
        parts = urlsplit(uri)
        topic = unquote(parts.path.lstrip("/"))
        if topic:
            options.setdefault("topic", topic)
        if parts.scheme == "kafka+ssl":
            options.setdefault("enable-tls", "true")
        return options

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, KafkaSinkConfig)
        issues: list[tuple[str, str]] = []
        if config.protocol not in plugins.codecs:
            known = ", ".join(plugins.codecs.names()) or "none"
            issues.append(("protocol", f"unknown protocol {config.protocol!r}; known codecs: {known}"))
        else:
            codec_cls = plugins.codecs[config.protocol]
            issues += codec_cls.check_config(codec_config_of(config, codec_cls), plugins)
        try:
            bootstrap_of(config)
            if config.topic or not _is_mock(config):
                TopicExpression(cls._default_topic_of(config))
            EventRouter(cls._default_topic_of(config), config.dispatchers)
        except ConfigInvalidError as exc:
            issues.append(("uri", exc.message))
        if config.protocol == "avro":
            issues += _avro_issues(config)
        return issues

    @staticmethod
    def _default_topic_of(config: KafkaSinkConfig) -> str:
        if config.topic:
            return config.topic
        if _is_mock(config):
            return "cdcflow"
        raise ConfigInvalidError(f"kafka sink URI {config.uri!r} names no topic; write kafka://host:port/topic")

    @property
    def default_topic(self) -> str:
        return self._default_topic_of(self.config)

    @property
    def bootstrap_servers(self) -> str:
        """Where consumers connect (the mock cluster's brokers for kafka://mock)."""
        if self._cluster is not None:
            return self._cluster.bootstrap_servers
        return bootstrap_of(self.config)

    @property
    def mock_cluster(self) -> MockCluster | None:
        """The in-process mock cluster this sink writes to, if any."""
        return self._cluster

    # -- lifecycle ----------------------------------------------------------------------

    def open(self, context: SinkContext) -> None:
        self._changefeed_id = context.changefeed_id
        plugins = context.require_plugins("kafka")
        self._codec = make_codec(self.config, self.config.protocol, plugins)
        if _is_mock(self.config):
            self._cluster = mock_cluster(self.config.brokers)
            log.info("kafka sink: mock cluster at %s", self._cluster.bootstrap_servers)
        from confluent_kafka import Producer

        self._producer = Producer({**self._producer_config(), "error_cb": self._on_error})
        # Topics known without seeing a table get resolved events from the first
        # batch on, even after a restart: the default topic and plain rule topics.
        self._partition_count(self.default_topic)
        for rule in self.config.dispatchers:
            if rule.topic and "{" not in rule.topic:
                self._partition_count(rule.topic)

    def _restart_producer(self) -> None:
        """A new producer (new idempotence epoch) after a fatal error; the batch is then replayed whole."""
        from confluent_kafka import Producer

        log.warning("kafka sink %s: restarting the producer after a fatal error", self.bootstrap_servers)
        self._producer.flush(0)
        self._producer = Producer({**self._producer_config(), "error_cb": self._on_error})
        self._fatal = False

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.config.write_timeout)
            self._producer = None

    def _producer_config(self) -> dict[str, Any]:
        cfg = self.config
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": cfg.kafka_client_id or f"cdcflow_producer_{self._changefeed_id or 'sink'}",
            "acks": "all" if cfg.required_acks == -1 else str(cfg.required_acks),
            "enable.idempotence": cfg.required_acks == -1,
            "compression.type": cfg.compression,
            "message.max.bytes": max(cfg.max_message_bytes + _REQUEST_SLACK, 1_000_000),
            "message.timeout.ms": int(cfg.write_timeout * 1000),
            "allow.auto.create.topics": False,
            "linger.ms": 5,
            # Delivery reports of failed messages only: a report is what tells of a failure
            # (flush counts the rest), and each report of a success cost a copy of its
            # message's value into a Python object, then a callback doing nothing.
            "delivery.report.only.error": True,
        }
        ssl = cfg.enable_tls
        if cfg.sasl_mechanism:
            conf["security.protocol"] = "sasl_ssl" if ssl else "sasl_plaintext"
            conf.update({"sasl.mechanism": cfg.sasl_mechanism, "sasl.username": cfg.sasl_user})
            conf["sasl.password"] = cfg.sasl_password.get_secret_value()
        elif ssl:
            conf["security.protocol"] = "ssl"
        if ssl:
            for option, prop in (
                ("ca", "ssl.ca.location"),
                ("cert", "ssl.certificate.location"),
                ("key", "ssl.key.location"),
            ):
                if getattr(cfg, option):
                    conf[prop] = getattr(cfg, option)
            conf["enable.ssl.certificate.verification"] = not cfg.insecure_skip_verify
        conf.update(cfg.producer_config)
        for prop in PYTHON_CLIENT_BOOLEANS:  # "true"/"false" in producer-config (validated): a bool
            if isinstance(conf.get(prop), str):
                conf[prop] = conf[prop] == "true"
        return conf

    # -- topics -------------------------------------------------------------------------

    def _partition_count(self, topic: str) -> int:
        """Partitions rows of ``topic`` are dispatched over; creates the topic when missing."""
        known = self._partitions.get(topic)
        if known is not None:
            return known
        actual = self._existing_partitions(topic)
        wanted = self.config.partition_num or DEFAULT_PARTITIONS
        if actual is None:
            if not self.config.auto_create_topic:
                raise ConfigInvalidError(f"topic {topic!r} does not exist and auto-create-topic is false")
            self._create_topic(topic, wanted)
            actual = self._existing_partitions(topic) or wanted
        if self.config.partition_num > actual:
            raise ConfigInvalidError(
                f"partition-num={self.config.partition_num} but topic {topic!r} has only {actual} partitions; "
                "lower partition-num or add partitions to the topic"
            )
        count = self.config.partition_num or actual
        self._partitions[topic] = count
        return count

    def _existing_partitions(self, topic: str) -> int | None:
        from confluent_kafka import KafkaError, KafkaException

        try:
            meta = self._producer.list_topics(topic, timeout=self.config.write_timeout)
        except KafkaException as exc:
            raise self._unavailable(f"cannot read metadata of topic {topic!r}: {exc}") from exc
        info = meta.topics.get(topic)
        if info is None or (info.error is not None and info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        if info.error is not None:
            raise self._unavailable(f"metadata of topic {topic!r}: {info.error}")
        return len(info.partitions)

    def _create_topic(self, topic: str, partitions: int) -> None:
        if self._cluster is not None:
            self._cluster.create_topic(topic, partitions, self.config.replication_factor)
            return
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin_conf = {k: v for k, v in self._producer_config().items() if k not in _PRODUCER_ONLY}
        future = AdminClient(admin_conf).create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=self.config.replication_factor)],
            request_timeout=self.config.write_timeout,
        )[topic]
        try:
            future.result(timeout=self.config.write_timeout + 5)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            raise self._unavailable(f"cannot create topic {topic!r}: {exc}") from exc

    # -- writing --------------------------------------------------------------------------

    def write_batch(self, batch: MicroBatch) -> None:
        codec = self._require_codec()
        if self._fatal:
            self._restart_producer()
        self._errors = []
        outgoing = encode_rows(batch.rows, self._router, self._partition_count, codec)
        for ddl in batch.ddl:
            topic = self._router.topic_of(ddl.table)
            ddl_message = codec.encode_ddl(ddl)
            if ddl_message is not None:
                outgoing += [(topic, p, ddl_message) for p in range(self._partition_count(topic))]
        for topic, partition, message in outgoing:
            self._produce(topic, partition, message)
        self._flush(
            f"batch {batch.batch_id} (ts {batch.start_ts}..{batch.end_ts})",
            batch_id=batch.batch_id,
        )

    def task_partitioning(self) -> str:
        """By table when some table's rows all go to one Kafka partition (their commit-ts
        order there is kept by one task), else by key."""
        return "table" if self._router.dispatches_by_table() else "key"

    def task_writer(self, tables: Sequence[TableName]) -> TaskWriter:
        """Produces from Spark tasks; topics of ``tables`` exist (created here) before they run."""
        codec = self._require_codec()
        for table in tables:
            self._partition_count(self._router.route(table)[0])
        producer_config = self._producer_config()
        return _KafkaTaskWriter(
            {**producer_config, "client.id": f"{producer_config['client.id']}_task"},
            self._router,
            codec,
            dict(self._partitions),
            self.config.write_timeout,
            self.bootstrap_servers,
        )

    def write_checkpoint(self, ts: int) -> None:
        """A resolved event at the changefeed checkpoint ``ts`` to every partition of
        every known topic (see the module docs), flushed before returning."""
        codec = self._require_codec()
        resolved = codec.encode_resolved(ts)
        if resolved is None:
            return  # the codec has no resolved form (canal-json, Avro without watermarks)
        if self._fatal:
            self._restart_producer()
        self._errors = []
        for topic, count in list(self._partitions.items()):
            for partition in range(count):
                self._produce(topic, partition, resolved)
        self._flush(f"resolved event {ts}", resolved_ts=ts)

    def _produce(self, topic: str, partition: int, message: EncodedMessage) -> None:
        produce(self._producer, topic, partition, message, self._on_delivery, self.bootstrap_servers)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
            if err.fatal():
                self._fatal = True

    def _on_error(self, err: Any) -> None:
        # Broker connection errors are retried by librdkafka; a fatal one (the
        # idempotent producer lost its guarantees) needs a new producer.
        log.warning("kafka sink %s: %s", self.bootstrap_servers, err.str())
        if err.fatal():
            self._fatal = True

    def _flush(self, what: str, **detail: Any) -> None:
        left = self._producer.flush(self.config.write_timeout + 5)
        if left or self._errors:
            shown = "; ".join(self._errors[:3]) or f"{left} messages not acknowledged in time"
            raise self._unavailable(f"{what} not fully delivered: {shown}", **detail, failed=len(self._errors) + left)

    def _unavailable(self, message: str, **detail: Any) -> CdcflowError:
        return DownstreamUnavailableError(
            f"kafka sink {self.bootstrap_servers}: {message}", detail={"brokers": self.bootstrap_servers, **detail}
        )

    def _require_codec(self) -> Codec[Any]:
        if self._codec is None or self._producer is None:
            raise RuntimeError("KafkaSink written to before open()")
        return self._codec


def encode_rows(
    rows: Iterable[RowChange], router: EventRouter, partition_count: Callable[[str], int], codec: Codec[Any]
) -> list[tuple[str, int, EncodedMessage]]:
    """Route ``rows`` to (topic, partition) — an update that moves a row between
    partitions as a delete and an insert — and encode each partition's rows in order.
    Everything is encoded before anything is produced: a row that cannot be encoded
    (too large) fails the batch first."""
    routed = route_rows(rows, router, partition_count)
    return [
        (t, p, m) for (t, p), items in routed.items() for m in codec.encode_rows_for_topic(t, [r for _, r in items])
    ]


def route_rows(
    rows: Iterable[RowChange], router: EventRouter, partition_count: Callable[[str], int]
) -> dict[tuple[str, int], list[tuple[int, RowChange]]]:
    """The rows (with their index in ``rows``) bound for each (topic, partition), in order."""
    return _route(rows, router, partition_count, indexed=True)


def _route(
    rows: Iterable[RowChange], router: EventRouter, partition_count: Callable[[str], int], *, indexed: bool
) -> dict[tuple[str, int], list[Any]]:
    """:func:`route_rows`, each row as ``(index, row)`` when ``indexed``, else alone.

    A table is routed once per call (rows of one table share their name object, mostly):
    under a dispatcher that puts all of a table's rows in one partition and moves none
    (the table rule), its rows are appended to that partition's list without a per-row
    decision."""
    routed: dict[tuple[str, int], list[Any]] = {}
    tables: dict[int, tuple[TableName, str, Dispatcher, int, list[Any] | None]] = {}
    for i, row in enumerate(rows):
        table = row.table
        hit = tables.get(id(table))
        if hit is None or hit[0] is not table:
            topic, dispatcher = router.route(table)
            count = partition_count(topic)
            fixed = _fixed_partition(dispatcher, table, count)
            whole = None if fixed is None else routed.setdefault((topic, fixed), [])
            hit = tables[id(table)] = (table, topic, dispatcher, count, whole)
        whole = hit[4]
        if whole is not None:
            whole.append((i, row) if indexed else row)
            continue
        _, topic, dispatcher, count, _ = hit
        for part in _split_if_moved(row) if key_changed(dispatcher, row) else (row,):
            routed.setdefault((topic, dispatcher.partition(part, count)), []).append((i, part) if indexed else part)
    return routed


def _fixed_partition(dispatcher: Dispatcher, table: TableName, count: int) -> int | None:
    """The partition of all of ``table``'s rows (the table rule's), None when it depends on
    the row: the dispatcher gives none, or it may name columns whose change moves a row
    (``key_columns``: such a row is split and its parts routed one by one)."""
    if type(dispatcher).key_columns is not Dispatcher.key_columns:
        return None
    return dispatcher.table_partition(table, count)


#: One producer per Python worker and configuration, reused by the tasks the worker runs.
_TASK_PRODUCERS: dict[tuple[tuple[str, str], ...], Any] = {}
_TASK_PRODUCERS_KEPT = 2


class _KafkaTaskWriter(LaneTaskWriter):
    """What Spark tasks need to produce a partition of a batch: the producer's
    configuration, the routing rules, the codec and the topics' partition counts.
    A lane is a topic's partition: rows are routed and encoded into parts anywhere,
    and a lane's parts packed into messages (the codec's batching) where it is produced."""

    def __init__(
        self,
        producer_config: dict[str, Any],
        router: EventRouter,
        codec: Codec[Any],
        partitions: dict[str, int],
        write_timeout: float,
        brokers: str,
    ) -> None:
        self.producer_config = producer_config
        self.router = router
        self.codec = codec
        self.partitions = partitions
        self.write_timeout = write_timeout
        self.brokers = brokers

    def producer(self) -> Any:
        key = tuple(sorted((k, str(v)) for k, v in self.producer_config.items()))
        producer = _TASK_PRODUCERS.get(key)
        if producer is None:
            from confluent_kafka import Producer

            # A worker serves one changefeed's sink at a time, mostly: producers of
            # other configurations (a changefeed gone, brokers moved) are dropped.
            while len(_TASK_PRODUCERS) >= _TASK_PRODUCERS_KEPT:
                _TASK_PRODUCERS.pop(next(iter(_TASK_PRODUCERS))).flush(0)
            producer = _TASK_PRODUCERS[key] = Producer(self.producer_config)
        return producer

    def _partition_count(self, topic: str) -> int:
        count = self.partitions.get(topic)
        if count is None:
            raise DownstreamUnavailableError(
                f"kafka sink {self.brokers}: a Spark task routed a row to topic {topic!r}, "
                "which the driver did not prepare; the batch is retried",
                detail={"brokers": self.brokers, "topic": topic},
            )
        return count

    def encode(self, rows: Sequence[RowChange]) -> list[tuple[int, str, int, EncodedMessage]]:
        out: list[tuple[int, str, int, EncodedMessage]] = []
        for (topic, partition), items in route_rows(rows, self.router, self._partition_count).items():
            parts = self.codec.encode_row_parts(topic, [row for _, row in items])
            out += [(i, topic, partition, part) for (i, _), part in zip(items, parts, strict=True)]
        return out

    def encode_lanes(self, rows: Sequence[RowChange]) -> dict[tuple[str, int], list[EncodedMessage]]:
        routed = _route(rows, self.router, self._partition_count, indexed=False)
        return {lane: self.codec.encode_row_parts(lane[0], parts) for lane, parts in routed.items()}

    def encode_insert_lanes(self, run: InsertRun) -> dict[tuple[str, int], list[EncodedMessage]]:
        """Under a dispatcher that puts a table in one partition (the table rule): the run
        routed once, to that lane, and encoded whole (the codec's
        :meth:`~cdcflow.core.data.codec.Codec.encode_insert_parts`); else row by row."""
        topic, dispatcher = self.router.route(run.table)
        count = self._partition_count(topic)
        partition = _fixed_partition(dispatcher, run.table, count)
        if partition is None:
            return self.encode_lanes(run.rows())
        return {(topic, partition): self.codec.encode_insert_parts(topic, run)}

    def open_lanes(self, batch: MicroBatch, partition: int) -> LaneWriter:
        return _KafkaLaneWriter(self, batch)

    def table_lanes(self, table: TableName) -> list[tuple[str, int]] | None:
        """The table's partition under the table dispatcher, else every partition of its
        topic (a row moved by a key change may go to any of them, and so may its parts);
        None for a topic the driver did not prepare (its rows' tasks report it)."""
        topic, dispatcher = self.router.route(table)
        count = self.partitions.get(topic)
        if count is None:
            return None
        partition = _fixed_partition(dispatcher, table, count)
        return [(topic, partition)] if partition is not None else [(topic, p) for p in range(count)]


class _KafkaLaneWriter(LaneWriter):
    def __init__(self, target: _KafkaTaskWriter, batch: MicroBatch) -> None:
        self._target = target
        self._batch = batch
        self._producer = target.producer()
        self._errors: list[str] = []

    def write(self, route: str, lane: int, parts: Sequence[EncodedMessage]) -> None:
        for message in self._target.codec.assemble(route, parts):
            produce(self._producer, route, lane, message, self._on_delivery, self._target.brokers)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

    def flush(self) -> None:
        left = self._producer.flush(self._target.write_timeout + 5)
        if left or self._errors:
            shown = "; ".join(self._errors[:3]) or f"{left} messages not acknowledged in time"
            raise DownstreamUnavailableError(
                f"kafka sink {self._target.brokers}: batch {self._batch.batch_id} not fully delivered: {shown}",
                detail={"brokers": self._target.brokers, "batch_id": self._batch.batch_id},
            )


def produce(
    producer: Any, topic: str, partition: int, message: EncodedMessage, on_delivery: Callable[..., None], brokers: str
) -> None:
    """Produce one message, waiting while librdkafka's local queue is full."""
    from confluent_kafka import KafkaException

    while True:
        try:
            # An empty value is a tombstone: Kafka's null value (Avro deletes).
            value = message.value if message.value or message.key is None else None
            producer.produce(topic, value, message.key, partition, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)  # local queue full: let deliveries drain
        except KafkaException as exc:
            raise DownstreamUnavailableError(
                f"kafka sink {brokers}: cannot produce to {topic}[{partition}]: {exc}",
                detail={"brokers": brokers, "topic": topic},
            ) from exc


def _avro_issues(config: KafkaSinkConfig) -> list[tuple[str, str]]:
    """Avro needs one table per topic (TiCDC's rule): topics with {schema} and {table}."""
    issues = []
    for n, rule in enumerate(config.dispatchers):
        if rule.topic and not ("{schema}" in rule.topic and "{table}" in rule.topic):
            issues.append((f"dispatchers.{n}.topic", "protocol=avro needs topic expressions with {schema} and {table}"))
    return issues


def _is_mock(config: KafkaSinkConfig) -> bool:
    return bool(config.uri) and urlsplit(config.uri).hostname == MOCK_HOST


#: Producer properties of the sink's configuration that its admin client is not given.
_PRODUCER_ONLY = frozenset(
    {
        "acks",
        "enable.idempotence",
        "compression.type",
        "message.timeout.ms",
        "linger.ms",
        "delivery.report.only.error",
        "allow.auto.create.topics",
    }
)


def _split_if_moved(row: RowChange) -> tuple[RowChange, RowChange]:
    """An update that moves a row between partitions, as a delete and an insert."""
    replace: Callable[..., RowChange] = dataclasses.replace
    return (
        replace(row, op=OpType.DELETE, after=None),
        replace(row, op=OpType.INSERT, before=None),
    )


@hookimpl
def cdcflow_register_sinks(registry: Registrar[Sink[Any]]) -> None:
    registry.add(KafkaSink)
