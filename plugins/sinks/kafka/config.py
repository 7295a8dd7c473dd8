"""Options of the Kafka sink (TiCDC's sink-URI parameters, kebab-case)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin import PluginConfig
from cdcflow.plugins.codecs.open_protocol import DEFAULT_MAX_MESSAGE_BYTES
from cdcflow.plugins.sinks.kafka.dispatch import DispatchRule

__all__ = ["MOCK_HOST", "KafkaSinkConfig", "bootstrap_of"]

#: ``kafka://mock/...`` starts librdkafka's in-process mock cluster.
MOCK_HOST = "mock"
#: Partitions of a topic the sink creates when ``partition-num`` is not given (TiCDC's default).
DEFAULT_PARTITIONS = 3


class KafkaSinkConfig(PluginConfig):
    """Options of the Kafka sink."""

    uri: str = Field("", description="kafka://host:port[,host:port]/topic?... or kafka://mock/topic?brokers=3.")
    topic: str = Field("", description="Default topic (the URI path); tables no dispatch rule matches go here.")
    brokers: int = Field(3, ge=1, le=16, description="Broker count of the in-process mock cluster (kafka://mock only).")
    partition_num: int = Field(
        0,
        ge=0,
        description="Partitions to dispatch over; topics the sink creates get this many (0: 3, or the topic's).",
    )
    replication_factor: int = Field(1, ge=1, description="Replication factor of topics the sink creates.")
    auto_create_topic: bool = Field(
        True, description="Create missing topics (AdminClient; mock: rd_kafka_mock_topic_create)."
    )
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES, ge=1024, description="Largest message, key + value + record overhead, in bytes."
    )
    max_batch_size: int = Field(16, ge=1, description="Most row changes in one Open Protocol message.")
    protocol: str = Field(
        "open-protocol", description="Codec of the messages: open-protocol, canal-json, avro or json."
    )
    kafka_client_id: str = Field("", description="Kafka client.id; empty: cdcflow_producer_<changefeed>.")
    compression: Literal["none", "lz4", "gzip", "snappy", "zstd"] = Field(
        "none", description="Producer compression (transparent to consumers)."
    )
    required_acks: int = Field(-1, ge=-1, le=1, description="Acks: -1 (all; enables the idempotent producer), 0 or 1.")
    write_timeout: float = Field(
        10.0, gt=0, description="Seconds librdkafka may spend delivering (with retries) before the write fails."
    )
    large_message_handle_option: Literal["none", "handle-key-only"] = Field(
        "none", description="A row over max-message-bytes fails the batch (none) or is sent with its handle key only."
    )
    enable_tidb_extension: bool = Field(False, description="canal-json: add the _tidb field and WATERMARK events.")
    output_old_value: bool = Field(True, description="open-protocol: write the old image of updates ('p').")
    only_output_updated_columns: bool = Field(
        False, description="open-protocol: leave columns an update did not change out of 'p'."
    )
    delete_only_output_handle_key_columns: bool = Field(
        False, description="open-protocol: write only the handle-key columns of deleted rows."
    )
    schema_registry: str = Field(
        "", description="avro: Confluent Schema Registry URL, http(s)://[user:password@]host:port (basic auth)."
    )
    schema_registry_timeout: float = Field(10.0, gt=0, description="avro: seconds per schema registry request.")
    avro_decimal_handling_mode: Literal["precise", "string"] = Field(
        "precise", description="avro: DECIMAL as Avro decimal bytes (precise) or as string."
    )
    avro_bigint_unsigned_handling_mode: Literal["long", "string"] = Field(
        "long", description="avro: BIGINT UNSIGNED as long or as string."
    )
    avro_time_handling_mode: Literal["logical", "string"] = Field(
        "logical", description="avro: DATE/DATETIME/TIMESTAMP/TIME as Avro logical types or as strings (TiCDC)."
    )
    avro_enable_watermark: bool = Field(
        False, description="avro with enable-tidb-extension: also send DDL and resolved-ts messages (TiCDC framing)."
    )
    enable_tls: bool = Field(False, description="Connect with TLS (implied by kafka+ssl://).")
    ca: str = Field("", description="CA certificate file for TLS.")
    cert: str = Field("", description="Client certificate file for TLS.")
    key: str = Field("", description="Client private key file for TLS.")
    insecure_skip_verify: bool = Field(False, description="Do not verify the brokers' TLS certificates.")
    sasl_mechanism: Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"] = Field(
        "", description="SASL mechanism; empty: no SASL."
    )
    sasl_user: str = Field("", description="SASL user name.")
    sasl_password: SecretStr = Field(
        SecretStr(""), description="SASL password (use ${VAR} in connectors.yaml); masked wherever shown."
    )
    dispatchers: list[DispatchRule] = Field(
        default_factory=list, description="Per-table topic and partition rules; the first matching rule wins."
    )
    producer_config: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra librdkafka producer properties, applied last (over cdcflow's linger.ms 5 and "
            "delivery.report.only.error true, a failed message's report being the one read)."
        ),
    )

    @field_validator("producer_config")
    @classmethod
    def _python_client_booleans(cls, value: dict[str, str]) -> dict[str, str]:
        """Each of :data:`PYTHON_CLIENT_BOOLEANS` given is true/false/1/0 (any case),
        kept as ``"true"`` or ``"false"``."""
        out = dict(value)
        for prop in PYTHON_CLIENT_BOOLEANS:
            if prop in out:
                word = _BOOLEAN_WORDS.get(out[prop].strip().lower())
                if word is None:
                    raise ValueError(f"{prop} must be true or false, not {out[prop]!r}")
                out[prop] = word
        return out


#: Producer properties the Python client reads itself, as booleans (librdkafka's other
#: properties take their text as it is).
PYTHON_CLIENT_BOOLEANS = ("delivery.report.only.error",)
_BOOLEAN_WORDS = {"true": "true", "1": "true", "false": "false", "0": "false"}


def bootstrap_of(config: KafkaSinkConfig) -> str:
    """``host:port[,host:port]`` of the URI (or ``mock``)."""
    if not config.uri:
        raise ConfigInvalidError("kafka sink needs a uri: kafka://host:port/topic or kafka://mock/topic")
    parts = urlsplit(config.uri)
    if parts.scheme not in ("kafka", "kafka+ssl"):
        raise ConfigInvalidError(f"kafka sink URI must start with kafka:// or kafka+ssl://, got {config.uri!r}")
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        raise ConfigInvalidError(f"kafka sink URI {config.uri!r} names no broker; write kafka://host:port/topic")
    for broker in hosts.split(","):
        host, port = broker, ""
        if broker.startswith("["):  # [::1]:9092
            host, _, rest = broker.partition("]")
            port = rest.removeprefix(":")
            if not rest.startswith(":") and rest:
                host = ""
        elif ":" in broker:
            host, _, port = broker.rpartition(":")
        if not host or (port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)):
            raise ConfigInvalidError(
                f"kafka sink URI names broker {broker!r}, which is not host:port with a port in 1..65535; "
                "write kafka://host:port[,host:port]/topic"
            )
    return hosts
