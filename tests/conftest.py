import pytest

from cdcflow.plugins.sinks.kafka.mock import shutdown_mock_clusters


@pytest.fixture(scope="session", autouse=True)
def _stop_mock_kafka_clusters():
    """Kafka mock clusters live for the process; stop them when the session ends."""
    yield
    shutdown_mock_clusters()
