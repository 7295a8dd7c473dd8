"""Spark's JVM is spawned without Python code in a forked child (see cdcflow.core.data.pipeline.session)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cdcflow.core.data.pipeline import session


def test_the_preexec_fn_is_replaced_by_a_process_group_of_its_own(tmp_path: Path) -> None:
    marker = tmp_path / "preexec-ran"

    def preexec() -> None:  # what PySpark passes: it would run in the forked child
        marker.touch()

    child = session._spawn(
        [sys.executable, "-c", "import os, sys; sys.stdout.write(str(os.getpgid(0)))"],
        stdout=subprocess.PIPE,
        preexec_fn=preexec,
    )
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    assert int(out) == child.pid != os.getpgid(0)  # its own group: a terminal's Ctrl-C does not reach it
    assert not marker.exists()  # no Python ran in a forked child


def test_other_launches_are_left_as_they_are() -> None:
    child = session._spawn([sys.executable, "-c", "import os, sys; sys.stdout.write(str(os.getpgid(0)))"],
                           stdout=subprocess.PIPE)  # fmt: skip
    out, _ = child.communicate(timeout=60)
    assert int(out) == os.getpgid(0)


def test_pyspark_launches_its_gateway_through_it() -> None:
    import pyspark.java_gateway as gateway

    session.spawn_jvm_without_fork()
    session.spawn_jvm_without_fork()  # idempotent
    assert gateway.Popen is session._spawn
