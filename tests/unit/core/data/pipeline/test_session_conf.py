"""The Spark properties and JVM options of a capture's session."""

from __future__ import annotations

import os

import pytest

from cdcflow.core.config.settings import QUICK_JIT_MAX_CORES, SparkSettings
from cdcflow.core.data.pipeline.session import QUICK_JIT_OPTION, jit_options, local_task_slots, spark_conf


@pytest.mark.parametrize(
    ("master", "jit", "cores", "quick"),
    [
        ("local[*]", "auto", 2, True),
        ("local[2]", "auto", QUICK_JIT_MAX_CORES, True),
        ("local[*]", "auto", QUICK_JIT_MAX_CORES + 1, False),
        ("local[*]", "quick", 64, True),
        ("local[1]", "full", 2, False),
        ("spark://spark-master:7077", "quick", 2, False),
        ("spark://spark-master:7077", "auto", 2, False),
    ],
)
def test_the_quick_jit_is_for_local_spark_on_small_machines_or_when_asked(master, jit, cores, quick):
    settings = SparkSettings(master=master, jit=jit)
    assert jit_options(settings, cores) == ([QUICK_JIT_OPTION] if quick else [])


def test_the_jit_option_joins_the_log_options_of_the_driver():
    options = spark_conf(SparkSettings(master="local[2]", jit="quick"))["spark.driver.extraJavaOptions"].split()
    assert QUICK_JIT_OPTION in options
    assert any(o.startswith("-Dlog4j2.configurationFile=") for o in options)
    full = spark_conf(SparkSettings(master="local[2]", jit="full"))["spark.driver.extraJavaOptions"].split()
    assert QUICK_JIT_OPTION not in full and len(full) == len(options) - 1


def test_server_spark_conf_still_has_the_last_word_on_the_driver_options():
    settings = SparkSettings(master="local[2]", jit="quick", conf={"spark.driver.extraJavaOptions": "-Xss4m"})
    assert spark_conf(settings)["spark.driver.extraJavaOptions"] == "-Xss4m"


def test_auto_counts_the_cores_this_process_may_run_on():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quick = [QUICK_JIT_OPTION] if cores <= QUICK_JIT_MAX_CORES else []
    assert jit_options(SparkSettings(master="local[*]")) == quick


@pytest.mark.parametrize(
    ("master", "slots"),
    [
        ("local", 1),
        ("local[1]", 1),
        ("local[3]", 3),
        ("local[4,2]", 4),
        ("local[*]", None),
        ("local[*,3]", None),
        ("spark://spark-master:7077", None),
    ],
)
def test_the_task_slots_spark_runs_on_this_machine(master, slots):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert local_task_slots(master) == (cores if slots is None else slots)
