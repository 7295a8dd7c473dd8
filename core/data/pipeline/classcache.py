"""A class-data-sharing archive for the capture's Spark JVM (``server.spark.class-cache``).

A local-mode Spark JVM loads and verifies tens of thousands of classes before its
session is up, and more for its first jobs: on two cores that is most of the
session's start (about 7 s) and a share of the first job's. The JVM can map those
classes from an archive instead (JDK's application class-data sharing, "AppCDS";
Spark 4 runs on JDK 17 and later, which write such an archive at exit,
``-XX:ArchiveClassesAtExit``). Measured on two cores: the session up in about 4.5 s
instead of 7.5 s, its Python workers warmed in 3.5 s instead of 5 s.

An archive fits one JVM, one set of JVM options and one class path. Its life:

1. A start that finds no archive for its :func:`cache_key` has its JVM write one
   at exit, to a file of its own (``<key>.<token>.part``). Once the session is up,
   :meth:`ClassCache.started` writes beside it what the JVM ran with (its Java
   home, options, class path and process id, read from the JVM).
2. A later start finds the part, once the JVM that wrote it has ended, and checks
   it: ``java -Xshare:on -XX:+VerifySharedSpaces -version`` with the same Java,
   options and class path. An exit cut short leaves a file that crashes a JVM
   which maps it; the check runs in a JVM of its own, and only a whole archive is
   renamed to ``<key>.jsa`` (anything else is deleted).
3. Every start of that key then maps ``<key>.jsa`` (``-XX:SharedArchiveFile``).

A JVM that cannot use an archive (its class path changed since, say) starts
without it, as before, and says nothing: the JVM's ``cds`` log is off. The
archives are about 160 MB each; the :data:`KEEP_ARCHIVES` most recently used are
kept. Only local masters use the cache, and only when
``spark.driver.extraJavaOptions`` does not already set class sharing itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KEEP_ARCHIVES", "ClassCache", "cache_key", "default_cache_dir", "java_executable"]

log = logging.getLogger(__name__)

#: Archives kept in the cache directory (the most recently used; each about 160 MB).
KEEP_ARCHIVES = 4
#: Seconds the check of a new archive may take.
CHECK_TIMEOUT = 60.0
#: The JVM's class-sharing log is off: a JVM that cannot use an archive starts without
#: it silently, and writing one does not list the classes it skips.
QUIET = "-Xlog:cds*=off"
#: JVM options that already decide class sharing: the cache leaves such a JVM alone.
_SHARING_OPTIONS = ("-Xshare", "-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit", "-XX:+AutoCreateSharedArchive")
#: Environment variables the launcher builds the JVM's class path from.
_CLASS_PATH_ENV = ("SPARK_HOME", "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/cdcflow/spark-classes``, else ``~/.cache/cdcflow/spark-classes``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cdcflow" / "spark-classes"


def java_executable() -> str | None:
    """The java Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH
    (its real path; None when there is none)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def _spark_home() -> Path:
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home)
    import pyspark

    return Path(pyspark.__file__).parent


def _stat_line(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path.name} -"
    return f"{path.name} {st.st_size} {st.st_mtime_ns}"


