"""A capture's Spark JVM writes its class archive at exit; the next start checks it and maps it.
Its Python workers import PySpark from the installed package (cdcflow's daemon)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from cdcflow.core.data.pipeline.classcache import _whole

pytestmark = pytest.mark.integration

# A capture's session: started, a job run in a Python worker, stopped. It prints the
# driver JVM's options and where its worker imported PySpark from.
SCRIPT = """
import json, sys
from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session

def where(batches):
    import pyarrow, pyspark
    for _ in batches:
        pass
    yield pyarrow.RecordBatch.from_pylist([{"f": pyspark.__file__}])

spark = spark_session(SparkSettings(master="local[1]", warehouse_dir=sys.argv[2], class_cache_dir=sys.argv[1]))
found = spark.range(1, numPartitions=1).mapInArrow(where, "f string").collect()[0].f
options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
stop_spark_session()
print(json.dumps({"pyspark": found, "options": options}))
"""


def start_and_stop(cache: Path, tmp_path: Path) -> dict[str, str]:
    """One session in a process of its own; returns once its JVM has exited (and written)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache), str(tmp_path / "lake")],
        capture_output=True,  # the JVM holds the pipes until it has exited
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_the_archive_is_written_at_exit_checked_and_then_mapped(tmp_path):
    cache = tmp_path / "classes"
    installed = str(Path(pyspark.__file__))

    first = start_and_stop(cache, tmp_path)
    assert first["pyspark"] == installed  # not Spark's zip
    assert "-XX:ArchiveClassesAtExit=" in first["options"]
    (part,) = cache.glob("*.part")
    facts = json.loads(part.with_name(part.name + ".json").read_text())
    assert {"java_home", "class_path", "options", "pid"} <= facts.keys()
    key = part.name.split(".")[0]

    # A part cut short (a JVM killed while writing) beside it, checked first: never mapped.
    cut = cache / f"{key}.00000000.part"
    cut.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    shutil.copy(part.with_name(part.name + ".json"), cut.with_name(cut.name + ".json"))

    second = start_and_stop(cache, tmp_path)
    archive = cache / f"{key}.jsa"
    assert f"-XX:SharedArchiveFile={archive}" in second["options"]
    assert second["pyspark"] == installed
    assert sorted(p.name for p in cache.iterdir()) == [archive.name]
    assert _whole(archive, facts)  # maps and verifies in that JVM (-Xshare:on)
