"""Which server a fixture starts: containers with Docker mocked as present, the local
fallback with Docker mocked as absent, and the choice logged either way.

Without an engine on this machine the container path goes as far as it can: the
testcontainers object is built (its Docker client replaced by a recorder) with the
image, environment and ports a real run would use, and ``start()`` is where it stops.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from cdcflow.core.testing.servers import engine, etcd, kafka, mariadb, spark


class _RecordingDockerClient:
    """Stands in for testcontainers' DockerClient: what a container would ask of the engine."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs


class _Started(Exception):
    """Raised by a container's start(): the point where a real engine would be needed."""


@pytest.fixture
def docker_present(monkeypatch):
    from testcontainers.core import container

    monkeypatch.setattr(engine, "docker_available", lambda: True)
    monkeypatch.setattr(container, "DockerClient", _RecordingDockerClient)
    monkeypatch.delenv(engine.BACKEND_ENV, raising=False)

    def start(self):
        raise _Started(self)

    monkeypatch.setattr(container.DockerContainer, "start", start)


@pytest.fixture
def docker_absent(monkeypatch):
    monkeypatch.setattr(engine, "docker_available", lambda: False)
    monkeypatch.delenv(engine.BACKEND_ENV, raising=False)


def test_the_mysql_container_is_mariadb_with_a_root_password(docker_present):
    container = mariadb.mysql_container()
    assert container.image.endswith(mariadb.MARIADB_IMAGE)
    assert (container.username, container.root_password) == ("root", "cdcflow")  # MariaDB's URI: root:cdcflow@
    assert container.dbname == "cdcflow_test"
    assert "3306" in container.ports


def test_the_kafka_container_runs_kraft_on_its_listener_port(docker_present):
    container = kafka.kafka_container()
    assert container.image.endswith(kafka.KAFKA_IMAGE)
    assert str(container.port) in container.ports
    assert container.kraft_enabled


def test_the_etcd_container_listens_for_clients_on_all_interfaces(docker_present):
    container = etcd.etcd_container()
    assert container.image.endswith(etcd.ETCD_IMAGE)
    assert "2379" in container.ports
    assert "--listen-client-urls http://0.0.0.0:2379" in container._command


@pytest.mark.parametrize(
    ("start", "image"),
    [
        (mariadb.start_mariadb, mariadb.MARIADB_IMAGE),
        (kafka.start_kafka, kafka.KAFKA_IMAGE),
        (etcd.start_etcd, etcd.ETCD_IMAGE),
    ],
)
def test_with_docker_each_server_starts_its_container(docker_present, caplog, start, image):
    caplog.set_level(logging.INFO, logger="cdcflow.testing")
    with pytest.raises(_Started) as started, start():
        pass
    assert started.value.args[0].image.endswith(image)
    assert "testcontainers container (a Docker engine answered)" in caplog.text


def test_without_docker_the_local_fallback_is_chosen_and_logged(docker_absent, caplog):
    caplog.set_level(logging.INFO, logger="cdcflow.testing")
    assert engine.choose_backend("mysql") == "local"
    assert "mysql: local server (no Docker engine answered: the local fallback)" in caplog.text
    with kafka.start_kafka() as server:  # the mock cluster: no binary to install
        assert server.backend == "local" and server.bootstrap_servers


def test_a_container_demanded_without_docker_is_an_error(docker_absent):
    with pytest.raises(RuntimeError, match="no Docker engine answers"):
        engine.choose_backend("etcd", "container")


def test_local_is_chosen_even_with_docker_when_asked(docker_present, caplog):
    caplog.set_level(logging.INFO, logger="cdcflow.testing")
    assert engine.choose_backend("mysql", "local") == "local"
    assert f"({engine.BACKEND_ENV}=local)" in caplog.text


def test_the_spark_cluster_is_local_even_with_docker(docker_present, caplog):
    caplog.set_level(logging.INFO, logger="cdcflow.testing")
    assert engine.choose_backend("spark cluster", container_possible=False) == "local"
    assert "must run this machine's Python environment" in caplog.text


def test_the_spark_daemons_run_the_pyspark_distribution_classes(tmp_path):
    cluster = spark.SparkCluster(tmp_path, cores=1, memory="512m")
    master, worker = cluster.master_command(), cluster.worker_command()
    jars = f"{spark.spark_home() / 'jars'}/*"
    assert jars in master[master.index("-cp") + 1] and jars in worker[worker.index("-cp") + 1]
    assert "org.apache.spark.deploy.master.Master" in master
    assert master[master.index("--host") + 1] == "127.0.0.1"
    assert worker[-1] == cluster.master_url == f"spark://127.0.0.1:{cluster.port}"
    assert worker[worker.index("--cores") + 1] == "1" and worker[worker.index("--memory") + 1] == "512m"
    assert cluster._env["SPARK_SCALA_VERSION"].startswith("2.")
    assert cluster._env["PYSPARK_PYTHON"] == sys.executable


def test_the_plugin_is_loaded_and_a_test_without_its_fixtures_starts_nothing(tmp_path):
    """The entry point makes the fixtures available to any suite; a suite that does not ask for
    them logs no server choice at all (session fixtures are lazy)."""
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            def test_the_plugin_is_registered(request):
                assert request.config.pluginmanager.has_plugin("cdcflow")

            def test_kafka(cdcflow_kafka):
                assert cdcflow_kafka.bootstrap_servers
            """
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--log-level=INFO", "-rA", str(tmp_path)],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "CDCFLOW_TEST_BACKEND": "local"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
    # Only the test that asked for Kafka made a choice, and said which.
    assert run.stdout.count("kafka: local server") == 1, run.stdout
    assert "mysql:" not in run.stdout and "etcd:" not in run.stdout
