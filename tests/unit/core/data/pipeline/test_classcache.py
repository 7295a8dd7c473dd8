"""The class-data-sharing archive of the capture's Spark JVM, and the Python daemon's path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.classcache import QUIET, ClassCache, cache_key, java_executable
from cdcflow.core.data.pipeline.pydaemon import installed_pyspark_first
from cdcflow.core.data.pipeline.session import LOCAL_DEFAULTS, spark_conf

OPTIONS = ["-Dlog4j2.configurationFile=file:///x", "-XX:TieredStopAtLevel=1"]


def _java_home() -> Path:
    java = java_executable()
    assert java, "Spark needs java"
    return Path(java).parent.parent


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(done.stdout)


def test_the_key_follows_the_jvm_options_but_not_system_properties():
    key = cache_key(OPTIONS, {})
    assert key is not None
    assert cache_key([*OPTIONS, "-Dother=1"], {}) == key
    assert cache_key(["-Dlog4j2.configurationFile=file:///y", "-XX:TieredStopAtLevel=1"], {}) == key
    assert cache_key(["-Dlog4j2.configurationFile=file:///x"], {}) != key  # the full JIT
    assert cache_key(OPTIONS, {"spark.driver.extraClassPath": "/opt/extra.jar"}) != key


def test_no_java_no_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # no bin/java in it
    assert cache_key(OPTIONS, {}) is None
    assert ClassCache.for_jvm(tmp_path, OPTIONS, {}) is None


@pytest.mark.parametrize("option", ["-Xshare:off", "-XX:SharedArchiveFile=/a.jsa", "-XX:ArchiveClassesAtExit=/b.jsa"])
def test_a_jvm_that_sets_class_sharing_itself_is_left_alone(tmp_path, option):
    assert ClassCache.for_jvm(tmp_path, [*OPTIONS, option], {}) is None


def test_with_no_archive_the_jvm_writes_a_part_of_its_own_at_exit(tmp_path):
    cache = ClassCache.for_jvm(tmp_path / "cache", OPTIONS, {})
    assert cache is not None
    options = cache.options()
    assert cache.writing is not None and cache.writing.parent == tmp_path / "cache"
    assert cache.writing.name.startswith(cache.key) and cache.writing.name.endswith(".part")
    assert options == [f"-XX:ArchiveClassesAtExit={cache.writing}", QUIET]
    other = ClassCache.for_jvm(tmp_path / "cache", OPTIONS, {})
    assert other is not None
    other.options()
    assert other.writing != cache.writing


def test_an_archive_is_mapped_and_marked_used(tmp_path):
    cache = ClassCache.for_jvm(tmp_path, OPTIONS, {})
    assert cache is not None
    cache.archive.write_bytes(b"archive")
    os.utime(cache.archive, (1, 1))
    assert cache.options() == [f"-XX:SharedArchiveFile={cache.archive}", QUIET]
    assert cache.writing is None
    assert cache.archive.stat().st_mtime > 1


def test_a_part_a_running_jvm_will_write_is_waited_for(tmp_path):
    cache = ClassCache.for_jvm(tmp_path, OPTIONS, {})
    assert cache is not None
    facts = tmp_path / f"{cache.key}.0123abcd.part.json"
    facts.write_text(json.dumps({"pid": os.getpid()}))  # alive: its JVM has not exited yet
    assert cache.options() == []
    assert cache.writing is None and facts.exists()


def test_a_part_that_is_not_a_whole_archive_is_deleted_not_mapped(tmp_path):
    """The check runs a real JVM on the part, as the JVM that wrote it ran."""
    cache = ClassCache.for_jvm(tmp_path, OPTIONS, {})
    assert cache is not None
    part = tmp_path / f"{cache.key}.0123abcd.part"
    part.write_bytes(os.urandom(4096))
    facts = {"java_home": str(_java_home()), "class_path": str(tmp_path), "options": ["-Xmx64m"], "pid": _dead_pid()}
    (tmp_path / f"{part.name}.json").write_text(json.dumps(facts))
    options = cache.options()
    assert not part.exists() and not (tmp_path / f"{part.name}.json").exists()
    assert not cache.archive.exists()
    assert options == [f"-XX:ArchiveClassesAtExit={cache.writing}", QUIET]  # a new one is written


def test_facts_left_without_a_part_are_removed(tmp_path):
    cache = ClassCache.for_jvm(tmp_path, OPTIONS, {})
    assert cache is not None
    facts = tmp_path / f"{cache.key}.0123abcd.part.json"
    facts.write_text(json.dumps({"pid": _dead_pid()}))  # the JVM was killed before its exit
    cache.options()
    assert not facts.exists()


def test_the_daemon_is_cdcflows_for_local_masters_only():
    assert LOCAL_DEFAULTS["spark.python.daemon.module"] == "cdcflow.core.data.pipeline.pydaemon"
    assert "spark.python.daemon.module" not in spark_conf(SparkSettings(master="spark://spark-master:7077"))


def test_the_daemon_puts_the_zips_of_the_installed_pyspark_behind_it():
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    other = "/opt/spark/python/lib/pyspark.zip"
    path = [*zips, other, *sys.path]
    moved = installed_pyspark_first(path)
    assert moved[-2:] == zips
    assert moved[: len(path) - 2] == [other, *sys.path]


def test_a_pyspark_found_only_in_a_zip_is_left_first(tmp_path):
    path = [str(tmp_path / "pyspark.zip"), str(tmp_path)]
    assert installed_pyspark_first(path) == path
