import pytest
from hypothesis import settings

from cdcflow.plugins.sinks.kafka.mock import shutdown_mock_clusters

# Property tests check behaviour, not speed: Hypothesis's default per-example deadline
# (200 ms) is a wall-clock threshold that a loaded machine fails on, so there is none.
settings.register_profile("cdcflow", deadline=None)
settings.load_profile("cdcflow")


@pytest.fixture(scope="session", autouse=True)
def _stop_mock_kafka_clusters():
    """Kafka mock clusters live for the process; stop them when the session ends."""
    yield
    shutdown_mock_clusters()
