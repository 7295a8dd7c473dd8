import textwrap

import pytest

from cdcflow.core.config import validate_text
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin import PluginManager
from cdcflow.plugins.sinks.kafka import KafkaSink, KafkaSinkConfig


@pytest.fixture(scope="module")
def pm():
    return PluginManager.default(autoload=False)


def check(text, pm):
    deployment, issues = validate_text(textwrap.dedent(text), "c.yaml", pm, {})
    return deployment, [str(i) for i in issues]


def test_uri_options_and_dispatchers_from_yaml(pm):
    deployment, issues = check(
        """
        connectors:
          - name: a
            source: {type: tikv}
            sinks:
              - uri: kafka+ssl://b1:9093,b2:9093/cdc?partition-num=5&max-batch-size=8&required-acks=1
                dispatchers:
                  - matcher: ["shop.*"]
                    topic: "x_{schema}_{table}"
                    partition: columns
                    columns: [id]
        """,
        pm,
    )
    assert issues == []
    config = deployment.connectors[0].sinks[0].config
    assert isinstance(config, KafkaSinkConfig)
    assert (config.topic, config.partition_num, config.max_batch_size, config.required_acks) == ("cdc", 5, 8, 1)
    assert config.enable_tls and config.dispatchers[0].columns == ["id"]
    sink = KafkaSink(config)
    assert sink.bootstrap_servers == "b1:9093,b2:9093"
    producer = sink._producer_config()
    assert producer["security.protocol"] == "ssl" and producer["acks"] == "1"
    assert producer["enable.idempotence"] is False  # idempotence needs acks=all
    assert producer["delivery.report.only.error"] is True  # reports of failures only


@pytest.mark.parametrize(("text", "want"), [("false", False), (" TRUE ", True), ("0", False)])
def test_a_python_client_boolean_in_producer_config_is_given_as_a_bool(text: str, want: bool) -> None:
    config = KafkaSinkConfig(uri="kafka://h:9092/t", topic="t", producer_config={"delivery.report.only.error": text})
    assert KafkaSink(config)._producer_config()["delivery.report.only.error"] is want


def test_a_python_client_boolean_that_is_no_boolean_is_refused() -> None:
    with pytest.raises(ValueError, match=r"delivery\.report\.only\.error must be true or false, not 'sometimes'"):
        KafkaSinkConfig(uri="kafka://h:9092/t", producer_config={"delivery.report.only.error": "sometimes"})


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        ("{uri: 'kafka://h:9092'}", "names no topic"),
        ("{uri: 'kafka://h:9092/t?protocol=avro-ish'}", "unknown protocol 'avro-ish'"),
        ("{uri: 'kafka://h:9092/t', dispatchers: [{topic: '{table}'}]}", "topic expression '{table}' is invalid"),
        ("{uri: 'kafka://h:9092/t', dispatchers: [{partition: hash}]}", "unknown partition rule 'hash'"),
        ("{uri: 'kafka://h:9092/t?compression=brotli'}", "compression"),
        ("{uri: 'kafka://h:9092/t?protocol=avro'}", "needs schema-registry"),
        (
            "{uri: 'kafka://h:9092/t?protocol=avro&schema-registry=http://r', dispatchers: [{topic: 'x_{schema}'}]}",
            "with {schema} and {table}",
        ),
    ],
)
def test_bad_kafka_sinks_are_reported(pm, sink, message):
    _, issues = check(
        f"""
        connectors:
          - name: a
            source: {{type: tikv}}
            sinks: [{sink}]
        """,
        pm,
    )
    assert any(message in issue for issue in issues), issues


def test_mock_uri_needs_no_topic():
    sink = KafkaSink(KafkaSinkConfig(uri="kafka://mock?brokers=2", brokers=2))
    assert sink.default_topic == "cdcflow"
    with pytest.raises(ConfigInvalidError, match="names no topic"):
        KafkaSink(KafkaSinkConfig(uri="kafka://h:9092"))
