"""A user's connectors.yaml, run by ``cdcflow run`` against the test's servers.

:class:`Deployment` reads the file (validated as ``cdcflow validate`` would: a bad
file fails with the file, line and field), replaces its addresses with those of the
servers a test started, applies the test's ``overrides``, writes the result next to
the test's temporary files and runs ``cdcflow run`` on it as a separate process
(a process group of its own, so that :meth:`Deployment.kill_capture` takes the
Spark JVM and the Python workers with it).

What is replaced:

* ``server``: the metastore (SQLite under the test's directory), ``api-addr``
  (a free loopback port), ``data-dir`` and ``spark.warehouse-dir`` (under the test's
  directory), and ``spark.master`` when a Spark cluster is given (with the driver
  properties the cluster needs);
* every connector's ``tikv`` source: ``pd`` / ``tidb-status`` are the playground's
  (``playground: false``), and ``start-ts`` is the playground's clock when the
  deployment starts, unless the file or the overrides set one;
* every sink URI: ``mysql://`` gets the MySQL server's user, password, host and port;
  ``kafka://`` (``kafka://mock`` too: a mock cluster inside the ``cdcflow run`` process could
  not be read by the test) the Kafka cluster's bootstrap address; the path and the query
  (database, topic, options) stay the user's.

:meth:`Deployment.assert_replicated` compares what a sink holds with the
playground's snapshot: MySQL tables (typed, see :mod:`cdcflow.core.testing.compare`)
and Kafka topics in the Open Protocol (rebuilt by
:mod:`cdcflow.core.testing.open_protocol`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import yaml

from cdcflow.core.config.yamlsrc import load_located
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue
from cdcflow.core.secrets import mask_uri
from cdcflow.core.testing.compare import diff, typed_rows
from cdcflow.core.testing.servers.mariadb import free_port
from cdcflow.core.testing.waiting import WaitTimeout, until_sync

if TYPE_CHECKING:
    from cdcflow.core.testing.servers import KafkaServer, MariaDB, SparkCluster
    from cdcflow.plugins.sources.playground import Playground

__all__ = ["Deployment", "merge_overrides"]

log = logging.getLogger("cdcflow.testing")

CDCFLOW = str(Path(sys.executable).parent / "cdcflow")


def merge_overrides(doc: dict[str, Any], overrides: Mapping[str, Any], file: str) -> dict[str, Any]:
    """``doc`` with ``overrides`` merged in: mappings merge key by key, other values replace.

    Under ``connectors`` the overrides are a mapping from connector name to the
    connector's overrides (``{"connectors": {"shop": {"filter": {"rules": ["shop.*"]}}}}``).
    """
    merged = copy.deepcopy(doc)
    for key, value in overrides.items():
        if key == "connectors":
            if not isinstance(value, Mapping):
                raise _invalid(file, "overrides.connectors", "must map connector names to their overrides")
            by_name = {c.get("name"): c for c in merged.get("connectors") or [] if isinstance(c, dict)}
            for name, connector_overrides in value.items():
                if name not in by_name:
                    known = ", ".join(sorted(str(n) for n in by_name)) or "none"
                    raise _invalid(
                        file, f"overrides.connectors.{name}", f"no connector named {name!r} (known: {known})"
                    )
                by_name[name].update(_merge(by_name[name], connector_overrides))
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


def _merge(base: Any, value: Any) -> Any:
    if isinstance(base, dict) and isinstance(value, Mapping):
        out = dict(base)
        for k, v in value.items():
            out[k] = _merge(base.get(k), v)
        return out
    return copy.deepcopy(value)


def _invalid(file: str, path: str, message: str) -> ConfigInvalidError:
    return ConfigInvalidError(f"{file}: {path}: {message}", [ConfigIssue(message, file=file, path=path)])


def _with_netloc(uri: str, netloc: str) -> str:
    parts = urlsplit(uri)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class Deployment:
    """``cdcflow run`` on a user's connectors file, addresses replaced by the test's servers."""

    def __init__(
        self,
        path: str | Path,
        tmp_dir: Path,
        *,
        playground: Playground | None = None,
        mysql: MariaDB | None = None,
        kafka: KafkaServer | None = None,
        spark_cluster: SparkCluster | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.source_file = str(path)
        self.tmp_dir = tmp_dir
        self.playground = playground
        self.mysql = mysql
        self.kafka = kafka
        self.spark_cluster = spark_cluster
        self.overrides = dict(overrides or {})
        self.file = tmp_dir / "connectors.yaml"
        self.log_path = tmp_dir / "cdcflow-run.log"
        self.api = ""
        self.document: dict[str, Any] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._user_doc = self._read_user_file()

    # -- the file ----------------------------------------------------------------------------

    def _read_user_file(self) -> dict[str, Any]:
        from cdcflow.core.config import load_deployment

        load_deployment(self.source_file)  # the user's file as written must be valid
        text = Path(self.source_file).read_text(encoding="utf-8")
        located = load_located(text, self.source_file)  # ${VAR}s expanded as `cdcflow run` does
        data: dict[str, Any] = located.data
        return data

    def needs(self) -> set[str]:
        """The servers the user's file reaches: ``playground``, ``mysql``, ``kafka``, ``spark-cluster``."""
        needed = set()
        for connector in self._user_doc.get("connectors") or []:
            if (connector.get("source") or {}).get("type") == "tikv":
                needed.add("playground")
            for sink in connector.get("sinks") or []:
                scheme = urlsplit(str(sink.get("uri", ""))).scheme
                if scheme == "mysql":
                    needed.add("mysql")
                elif scheme == "kafka":
                    needed.add("kafka")
        master = str(((self._user_doc.get("server") or {}).get("spark") or {}).get("master", ""))
        if master.startswith("spark://"):
            needed.add("spark-cluster")
        return needed

    def render(self) -> dict[str, Any]:
        """The document ``cdcflow run`` gets: the user's, with the servers' addresses and the overrides."""
        doc = copy.deepcopy(self._user_doc)
        server = doc.setdefault("server", {}) or {}
        doc["server"] = server
        port = free_port()
        self.api = f"http://127.0.0.1:{port}"
        server.update({"metastore": f"sqlite:///{self.tmp_dir / 'meta.db'}", "api-addr": f"127.0.0.1:{port}"})
        server["data-dir"] = str(self.tmp_dir / "data")
        spark = server.setdefault("spark", {}) or {}
        server["spark"] = spark
        spark["warehouse-dir"] = str(self.tmp_dir / "lake")
        if self.spark_cluster is not None:
            spark["master"] = self.spark_cluster.master_url
            spark["conf"] = {**(spark.get("conf") or {}), **self.spark_cluster.driver_conf()}
        for connector in doc.get("connectors") or []:
            source = connector.get("source") or {}
            if source.get("type") == "tikv" and self.playground is not None:
                source.update(
                    {
                        "playground": False,
                        "pd": [self.playground.pd_address],
                        "tidb-status": self.playground.status_address,
                    }
                )
                connector.setdefault("start-ts", self.playground.now())
            connector["sinks"] = [self._sink(dict(sink)) for sink in connector.get("sinks") or []]
        return merge_overrides(doc, self.overrides, self.source_file)

    def _sink(self, sink: dict[str, Any]) -> dict[str, Any]:
        uri = str(sink.get("uri", ""))
        scheme = urlsplit(uri).scheme
        if scheme == "mysql" and self.mysql is not None:
            m = self.mysql
            sink["uri"] = _with_netloc(uri, f"{m.user}:{m.password}@{m.host}:{m.port}")
        elif scheme == "kafka" and self.kafka is not None:
            sink["uri"] = _with_netloc(uri, self.kafka.bootstrap_servers)
        return sink

    # -- the process -------------------------------------------------------------------------

    def start(self) -> Deployment:
        """Write the rendered file (validated) and start ``cdcflow run`` on it."""
        from cdcflow.core.config import load_deployment

        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.document = self.render()
        self.file.write_text(yaml.safe_dump(self.document, sort_keys=False))
        load_deployment(self.file)
        self._create_topics()
        if self.playground is not None:
            # After the start ts: the CREATE TABLEs are replicated as well.
            self.playground.workload.create_tables()
        self._spawn()
        return self

    def _create_topics(self) -> None:
        """Create the Kafka sinks' topics (librdkafka's mock cluster takes topics only from its own process)."""
        if self.kafka is None:
            return
        for connector in self.document.get("connectors") or []:
            for sink in connector.get("sinks") or []:
                parts = urlsplit(str(sink.get("uri", "")))
                if parts.scheme == "kafka" and parts.path.strip("/"):
                    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                    self.kafka.create_topic(parts.path.strip("/"), int(query.get("partition-num", 3)))

    def _spawn(self) -> None:
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [CDCFLOW, "--log-level", "info", "run", str(self.file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.tmp_dir,
                start_new_session=True,
            )
        log.info("cdcflow run %s (from %s), log %s", self.file, self.source_file, self.log_path)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill_capture(self) -> None:
        """SIGKILL the capture's whole process group: no drain, no last checkpoint write."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(60)
        self._proc = None

    def stop(self) -> None:
        """SIGTERM: drain and exit (SIGKILL after 90 s)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(90)
        self.kill_capture()

    def restart(self) -> None:
        """Stop the capture if it runs (SIGTERM), then start it again on the same file and metastore."""
        self.stop()
        self._spawn()

    # -- progress ----------------------------------------------------------------------------

    def changefeed_ids(self) -> list[str]:
        return [str(c["name"]) for c in self.document.get("connectors") or []]

    def changefeed(self, changefeed: str | None = None) -> dict[str, Any] | None:
        """The REST API's view of a changefeed (the first connector's by default); None while unreachable."""
        name = changefeed or self.changefeed_ids()[0]
        try:
            with urllib.request.urlopen(f"{self.api}/api/v2/changefeeds/{name}", timeout=5) as resp:
                result: dict[str, Any] = json.loads(resp.read())
                return result
        except OSError:
            return None

    def checkpoint(self, changefeed: str | None = None) -> int:
        """The changefeed's checkpoint ts (0 while the capture is unreachable)."""
        cf = self.changefeed(changefeed)
        return int(cf["checkpoint_tso"]) if cf else 0

    def wait_checkpoint(self, ts: int, timeout: float = 300.0, changefeed: str | None = None) -> int:
        """Block until the changefeed's checkpoint reaches ``ts``; fail with the capture's log otherwise."""

        def reached() -> int:
            if self._proc is None or self._proc.poll() is not None:
                raise AssertionError(f"cdcflow run is not running; its log:\n{self.log_tail()}")
            cf = self.changefeed(changefeed)
            if cf is not None and cf.get("state") == "failed":
                raise AssertionError(f"the changefeed failed: {cf.get('error')}; log:\n{self.log_tail()}")
            checkpoint = int(cf["checkpoint_tso"]) if cf else 0
            return checkpoint if checkpoint >= ts else 0

        try:
            return until_sync(
                reached,
                timeout=timeout,
                interval=0.5,
                message=f"the checkpoint to reach {ts}",
                observe=lambda: self.changefeed(changefeed),
            )
        except WaitTimeout as timed_out:
            raise AssertionError(f"{timed_out}; log:\n{self.log_tail()}") from None

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    # -- comparison --------------------------------------------------------------------------

    def assert_replicated(
        self, table: str, *, db: str = "shop", ts: int | None = None, key: tuple[str, ...] = ("id",)
    ) -> dict[str, int]:
        """Assert that every readable sink holds ``db.table`` as the playground had it; return the
        rows compared per sink (URIs with passwords masked).

        MySQL sinks are compared with the snapshot at ``ts`` (default: the checkpoint), Kafka
        sinks in the Open Protocol at the topic's resolved ts (at least ``ts``): call it once the
        workload has stopped and :meth:`wait_checkpoint` passed its last commit. A sink of any
        other kind is not compared; no readable sink at all is an error.
        """
        if self.playground is None:
            raise AssertionError("assert_replicated compares with the playground: this deployment has none")
        pg = self.playground
        ts = ts if ts is not None else self.checkpoint()
        compared: dict[str, int] = {}
        for connector in self.document.get("connectors") or []:
            for sink in connector.get("sinks") or []:
                uri = str(sink.get("uri", ""))
                parts = urlsplit(uri)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                if parts.scheme == "mysql":
                    at, got = ts, self._mysql_rows(uri, db, table)
                elif parts.scheme == "kafka" and query.get("protocol", "open-protocol") == "open-protocol":
                    at, got = self._kafka_rows(parts.netloc, parts.path.strip("/"), db, table, ts)
                else:
                    continue
                types = {c.name: c.ft for c in pg.catalog.find(db, table, at).columns}
                want = typed_rows(pg.snapshot(table, at, db=db), types, key)
                problems = diff(want, typed_rows(got, types, key))
                assert not problems, f"{db}.{table} in {mask_uri(uri)} at {at}: {problems}"
                compared[mask_uri(uri)] = len(want)
        if not compared:
            raise AssertionError(f"no sink of {self.source_file} can be read back (MySQL, Kafka Open Protocol)")
        return compared

    def _mysql_rows(self, uri: str, db: str, table: str) -> list[dict[str, Any]]:
        import pymysql

        parts = urlsplit(uri)
        conn = pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            database=db,
            cursorclass=pymysql.cursors.DictCursor,
        )
        try:
            with conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
                cur.execute(f"SELECT * FROM `{table}`")
                return list(cur.fetchall())
        finally:
            conn.close()

    def _kafka_rows(self, bootstrap: str, topic: str, db: str, table: str, ts: int) -> tuple[int, list[dict[str, Any]]]:
        from cdcflow.core.testing.open_protocol import read_topic, rebuild

        replica = rebuild(read_topic(bootstrap, topic))
        assert replica.resolved_ts >= ts, f"topic {topic} resolved only to {replica.resolved_ts}, below {ts}"
        return replica.resolved_ts, list(replica.tables.get((db, table), {}).values())
