"""Spark's Python workers started and the pipeline's modules imported when the capture starts,
and kept while no changefeed sends rows."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa

from cdcflow.core.data.pipeline.session import TASK_MODULES, WorkerKeeper, warm_python_workers, worker_modules
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import until_sync
from tests.fixtures.spark import spark  # noqa: F401 - the fixture

#: A module nothing else imports in Spark's workers in this test session.
_PROBE = "xml.dom.minidom"


#: Another, for the keeper's job.
_KEPT = "xml.dom.pulldom"


def _loaded(batches: Iterator[pa.RecordBatch], probe: str = _PROBE, overlap: float = 0.0) -> Iterator[pa.RecordBatch]:
    time.sleep(overlap)
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"loaded": [probe in sys.modules] * batch.num_rows})


def _probe(session: Any, probe: str = _PROBE, tasks: int = 1) -> list[bool]:
    """Whether ``probe`` is imported in the worker of each of ``tasks`` tasks (with more than
    one, they overlap: each runs in a worker of its own)."""
    overlap = 0.5 if tasks > 1 else 0.0
    job = session.range(tasks, numPartitions=tasks).mapInArrow(lambda b: _loaded(b, probe, overlap), "loaded boolean")
    return [row.loaded for row in job.collect()]


def test_the_workers_import_the_modules_before_the_first_task(spark: Any) -> None:  # noqa: F811
    assert _probe(spark) == [False]  # a worker of this session, not warmed with the probe
    warm_python_workers(spark, [_PROBE])
    assert _probe(spark) == [True]


def test_warming_starts_the_process_spark_plans_data_source_reads_in(tmp_path: Path) -> None:
    # In a JVM of its own: the test session's may have planned a read already.
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from cdcflow.core.data.pipeline.session import warm_python_workers\n"
        "from cdcflow.plugins.sinks.spark.session import spark_session\n"
        "spark = spark_session('local[1]', sys.argv[1], {'spark.ui.enabled': 'false'})\n"
        "jvm = spark.sparkContext._gateway.proc.pid\n"
        "def planners():\n"
        "    found = 0\n"
        "    for proc in Path('/proc').glob('[0-9]*'):\n"
        "        try:\n"
        "            parent = int((proc / 'stat').read_text().rsplit(')', 1)[1].split()[1])\n"
        "            command = (proc / 'cmdline').read_bytes()\n"
        "        except (OSError, ValueError):\n"
        "            continue\n"
        "        found += parent == jvm and b'plan_data_source_read' in command\n"
        "    return found\n"
        "before = planners()\n"
        "warm_python_workers(spark, [])\n"
        "print(before, planners())\n"
        "spark.stop()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300, check=True
    )
    before, after = map(int, run.stdout.split()[-2:])
    assert (before, after) == (0, 1)


def test_the_warming_step_imports_what_pyarrow_imports_on_its_first_conversion() -> None:
    # A worker's first task turns Python lists into arrays; whatever pyarrow imports
    # then (pandas, when installed) must have been imported by the warming step.
    code = (
        "import sys\n"
        "from cdcflow.core.data.pipeline.session import TASK_MODULES, _import_all\n"
        "list(_import_all(list(TASK_MODULES), iter([]), overlap=0))\n"
        "before = set(sys.modules)\n"
        "import pyarrow as pa\n"
        "pa.RecordBatch.from_pydict({'a': [1, 2], 'b': ['x', None]})\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_the_modules_warmed_are_the_tasks_and_every_source_and_sink() -> None:
    modules = worker_modules(PluginManager.default())
    assert modules[: len(TASK_MODULES)] == list(TASK_MODULES)
    assert "cdcflow.plugins.sources.tikv.plugin" in modules
    assert "cdcflow.plugins.sinks.kafka.sink" in modules
    assert len(modules) == len(set(modules))


def test_the_keeper_runs_a_task_in_the_workers_when_no_job_runs(spark: Any) -> None:  # noqa: F811
    cores = int(spark.sparkContext.defaultParallelism)
    keeper = WorkerKeeper(spark, [_KEPT], every=60.0)
    assert not any(_probe(spark, _KEPT, cores))
    assert keeper.keep() is True
    assert keeper.runs == 1
    assert any(_probe(spark, _KEPT, cores))  # its tasks ran in the workers (every one of them probed)


def _wait_for(path: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    while not Path(path).exists():
        time.sleep(0.05)
    yield from batches


def test_the_keeper_leaves_the_workers_to_a_job_that_runs(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    release = tmp_path / "release"
    job = spark.range(1, numPartitions=1).mapInArrow(lambda b: _wait_for(str(release), b), "id long")
    running = threading.Thread(target=job.collect)
    running.start()
    try:
        until_sync(lambda: spark.sparkContext.statusTracker().getActiveJobsIds(), timeout=120)
        keeper = WorkerKeeper(spark, [], every=60.0)
        assert keeper.keep() is False
        assert keeper.runs == 0
    finally:
        release.touch()
        running.join(120)


def test_the_keeper_keeps_at_its_interval_until_stopped(spark: Any) -> None:  # noqa: F811
    keeper = WorkerKeeper(spark, [], every=0.05)
    keeper.start()
    try:
        until_sync(lambda: keeper.runs >= 2, timeout=120)
    finally:
        keeper.stop()
    assert keeper._thread is not None and not keeper._thread.is_alive()
    runs = keeper.runs
    time.sleep(0.2)  # stopped: no job after stop() returned
    assert keeper.runs == runs


def test_a_keeper_every_0_never_starts() -> None:
    keeper = WorkerKeeper(object(), [], every=0)
    keeper.start()
    keeper.stop()
    assert keeper._thread is None and keeper.runs == 0


class _StoppedContext:
    """A SparkContext after ``stop()``: no JVM side, every call fails."""

    _jsc = None

    def statusTracker(self) -> Any:
        raise RuntimeError("Cannot call methods on a stopped SparkContext")


def test_a_keeper_whose_spark_stopped_under_it_ends(caplog: Any) -> None:
    keeper = WorkerKeeper(SimpleNamespace(sparkContext=_StoppedContext()), [], every=0.01)
    keeper.start()
    assert keeper._thread is not None
    keeper._thread.join(30)
    assert not keeper._thread.is_alive() and keeper.runs == 0
    assert "keeping Spark's Python workers failed" not in caplog.text


def test_start_spark_keeps_one_keeper_per_session(monkeypatch: Any) -> None:
    from cdcflow.core.config.settings import ServerSettings, SparkSettings
    from cdcflow.core.data import pipeline
    from cdcflow.core.data.pipeline import session as session_module

    first, second = SimpleNamespace(name="first"), SimpleNamespace(name="second")
    made = iter([first, first, second])
    monkeypatch.setattr(session_module, "spark_session", lambda *_: next(made))
    monkeypatch.setattr(session_module, "warm_python_workers", lambda *_, **__: None)
    monkeypatch.setattr(session_module, "warm_planner", lambda *_: None)
    monkeypatch.setattr(session_module, "register_source", lambda *_: None)
    monkeypatch.setattr(pipeline, "_keeper", None)
    server = ServerSettings(spark=SparkSettings(keep_workers=0))  # no thread: only which keeper is kept
    plugins = PluginManager.default()
    pipeline.start_spark(server, plugins)
    kept = pipeline._keeper
    assert kept is not None and kept.session is first
    pipeline.start_spark(server, plugins)  # a second capture of the process, same Spark
    assert pipeline._keeper is kept
    pipeline.start_spark(server, plugins)  # Spark was stopped and started again meanwhile
    assert pipeline._keeper is not kept and pipeline._keeper.session.name == "second"
    assert kept._stopping.is_set()


def test_start_spark_warms_the_read_planner_once_no_snapshot_is_read_or_delivered(monkeypatch: Any) -> None:
    """Spark is ready for a snapshot's tasks once its workers are warm; the planner's
    process and the streams' data source, which only the streams need, come after every
    snapshot held here."""
    from pyspark.sql import SparkSession

    from cdcflow.core.config.settings import ServerSettings, SparkSettings
    from cdcflow.core.data import pipeline
    from cdcflow.core.data.pipeline import session as session_module

    session = SimpleNamespace(name="up")
    steps: list[str] = []
    monkeypatch.setattr(session_module, "spark_session", lambda *_: session)
    monkeypatch.setattr(SparkSession, "_instantiatedSession", session)
    monkeypatch.setattr(
        session_module, "warm_python_workers", lambda _s, _m, *, planner: steps.append(f"workers planner={planner}")
    )
    monkeypatch.setattr(session_module, "warm_planner", lambda s: steps.append(f"planner {s.name}"))
    monkeypatch.setattr(session_module, "register_source", lambda s: steps.append(f"source {s.name}"))
    monkeypatch.setattr(pipeline, "_keeper", None)
    server = ServerSettings(spark=SparkSettings(keep_workers=0))
    hold = session_module.SnapshotHold()
    try:
        start = threading.Thread(target=pipeline.start_spark, args=(server, PluginManager.default()))
        start.start()
        until_sync(lambda: steps == ["workers planner=False"] and session_module.spark_ready(session), timeout=30)
        start.join(0.5)
        assert start.is_alive() and steps == ["workers planner=False"]  # held back by the snapshot
    finally:
        hold.release()
    start.join(30)
    assert not start.is_alive() and steps == ["workers planner=False", "source up", "planner up"]
    # With no snapshot held, the data source is registered as the session starts.
    steps.clear()
    pipeline.start_spark(server, PluginManager.default())
    assert steps == ["source up", "workers planner=False", "planner up"]


def test_start_spark_does_not_warm_the_planner_of_a_spark_stopped_while_it_waited(monkeypatch: Any) -> None:
    from pyspark.sql import SparkSession

    from cdcflow.core.config.settings import ServerSettings, SparkSettings
    from cdcflow.core.data import pipeline
    from cdcflow.core.data.pipeline import session as session_module

    session = SimpleNamespace(name="up")
    planned: list[object] = []
    monkeypatch.setattr(session_module, "spark_session", lambda *_: session)
    monkeypatch.setattr(SparkSession, "_instantiatedSession", session)
    monkeypatch.setattr(session_module, "warm_python_workers", lambda *_, **__: None)
    monkeypatch.setattr(session_module, "warm_planner", planned.append)
    monkeypatch.setattr(session_module, "register_source", planned.append)
    monkeypatch.setattr(pipeline, "_keeper", None)
    server = ServerSettings(spark=SparkSettings(keep_workers=0))
    with session_module.SnapshotHold():
        start = threading.Thread(target=pipeline.start_spark, args=(server, PluginManager.default()))
        start.start()
        start.join(0.3)
        assert start.is_alive()
        monkeypatch.setattr(SparkSession, "_instantiatedSession", None)  # stopped
        start.join(30)
        assert not start.is_alive()
    assert planned == []
