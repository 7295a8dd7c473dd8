"""A Spark standalone cluster on this machine: a master and a worker, each a JVM of its own.

Both run from the pyspark distribution's own classes (``java -cp <pyspark>/jars/*
org.apache.spark.deploy.master.Master`` / ``...worker.Worker spark://...``) on
127.0.0.1 with small heaps, in process groups of their own so that stopping the
cluster also ends the executors the worker launched. A driver then uses
``spark://127.0.0.1:<port>`` (:attr:`SparkCluster.master_url`) with the properties
of :meth:`SparkCluster.driver_conf`.

What the executors need, and how this cluster gives it to them:

* the driver's Python environment: the worker's executors start the Python workers
  the driver names (``PYSPARK_PYTHON``, set by cdcflow's session to the driver's
  interpreter), which import cdcflow and the plugins from the same environment;
* the event store directory: executors read the resolved chunks at the absolute
  path the driver gives them, so the capture's ``data-dir`` must be on storage the
  driver and every executor share (here: the same machine).

There is no container flavour: an executor in a container would need this
machine's Python environment (cdcflow and the user's plugins) inside the image.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cdcflow.core.data.pipeline.classcache import java_executable
from cdcflow.core.errors import NotAvailableError
from cdcflow.core.testing.servers.engine import choose_backend
from cdcflow.core.testing.servers.mariadb import free_port

__all__ = ["SparkCluster", "spark_home", "start_spark_cluster"]

log = logging.getLogger("cdcflow.testing")

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_READY_TIMEOUT = 120.0


def spark_home() -> Path:
    """The pyspark distribution's directory (its ``jars/`` hold Spark's classes)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _java() -> str:
    java = java_executable()
    if not java or not os.access(java, os.X_OK):
        raise NotAvailableError("Spark needs Java 17 or newer: install a JRE (Debian: openjdk-17-jre-headless)")
    return java


def _scala_version(home: Path) -> str:
    """``2.13`` from ``jars/scala-library-2.13.x.jar``: the worker's executor launcher asks for it."""
    for jar in glob.glob(str(home / "jars" / "scala-library-*.jar")):
        version = Path(jar).name.removeprefix("scala-library-").removesuffix(".jar")
        return ".".join(version.split(".")[:2])
    raise NotAvailableError(f"{home}/jars holds no scala-library jar: is pyspark installed completely?")


class SparkCluster:
    """One master and one worker JVM; :meth:`stop` ends both (and the executors)."""

    def __init__(self, work_dir: Path, *, cores: int = 2, memory: str = "1g", daemon_heap: str = "256m") -> None:
        self.work_dir = work_dir
        self.cores = cores
        self.memory = memory
        self.host = "127.0.0.1"
        self.port = free_port()
        self.ui_port = free_port()
        self._daemon_heap = daemon_heap
        self._procs: list[subprocess.Popen[bytes]] = []
        home = spark_home()
        self._classpath = f"{home / 'conf'}:{home / 'jars'}/*"
        self._env = dict(
            os.environ,
            SPARK_HOME=str(home),
            SPARK_SCALA_VERSION=_scala_version(home),
            SPARK_LOCAL_IP=self.host,
            PYSPARK_PYTHON=sys.executable,
        )

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``: the value of ``server.spark.master``."""
        return f"spark://{self.host}:{self.port}"

    @property
    def backend(self) -> str:
        return "local"

    def master_command(self) -> list[str]:
        return [
            _java(),
            f"-Xmx{self._daemon_heap}",
            "-Dspark.master.rest.enabled=false",
            "-cp",
            self._classpath,
            _MASTER_CLASS,
            "--host", self.host, "--port", str(self.port), "--webui-port", str(self.ui_port),
        ]  # fmt: skip

    def worker_command(self) -> list[str]:
        return [
            _java(),
            f"-Xmx{self._daemon_heap}",
            "-cp",
            self._classpath,
            _WORKER_CLASS,
            "--host", self.host, "--webui-port", "0",
            "--cores", str(self.cores), "--memory", self.memory,
            "--work-dir", str(self.work_dir / "work"),
            self.master_url,
        ]  # fmt: skip

    def driver_conf(self) -> dict[str, str]:
        """Spark properties for a driver on this machine: the cluster's cores, executors within the
        worker's memory, the driver reachable on loopback."""
        return {
            "spark.cores.max": str(self.cores),
            "spark.executor.memory": "512m",
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
        }

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        with (self.work_dir / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=self._env, cwd=self.work_dir, start_new_session=True
            )
        self._procs.append(proc)
        return proc

    def status(self) -> dict[str, Any]:
        """The master's status page as JSON (``aliveworkers``, ``workers``, ``activeapps``...)."""
        with urllib.request.urlopen(f"http://{self.host}:{self.ui_port}/json", timeout=5) as resp:
            status: dict[str, Any] = json.loads(resp.read())
            return status

    def start(self) -> None:
        """Start the master, then the worker; return once the worker is registered and alive."""
        (self.work_dir / "work").mkdir(parents=True, exist_ok=True)
        self._spawn("master", self.master_command())
        self._spawn("worker", self.worker_command())
        deadline = time.monotonic() + _READY_TIMEOUT
        while True:
            with contextlib.suppress(OSError, ValueError):
                if self.status().get("aliveworkers", 0) >= 1:
                    log.info(
                        "spark cluster: %s with one worker (%d cores, %s)", self.master_url, self.cores, self.memory
                    )
                    return
            for proc, name in zip(self._procs, ("master", "worker"), strict=False):
                if proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(
                        f"the Spark {name} exited with {proc.returncode}: see {self.work_dir}/{name}.log"
                    )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"no Spark worker alive after {_READY_TIMEOUT:.0f}s: see {self.work_dir}/*.log")
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM each JVM's process group (the worker's executors with it), SIGKILL after 20 s."""
        for proc in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._procs.clear()


@contextlib.contextmanager
def start_spark_cluster(
    *, cores: int = 2, memory: str = "1g", work_dir: Path | None = None, backend: str | None = None
) -> Iterator[SparkCluster]:
    """A master and a worker for the duration of the block (always local JVMs: see the module docs)."""
    choose_backend("spark cluster", backend if backend == "local" else None, container_possible=False)
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdcflow-spark-")))
        cluster = SparkCluster(work_dir, cores=cores, memory=memory)
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
