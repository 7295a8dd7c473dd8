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
playground's snapshot (typed, see :mod:`cdcflow.core.testing.compare`): MySQL tables,
Spark table sinks (read back by :mod:`cdcflow.core.testing.spark_tables`), and Kafka
topics in the Open Protocol or canal-json (rebuilt by the independent consumers
:mod:`cdcflow.core.testing.open_protocol` and :mod:`cdcflow.core.testing.canal_json`).
A sink of another kind fails the comparison unless the test skips it.
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import yaml

from cdcflow.core.config.yamlsrc import load_located
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue
from cdcflow.core.secrets import mask_uri
from cdcflow.core.testing.compare import diff, typed_rows
from cdcflow.core.testing.servers.mariadb import free_port
from cdcflow.core.testing.waiting import WaitTimeout, until_resolved, until_sync

if TYPE_CHECKING:
    from cdcflow.core.testing.servers import KafkaServer, MariaDB, SparkCluster
    from cdcflow.plugins.sources.cockroach_playground import CockroachPlayground
    from cdcflow.plugins.sources.playground import Playground

__all__ = ["Deployment", "SinkReader", "merge_overrides"]

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
        cockroach: CockroachPlayground | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.source_file = str(path)
        self.tmp_dir = tmp_dir
        self.playground = playground
        self.mysql = mysql
        self.kafka = kafka
        self.spark_cluster = spark_cluster
        self.cockroach = cockroach
        self.overrides = dict(overrides or {})
        self.file = tmp_dir / "connectors.yaml"
        self.log_path = tmp_dir / "cdcflow-run.log"
        self.api = ""
        self.document: dict[str, Any] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._spark: Any = None
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
        """The servers the user's file reaches: ``playground``, ``cockroach-playground``, ``mysql``, ``kafka``,
        ``spark-cluster``."""
        needed = set()
        for connector in self._user_doc.get("connectors") or []:
            source_type = (connector.get("source") or {}).get("type")
            if source_type == "tikv":
                needed.add("playground")
            elif source_type == "cockroachdb":
                needed.add("cockroach-playground")
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
            elif source.get("type") == "cockroachdb" and self.cockroach is not None:
                source.update({"playground": False, "dsn": self.cockroach.dsn})
                connector.setdefault("start-ts", self.cockroach.now().commit_ts)
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
        self._clear_mysql()
        self._create_mysql_tables()
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

    def _clear_mysql(self) -> None:
        """Drop what an earlier deployment on the same MySQL server left: the upstream's
        database and each MySQL sink's checkpoint database. Tables left from another
        upstream (say, the other playground's ``shop``) would keep their old columns
        (CREATE TABLE IF NOT EXISTS), and a checkpoint row of the same changefeed id would
        make the sink skip batches it has never written."""
        if self.mysql is None:
            return
        from cdcflow.plugins.sources.playground.shop import SHOP_DB

        databases = {self.cockroach.store.database if self.cockroach is not None else SHOP_DB}
        for connector in self.document.get("connectors") or []:
            for sink in connector.get("sinks") or []:
                parts = urlsplit(str(sink.get("uri", "")))
                if parts.scheme == "mysql" or sink.get("type") == "mysql":
                    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                    databases.add(str(sink.get("checkpoint-schema") or query.get("checkpoint-schema") or "cdcflow"))
        conn = self.mysql.connect()
        try:
            with conn.cursor() as cur:
                for database in sorted(databases):
                    cur.execute(f"DROP DATABASE IF EXISTS `{database.replace('`', '``')}`")
            conn.commit()
        finally:
            conn.close()

    def _create_mysql_tables(self) -> None:
        """With the CockroachDB playground, create its tables in the MySQL sinks' server (its source
        replicates no CREATE TABLE), typed by the source's own type mapping."""
        if self.cockroach is None or self.mysql is None:
            return
        if not any(urlsplit(str(s.get("uri", ""))).scheme == "mysql" for c in self.document.get("connectors") or []
                   for s in c.get("sinks") or []):  # fmt: skip
            return
        from cdcflow.plugins.sources.cockroachdb.types import map_type

        store = self.cockroach.store
        conn = self.mysql.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{store.database}`")
                for name in sorted(store.tables):
                    definition = store.tables[name].descriptor()
                    if definition is None:
                        continue
                    columns = [
                        f"`{c.name}` {map_type(c.type).sql_type}"
                        + ("" if c.nullable and c.name not in definition.pk else " NOT NULL")
                        for c in definition.columns
                    ]
                    pk = ", ".join(f"`{k}`" for k in definition.pk)
                    cur.execute(
                        f"CREATE TABLE IF NOT EXISTS `{store.database}`.`{name}` "
                        f"({', '.join(columns)}, PRIMARY KEY ({pk}))"
                    )
            conn.commit()
        finally:
            conn.close()

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

    def readers(self, skip: Iterable[str] = ()) -> list[SinkReader]:
        """How :meth:`assert_replicated` reads each sink back (sinks whose kind is in ``skip`` left out).

        A sink it cannot read fails here, naming it: pass its kind (``file``, ``kafka:avro``...) in
        ``skip`` and read it in the test yourself.
        """
        from cdcflow.core.config import load_deployment

        skipped = set(skip)
        readers: list[SinkReader] = []
        unreadable: list[str] = []
        for connector in load_deployment(self.file).connectors:
            for choice in connector.sinks:
                reader = SinkReader.of(choice.type_name, choice.config, self)
                if reader.kind in skipped or choice.type_name in skipped:
                    continue
                if reader.unreadable:
                    unreadable.append(f"{mask_uri(reader.uri) or choice.type_name} ({reader.unreadable})")
                else:
                    readers.append(reader)
        if unreadable:
            raise AssertionError(
                f"assert_replicated cannot compare these sinks of {self.source_file}: {'; '.join(unreadable)}. "
                "It reads MySQL, Spark tables (versioned snapshot or change log) and Kafka in the Open Protocol "
                "or canal-json; leave the others out with skip=(kind, ...) and read them in the test yourself"
            )
        return readers

    def assert_replicated(
        self,
        table: str,
        *,
        db: str = "shop",
        ts: int | None = None,
        key: tuple[str, ...] = ("id",),
        skip: Iterable[str] = (),
    ) -> dict[str, int]:
        """Assert that every sink holds ``db.table`` as the playground had it; return the rows
        compared per sink (URIs with passwords masked).

        MySQL sinks and Spark table sinks (the newest committed snapshot version, or the change log
        replayed up to ``ts`` when the sink writes only the change log) are compared with the
        snapshot at ``ts`` (default: the checkpoint). Kafka sinks are rebuilt by an independent
        consumer: in the Open Protocol, and in canal-json with ``enable-tidb-extension``, at the
        topic's resolved ts (at least ``ts``: the topic is read again for up to a minute until it
        is, since resolved events follow the persisted checkpoint); in canal-json without it, in
        offset order, at ``ts``.
        Call it once the workload has stopped and :meth:`wait_checkpoint` passed its last commit.
        A sink it cannot read (a file sink, Kafka in Avro or json, a Spark sink writing catalog
        tables by MERGE) fails the call unless its kind is in ``skip``; so does a deployment
        without any sink left to compare.
        """
        readers = self.readers(skip)
        if self.playground is None and self.cockroach is None:
            raise AssertionError("assert_replicated compares with a playground: this deployment has none")
        ts = ts if ts is not None else self.checkpoint()
        compared: dict[str, int] = {}
        for reader in readers:
            at, got = reader.rows(db, table, ts, key)
            types, upstream = self.upstream(db, table, at)
            want = typed_rows(upstream, types, key)
            problems = diff(want, typed_rows(got, types, key))
            assert not problems, f"{db}.{table} in {reader.label} at {at}: {problems}"
            compared[reader.label] = len(want)
        if not compared:
            raise AssertionError(f"no sink of {self.source_file} is left to compare (skip={sorted(set(skip))})")
        return compared

    def upstream(self, db: str, table: str, ts: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The column types (for :func:`~cdcflow.core.testing.compare.typed_rows`) and the rows of
        ``db.table`` in the playground at ``ts`` (the TiKV playground's TiDB field types, or the
        CockroachDB playground's type names, read at the cursor of ``ts``)."""
        if self.playground is not None:
            pg = self.playground
            return {c.name: c.ft for c in pg.catalog.find(db, table, ts).columns}, pg.snapshot(table, ts, db=db)
        assert self.cockroach is not None
        from cdcflow.plugins.sources.cockroachdb.hlc import cursor_for

        at = cursor_for(ts)
        definition = self.cockroach.store.table(table, at).descriptor(at)
        assert definition is not None, f"{table} does not exist in the CockroachDB playground at {ts}"
        return {c.name: c.type for c in definition.columns}, self.cockroach.snapshot(table, at)

    def spark_reader(self) -> Any:
        """The Spark session this process reads Spark table sinks with (started on first use)."""
        from cdcflow.core.testing.spark_tables import reader_session

        if self._spark is None:
            self._spark = reader_session(self.tmp_dir / "reader")
        return self._spark

    def resolve_path(self, path: str) -> str:
        """A sink directory as ``cdcflow run`` resolves it (relative to its working directory)."""
        if "://" in path or Path(path).is_absolute():
            return path
        return str((self.tmp_dir / path).resolve())


@dataclass
class SinkReader:
    """How one sink of a deployment is read back (``unreadable``: why it cannot be)."""

    kind: str
    uri: str
    deployment: Deployment
    options: dict[str, Any] = field(default_factory=dict)
    unreadable: str = ""

    @property
    def label(self) -> str:
        return mask_uri(self.uri) if self.uri else f"{self.kind} {self.options.get('root', '')}".strip()

    @classmethod
    def of(cls, type_name: str, config: Any, deployment: Deployment) -> SinkReader:
        uri = str(getattr(config, "uri", "") or "")
        if type_name in ("mysql", "kafka") and not uri:
            return cls(type_name, uri, deployment, unreadable=f"a {type_name} sink given without a uri")
        if type_name == "mysql":
            return cls("mysql", uri, deployment)
        if type_name == "kafka":
            protocol = str(config.protocol)
            kind = f"kafka:{protocol}"
            if protocol not in ("open-protocol", "canal-json"):
                return cls(kind, uri, deployment, unreadable=f"Kafka in {protocol}")
            parts = urlsplit(uri)
            options = {"bootstrap": parts.netloc, "topic": config.topic or parts.path.strip("/")}
            return cls(kind, uri, deployment, options)
        if type_name == "spark":
            from cdcflow.plugins.sinks.spark.config import path_of

            root = path_of(config) or str(deployment.document["server"]["spark"]["warehouse-dir"])
            options = {"root": deployment.resolve_path(root), "mode": config.mode}
            if config.table_format == "merge":
                return cls("spark", uri, deployment, options, unreadable="snapshot tables written by MERGE INTO")
            return cls("spark", uri, deployment, options)
        return cls(type_name, uri, deployment, unreadable=f"a {type_name} sink")

    def rows(self, db: str, table: str, ts: int, key: tuple[str, ...]) -> tuple[int, list[dict[str, Any]]]:
        """(the ts the rows are at, the rows) of ``db.table``."""
        if self.kind == "mysql":
            return ts, self._mysql(db, table)
        if self.kind == "kafka:open-protocol":
            from cdcflow.core.testing import open_protocol

            bootstrap, topic = self.options["bootstrap"], self.options["topic"]
            replica = until_resolved(lambda: open_protocol.rebuild(open_protocol.read_topic(bootstrap, topic)), ts)
            return self._at_resolved(replica.resolved_ts, ts), list(replica.tables.get((db, table), {}).values())
        if self.kind == "kafka:canal-json":
            from cdcflow.core.testing import canal_json

            bootstrap, topic = self.options["bootstrap"], self.options["topic"]

            def read() -> canal_json.Replica:
                return canal_json.rebuild(canal_json.read_topic(bootstrap, topic))

            canal = read()
            if 0 < canal.resolved_ts < ts:  # watermarks (enable-tidb-extension), not yet at ts
                canal = until_resolved(read, ts)
            at = self._at_resolved(canal.resolved_ts, ts) if canal.resolved_ts else ts
            return at, list(canal.tables.get((db, table), {}).values())
        from cdcflow.core.testing.spark_tables import changelog_rows, snapshot_rows

        spark, root = self.deployment.spark_reader(), self.options["root"]
        if self.options["mode"] == "changelog":
            return ts, changelog_rows(spark, root, db, table, ts, key)
        rows = snapshot_rows(spark, root, db, table)
        assert rows is not None, f"{db}.{table} has no committed snapshot version under {root}"
        return ts, rows

    def _at_resolved(self, resolved: int, ts: int) -> int:
        assert resolved >= ts, (
            f"topic {self.options['topic']} resolved only to {resolved}, below {ts}, a minute after the checkpoint "
            f"passed it; the capture's log:\n{self.deployment.log_tail()}"
        )
        return resolved

    def _mysql(self, db: str, table: str) -> list[dict[str, Any]]:
        import pymysql

        parts = urlsplit(self.uri)
        conn = pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
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
