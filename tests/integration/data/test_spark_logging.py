"""Spark's own log in a capture goes to stderr, at the level the capture's --log-level implies."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

# Starts the capture's SparkSession and runs a job; Spark warns at start-up on this
# machine (no native Hadoop library) and logs INFO lines for every job.
SCRIPT = """
import logging, sys
logging.basicConfig(level=sys.argv[1])
from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.session import spark_session, stop_spark_session
spark = spark_session(SparkSettings(master="local[1]", warehouse_dir=sys.argv[2]))
assert spark.range(10).count() == 10
stop_spark_session()
print("done")
"""


def run_capture_like(level, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, level, str(tmp_path / "lake")],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    return result.stdout, result.stderr


def test_spark_logs_errors_only_on_stderr_by_default_and_more_at_debug(tmp_path):
    stdout, stderr = run_capture_like("WARNING", tmp_path)
    assert stdout == "done\n"
    assert " INFO spark " not in stderr and " WARN spark " not in stderr
    stdout, stderr = run_capture_like("DEBUG", tmp_path)
    assert stdout == "done\n"
    assert " INFO spark " in stderr
