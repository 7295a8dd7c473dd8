"""A Kafka cluster: a testcontainers container or librdkafka's built-in mock cluster.

The local flavour is the mock cluster of :mod:`cdcflow.plugins.sinks.kafka.mock`
(in this process, reachable from other processes at its bootstrap address while
this process lives); the container flavour runs :data:`KAFKA_IMAGE` (KRaft, one
broker). Either way the caller sees a :class:`KafkaServer` with
``bootstrap_servers`` and :meth:`KafkaServer.create_topic`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cdcflow.core.testing.servers.engine import choose_backend

__all__ = ["KAFKA_IMAGE", "KafkaServer", "kafka_container", "start_kafka"]

#: The image of the container flavour.
KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"


class KafkaServer:
    """A running cluster: its bootstrap address and topic creation."""

    def __init__(self, bootstrap_servers: str, *, mock: Any = None, container: Any = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._mock = mock
        self._container = container

    @property
    def backend(self) -> str:
        return "container" if self._container is not None else "local"

    def create_topic(self, topic: str, partitions: int = 3) -> None:
        """Create ``topic`` with ``partitions`` partitions (replication 1 on a container)."""
        if self._mock is not None:
            self._mock.create_topic(topic, partitions, 3)
            return
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
            future.result(30)

    def stop(self) -> None:
        if self._container is not None:
            self._container.stop()


def kafka_container(image: str = KAFKA_IMAGE) -> Any:
    """The testcontainers ``KafkaContainer`` the container flavour runs (built, not started)."""
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # testcontainers before 4.14
        from testcontainers.kafka import KafkaContainer

    return KafkaContainer(image).with_kraft()


@contextlib.contextmanager
def start_kafka(*, image: str = KAFKA_IMAGE, backend: str | None = None) -> Iterator[KafkaServer]:
    """A Kafka cluster for the duration of the block (``backend``: ``auto``, ``container``, ``local``).

    The mock cluster is shared by the process (it lives until
    :func:`~cdcflow.plugins.sinks.kafka.mock.shutdown_mock_clusters`): what was
    written to it stays readable after the block.
    """
    if choose_backend("kafka", backend) == "container":
        container = kafka_container(image)
        container.start()
        server = KafkaServer(container.get_bootstrap_server(), container=container)
        try:
            yield server
        finally:
            server.stop()
        return
    from cdcflow.plugins.sinks.kafka.mock import mock_cluster

    cluster = mock_cluster(3)
    yield KafkaServer(cluster.bootstrap_servers, mock=cluster)