def cache_key(java_options: Sequence[str], conf: Mapping[str, str]) -> str | None:
    """What an archive is good for, hashed: the java binary, Spark's jars, the launcher's
    class-path settings and the JVM options other than system properties. None when no
    java is found (Spark does not start either)."""
    java = java_executable()
    if java is None:
        return None
    home = _spark_home()
    jars = sorted((home / "jars").glob("*.jar"))
    parts = [
        "java " + _stat_line(Path(java)) + " " + java,
        "home " + str(home.resolve()),
        *(_stat_line(jar) for jar in jars),
        *(f"env {name}={os.environ.get(name, '')}" for name in _CLASS_PATH_ENV),
        "class-path " + conf.get("spark.driver.extraClassPath", ""),
        *("option " + option for option in java_options if not option.startswith("-D")),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


@dataclass
class ClassCache:
    """The archive of one :func:`cache_key` in ``directory`` (see the module docs)."""

    directory: Path
    key: str
    #: The part this start's JVM writes at exit (None: it maps the archive, or neither).
    writing: Path | None = None

    @classmethod
    def for_jvm(cls, directory: Path, java_options: Sequence[str], conf: Mapping[str, str]) -> ClassCache | None:
        """The cache for a JVM started with ``java_options`` and ``conf``, or None when
        those options set class sharing already or no java is found."""
        if any(option.startswith(_SHARING_OPTIONS) for option in java_options):
            return None
        key = cache_key(java_options, conf)
        return None if key is None else cls(directory, key)

    @property
    def archive(self) -> Path:
        return self.directory / f"{self.key}.jsa"

    def options(self) -> list[str]:
        """The JVM options of this start: map the archive (a whole part left by an earlier
        JVM is checked and adopted first), else write one at exit. Never raises: a cache
        that cannot be used gives no options."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            pending = False if self.archive.exists() else self._adopt_parts()
            if self.archive.exists():
                with contextlib.suppress(OSError):
                    os.utime(self.archive)  # its last use, for pruning
                return [f"-XX:SharedArchiveFile={self.archive}", QUIET]
            if pending:
                return []  # a JVM alive now writes one at its exit
            self.writing = self.directory / f"{self.key}.{secrets.token_hex(4)}.part"
            return [f"-XX:ArchiveClassesAtExit={self.writing}", QUIET]
        except OSError as exc:
            log.warning("Spark's class cache in %s is not used (%s)", self.directory, exc)
            self.writing = None
            return []

    def started(self, session: Any) -> None:
        """Once the session is up: record what the JVM writing :attr:`writing` runs with,
        from the JVM itself, for the check of the part at a later start."""
        if self.writing is None:
            return
        try:
            jvm = session._jvm
            runtime = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
            facts = {
                "java_home": str(jvm.java.lang.System.getProperty("java.home")),
                "class_path": str(jvm.java.lang.System.getProperty("java.class.path")),
                "options": [str(option) for option in runtime.getInputArguments()],
                "pid": int(runtime.getPid()),
            }
            _write_json(self._facts(self.writing), facts)
        except Exception as exc:  # noqa: BLE001 - without its facts the part is deleted later, nothing worse
            log.debug("Spark's class cache: the JVM's facts were not recorded (%s)", exc)

    # -- parts ---------------------------------------------------------------------

    @staticmethod
    def _facts(part: Path) -> Path:
        return part.with_name(part.name + ".json")

    def _adopt_parts(self) -> bool:
        """Check the parts of JVMs that have ended; the first whole one becomes the archive,
        the others (and facts with no part, from a JVM that ended without writing) go.
        Returns whether a JVM still running will write a part of this key at its exit."""
        pending = False
        parts = set(self.directory.glob(f"{self.key}.*.part"))
        for facts_file in self.directory.glob(f"{self.key}.*.part.json"):
            part = facts_file.with_name(facts_file.name.removesuffix(".json"))
            if _writer_alive(_read_json(facts_file)):
                pending = True
                parts.discard(part)  # still being written
            elif part not in parts:
                facts_file.unlink(missing_ok=True)
        for part in sorted(parts):
            facts = _read_json(self._facts(part))
            if not self.archive.exists() and facts is not None and _whole(part, facts):
                try:
                    os.replace(part, self.archive)
                except FileNotFoundError:
                    continue  # another capture starting now adopted it first
                log.info("Spark's class cache: %s written; the JVM maps its classes from it", self.archive)
                self._prune()
            part.unlink(missing_ok=True)
            self._facts(part).unlink(missing_ok=True)
        return pending

    def _prune(self) -> None:
        archives = sorted(self.directory.glob("*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in archives[KEEP_ARCHIVES:]:
            old.unlink(missing_ok=True)


def _whole(part: Path, facts: Mapping[str, Any]) -> bool:
    """Whether ``part`` maps and verifies in a JVM run as the one that wrote it (its own
    process: a cut archive crashes the JVM that maps it)."""
    java = Path(str(facts.get("java_home", ""))) / "bin" / "java"
    if not java.exists():
        return False
    options = [
        str(option)
        for option in facts.get("options", [])
        if not str(option).startswith(("-D", "-Xlog", *_SHARING_OPTIONS))
    ]
    with tempfile.TemporaryDirectory(prefix="cdcflow-cds-") as tmp:
        command = [
            str(java),
            *options,
            "-cp",
            str(facts.get("class_path", "")),
            "-Xshare:on",
            "-XX:+VerifySharedSpaces",
            f"-XX:SharedArchiveFile={part}",
            QUIET,
            "-XX:-CreateCoredumpOnCrash",
            f"-XX:ErrorFile={tmp}/hs_err.log",
            "-version",
        ]
        try:
            done = subprocess.run(command, cwd=tmp, capture_output=True, timeout=CHECK_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("Spark's class cache: %s not checked (%s)", part, exc)
            return False
    if done.returncode != 0:
        log.info("Spark's class cache: %s is not a whole archive (its JVM's exit was cut short); deleted", part)
    return done.returncode == 0


def _writer_alive(facts: Mapping[str, Any] | None) -> bool:
    """Whether the JVM these facts are of still runs (and will write its part at exit)."""
    return facts is not None and _alive(int(facts.get("pid", 0)))


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an exited one that no parent reaped yet does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: it answered the signal
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: Path, value: Mapping[str, Any]) -> None:
    hidden = path.with_name(f".{path.name}.{os.getpid()}")
    hidden.write_text(json.dumps(value))
    os.replace(hidden, path)
