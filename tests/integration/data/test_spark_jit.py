"""``server.spark.jit: quick`` reaches the JVM a capture's SparkSession starts."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

SCRIPT = """
import sys
from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session
spark = spark_session(SparkSettings(master="local[1]", warehouse_dir=sys.argv[1], jit="quick"))
runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print(" ".join(str(a) for a in runtime.getInputArguments()))
stop_spark_session()
"""


def test_a_quick_jit_starts_spark_s_jvm_with_the_first_tier_only(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "lake")],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    arguments = result.stdout.split()
    assert "-XX:TieredStopAtLevel=1" in arguments
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in arguments)
