"""The capture's SparkSession: one per process, shared by its changefeeds' queries.

Configuration, in increasing precedence: cdcflow's defaults for local mode,
the ``cdcflow_spark_conf`` hook of every plugin, then ``server.spark.conf``.
The Python workers run the driver's interpreter (``PYSPARK_PYTHON`` and
``PYSPARK_DRIVER_PYTHON`` are set to ``sys.executable``) so that they import
the same cdcflow and plugins; on a cluster, every node needs the same Python
environment at the same path (or set ``spark.pyspark.python`` in
``server.spark.conf``).

Spark's own log goes to stderr (``log4j2.properties`` next to this module),
at ERROR unless the capture logs more: ``--log-level=info`` shows Spark's
warnings, ``--log-level=debug`` its info messages. stdout stays cdcflow's.

In local mode on a small machine, the JVM compiles with its first-tier JIT only
(``server.spark.jit``, :func:`jit_options`): the second tier's compiling after a
start took the cores a catch-up needed.

A local JVM maps the classes of its start from an archive an earlier JVM wrote at
exit (``server.spark.class-cache``, :mod:`~cdcflow.core.data.pipeline.classcache`),
and Spark's Python workers import PySpark from the installed package rather than
from Spark's zip (:mod:`~cdcflow.core.data.pipeline.pydaemon`): both shorten a
start by seconds.

Spark's JVM is launched without running Python in a forked child
(:func:`spawn_jvm_without_fork`): a capture always has gRPC threads running,
and a fork that runs PySpark's ``preexec_fn`` in the child then now and then
crashes the child (JAVA_GATEWAY_EXITED) and can break the parent's gRPC
polling. The JVM gets a process group of its own instead, which keeps a
terminal's Ctrl-C away from it just as PySpark's ignored SIGINT did; it still
ends with the driver, when its stdin pipe closes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cdcflow.core.config.settings import QUICK_JIT_MAX_CORES, SparkSettings

if TYPE_CHECKING:
    from cdcflow.core.data.pipeline.classcache import ClassCache
    from cdcflow.core.plugin.manager import PluginManager

T = TypeVar("T")

__all__ = [
    "KEEPER_JOB_GROUP",
    "LOCAL_DEFAULTS",
    "LOG4J2_CONFIG",
    "QUICK_JIT_OPTION",
    "TASK_MODULES",
    "SnapshotHold",
    "WorkerKeeper",
    "jit_options",
    "local_task_slots",
    "register_source",
    "run_in_threads",
    "snapshots_held",
    "spark_conf",
    "spark_job_group",
    "spark_log_level",
    "spark_ready",
    "spark_session",
    "spark_starting",
    "spawn_jvm_without_fork",
    "stop_spark_session",
    "wait_for_snapshots",
    "warm_planner",
    "warm_python_workers",
    "worker_modules",
]

#: Spark's log configuration in a capture: stderr only, level from the capture's.
LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")

#: Defaults for local mode: small shuffles, no UI, no event log.
LOCAL_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.python.worker.reuse": "true",
    # Workers import PySpark from the installed package's bytecode, not from Spark's zip.
    "spark.python.daemon.module": "cdcflow.core.data.pipeline.pydaemon",
}

_lock = threading.Lock()
log = logging.getLogger(__name__)

#: Set while the capture's Spark starts at the capture's start (:func:`spark_starting`).
_STARTING = threading.Event()


@contextlib.contextmanager
def spark_starting() -> Iterator[None]:
    """Inside the block, the capture's Spark is starting: its session, then the first
    warming of its Python workers (:func:`~cdcflow.core.data.pipeline.start_spark`).
    :func:`spark_ready` is false until the block ends."""
    _STARTING.set()
    try:
        yield
    finally:
        _STARTING.clear()


#: Initial snapshots being read or delivered in this process (:class:`SnapshotHold`).
_SNAPSHOTS = threading.Condition()
_snapshots_held = 0


class SnapshotHold:
    """An initial snapshot (or a snapshot range) being read or delivered in this process,
    from its creation until :meth:`release` (or the end of a ``with`` block; releasing
    twice is releasing once).

    While any is held, the capture's start leaves the warm-up of Spark's read planner
    (:func:`warm_planner`) waiting (:func:`wait_for_snapshots`): the planner's process
    serves the streaming queries' micro-batches, which start only after the snapshot,
    and its start — a daemon forked per planning step, each importing PySpark and the
    task modules — took 0.3 of the two cores of a 1,000,000-row snapshot's delivery."""

    def __init__(self) -> None:
        global _snapshots_held
        self._held = True
        with _SNAPSHOTS:
            _snapshots_held += 1

    def release(self) -> None:
        global _snapshots_held
        with _SNAPSHOTS:
            if self._held:
                self._held = False
                _snapshots_held -= 1
                _SNAPSHOTS.notify_all()

    def __enter__(self) -> SnapshotHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def snapshots_held() -> int:
    """How many :class:`SnapshotHold` s this process holds now."""
    with _SNAPSHOTS:
        return _snapshots_held


def wait_for_snapshots(until: Callable[[], bool] = lambda: False, poll: float = 1.0) -> bool:
    """Wait until no :class:`SnapshotHold` is held, or ``until()`` (looked at every
    ``poll`` seconds) is true; whether none is held."""
    with _SNAPSHOTS:
        while _snapshots_held and not until():
            _SNAPSHOTS.wait(poll)
        return _snapshots_held == 0


def spark_ready(session: Any = None) -> bool:
    """Whether Spark runs a task without waiting for its start: a session is up
    (``session``, else the process's), and the capture's start is not still starting
    its Python workers (:func:`spark_starting`)."""
    if _STARTING.is_set():
        return False
    if session is not None:
        return True
    from pyspark.sql import SparkSession

    return SparkSession._instantiatedSession is not None


#: The JVM option of ``server.spark.jit: quick``: the first-tier (C1) compiler only.
QUICK_JIT_OPTION = "-XX:TieredStopAtLevel=1"


def jit_options(settings: SparkSettings, cores: int | None = None) -> list[str]:
    """The JIT options of a capture's Spark JVM (``server.spark.jit``) on a machine of
    ``cores`` cores (default: the cores this process may run on).

    In local mode the JVM shares the machine's cores with the capture and Spark's
    Python workers, and the JVM's second-tier compiler (C2) spends a minute or more
    after a start compiling: on two cores, a catch-up right after a start measured
    12 of the JVM's 21 CPU-seconds in the compiler threads and its live checkpoint lag
    p99 about 0.5 s higher than with the first tier only, which compiled in about one
    CPU-second (its compiled code spent about 40 % more in the tasks' JVM side, a few
    microseconds per row). ``quick`` keeps the first tier only, ``full`` the JVM's
    default; ``auto`` is quick up to :data:`QUICK_JIT_MAX_CORES` cores. A cluster's
    driver and executors are left as configured (``spark.driver.extraJavaOptions``,
    ``spark.executor.extraJavaOptions``)."""
    if not settings.master.startswith("local") or settings.jit == "full":
        return []
    if settings.jit == "auto" and (cores if cores is not None else _machine_cores()) > QUICK_JIT_MAX_CORES:
        return []
    return [QUICK_JIT_OPTION]


def local_task_slots(master: str) -> int:
    """The tasks a capture's Spark runs at once on this machine: ``N`` of a ``local[N]``
    or ``local[N,F]`` master, 1 of ``local``, and this machine's cores for ``local[*]``
    and cluster masters (whose tasks run elsewhere; what the capture itself can run)."""
    master = master.strip()
    if master == "local":
        return 1
    match = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
    return max(1, int(match.group(1))) if match else _machine_cores()


def _machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container's cpuset
    limits it), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def spark_conf(settings: SparkSettings, plugins: PluginManager | None = None) -> dict[str, str]:
    """The Spark properties the capture's session is built with."""
    conf = dict(LOCAL_DEFAULTS) if settings.master.startswith("local") else {}
    conf["spark.driver.extraJavaOptions"] = " ".join(
        [
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.resolve().as_uri()}",
            f"-Dcdcflow.spark.log.level={spark_log_level()}",
            *jit_options(settings),
        ]
    )
    conf["spark.sql.warehouse.dir"] = os.path.abspath(settings.warehouse_dir)
    if plugins is not None:
        conf.update(plugins.spark_conf(settings.master))
    conf.update(settings.conf)
    return conf


def spark_log_level(level: int | None = None) -> str:
    """Spark's log level for a capture logging at ``level`` (default: the root logger's):
    Spark is one level quieter than cdcflow, and never below INFO."""
    level = logging.getLogger().getEffectiveLevel() if level is None else level
    if level <= logging.DEBUG:
        return "INFO"
    if level <= logging.INFO:
        return "WARN"
    return "ERROR"


def _spawn(args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` for PySpark's gateway launch, minus the ``preexec_fn``
    that forces a fork running Python in the child: with none, Python spawns the
    child without running fork handlers or Python code in it."""
    if kwargs.pop("preexec_fn", None) is not None and os.name == "posix":
        kwargs.setdefault("process_group", 0)  # what the preexec_fn was for: no terminal SIGINT
    return subprocess.Popen(args, **kwargs)


def spawn_jvm_without_fork() -> None:
    """Make PySpark launch Spark's JVM with :func:`_spawn` (see the module docs); idempotent."""
    import pyspark.java_gateway as gateway

    gateway.Popen = _spawn  # type: ignore[attr-defined,assignment]


def spark_session(settings: SparkSettings, plugins: PluginManager | None = None) -> Any:
    """The process's SparkSession, built on first use (takes seconds: call off the event loop)."""
    from pyspark.sql import SparkSession

    spawn_jvm_without_fork()
    with _lock:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        if settings.master.startswith("local"):
            # Everything is on this machine: keep Spark on loopback.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        conf = spark_conf(settings, plugins)
        cache = _class_cache(settings, conf)
        builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
        for key, value in conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        if cache is not None:
            cache.started(session)
        # Also when the JVM was started earlier (another session, a test's fixture).
        session.sparkContext.setLogLevel(spark_log_level())
        return session


def _class_cache(settings: SparkSettings, conf: dict[str, str]) -> ClassCache | None:
    """The class cache of a JVM this process is about to launch (``server.spark.class-cache``,
    local masters), its options added to ``conf``'s driver JVM options; None when the JVM
    is up already (another session of this process) or the cache is not used."""
    from pyspark import SparkContext

    from cdcflow.core.data.pipeline.classcache import ClassCache, default_cache_dir

    if not settings.class_cache or not settings.master.startswith("local") or SparkContext._gateway is not None:
        return None
    directory = Path(settings.class_cache_dir).expanduser() if settings.class_cache_dir else default_cache_dir()
    if any(c.isspace() or c in "\"'" for c in str(directory)):
        return None  # Spark's launcher splits the JVM options at white space
    options = conf.get("spark.driver.extraJavaOptions", "")
    cache = ClassCache.for_jvm(directory, options.split(), conf)
    extra = cache.options() if cache is not None else []
    if not extra:
        return None
    conf["spark.driver.extraJavaOptions"] = " ".join([options, *extra]).strip()
    return cache


#: The local properties :func:`spark_job_group` sets (and restores) on the calling thread.
_JOB_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


@contextlib.contextmanager
def spark_job_group(spark: Any, group: str, description: str) -> Iterator[None]:
    """Run the Spark jobs this thread starts inside the block in job group ``group``, so
    that ``sparkContext.cancelJobGroup(group)`` from any thread cancels them and
    interrupts their tasks. Spark keeps the group per thread (PySpark pins each Python
    thread to a JVM thread); the thread's previous group is restored after the block."""
    context = spark.sparkContext
    before = [context.getLocalProperty(key) for key in _JOB_GROUP_PROPERTIES]
    context.setJobGroup(group, description, True)
    try:
        yield
    finally:
        for key, value in zip(_JOB_GROUP_PROPERTIES, before, strict=True):
            context.setLocalProperty(key, value)


#: The local properties :func:`run_in_threads` gives each thread: the caller's job group
#: (so that cancelling it cancels the threads' jobs) and scheduler pool.
_INHERITED_PROPERTIES = (*_JOB_GROUP_PROPERTIES, "spark.scheduler.pool")


def run_in_threads(spark: Any, calls: Sequence[Callable[[], T]], threads: int) -> list[T]:
    """Run ``calls`` on up to ``threads`` threads at once, so that Spark runs one call's
    tasks while another's job is planned or committed on the driver; each thread's jobs in
    the calling thread's job group and scheduler pool. Returns their results in order, or
    raises the first failure in order once every call ended. With one thread, or one
    call, the calls run one after the other on the calling thread."""
    if threads <= 1 or len(calls) <= 1:
        return [call() for call in calls]
    context = spark.sparkContext
    properties = {key: context.getLocalProperty(key) for key in _INHERITED_PROPERTIES}

    def run(call: Callable[[], T]) -> T:
        for key, value in properties.items():
            context.setLocalProperty(key, value)
        try:
            return call()
        finally:
            for key in properties:
                context.setLocalProperty(key, None)

    with ThreadPoolExecutor(min(threads, len(calls)), thread_name_prefix="cdcflow-spark") as pool:
        futures = [pool.submit(run, call) for call in calls]
        wait(futures)
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]


#: What every task of the pipeline imports in Spark's Python workers.
TASK_MODULES = (
    "pyarrow",
    "cdcflow.core.data.pipeline.tasks",
    "cdcflow.core.data.pipeline.datasource",
    "cdcflow.core.data.pipeline.snapshot",
)


def worker_modules(plugins: PluginManager | None) -> list[str]:
    """The modules a pipeline's tasks import: :data:`TASK_MODULES` and the modules of
    every registered source and sink class (their batch mounters, snapshot tasks and
    task writers are unpickled in the workers)."""
    modules = list(TASK_MODULES)
    if plugins is not None:
        for registry in (plugins.sources, plugins.sinks):
            modules.extend(entry.cls.__module__ for entry in registry)
    return list(dict.fromkeys(modules))


def _import_all(modules: list[str], batches: Iterator[Any], overlap: float = 0.5) -> Iterator[Any]:
    """A ``mapInArrow`` function: import ``modules`` (a module that fails to import
    is left for the task that needs it to report), pass the batches through after
    ``overlap`` seconds (long enough that the job's tasks overlap: each starts a
    worker of its own).

    It also makes pyarrow's first conversion of a Python list, as every task does:
    that imports pandas when installed (PySpark's SQL extra brings it), hundreds of
    modules, most of a second of a cold worker's first task otherwise."""
    import importlib

    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None:
        with contextlib.suppress(Exception):
            pyarrow.array([0])
    if overlap:
        time.sleep(overlap)
    yield from batches


def _warming_job(session: Any, modules: list[str], overlap: float) -> Any:
    """A job of a task per core whose Python step imports ``modules`` (see :func:`_import_all`)."""
    cores = max(1, int(session.sparkContext.defaultParallelism))
    step = functools.partial(_import_all, modules, overlap=overlap)
    return session.range(cores, numPartitions=cores).mapInArrow(step, "id long")


def warm_python_workers(session: Any, modules: list[str], *, planner: bool = True) -> None:
    """Start Spark's Python workers and import ``modules`` in them: one small job of a
    task per core (``spark.python.worker.reuse`` keeps the workers for the pipeline's
    tasks). A cold worker spends seconds in start-up and imports; without this, the
    first micro-batch or initial snapshot read pays it. Then, with ``planner``, start
    the process Spark plans data source reads in (:func:`warm_planner`)."""
    _warming_job(session, modules, overlap=0.5).collect()
    if planner:
        warm_planner(session)


def register_source(session: Any) -> None:
    """Register the ``cdcflow`` data source, which the changefeeds' queries read, with
    ``session`` (again: nothing more). A session's first registration of a Python data
    source has Spark load its static ones in a Python process of its own
    (``lookup_data_sources``: PySpark imported there, a second or more of CPU)."""
    from cdcflow.core.data.pipeline.datasource import CdcflowDataSource

    session.dataSource.register(CdcflowDataSource)


def warm_planner(session: Any) -> None:
    """One read of :class:`~cdcflow.core.data.pipeline.datasource.PlannerWarmup`: it starts
    the process Spark plans data source reads in, which a stream's first micro-batch
    would start."""
    from cdcflow.core.data.pipeline.datasource import PlannerWarmup

    session.dataSource.register(PlannerWarmup)
    session.read.format(PlannerWarmup.name()).load().collect()


#: The job group of :class:`WorkerKeeper`'s jobs (cancelled when it stops).
KEEPER_JOB_GROUP = "cdcflow-keep-workers"


class WorkerKeeper:
    """Keeps the capture's Spark Python workers alive while no changefeed sends rows.

    Spark ends an executor's idle Python workers once it has run no Python task for
    a minute (PythonWorkerFactory). Changefeeds without new rows run no Spark job (an
    empty batch skips it), so after a quiet minute the next batch with rows forked
    new workers, imported the task modules in them (about a second on a small
    machine) and compiled its decoders again: a burst after a quiet spell started
    with the slowest batch of all. Every ``every`` seconds, unless a Spark job is
    running then (its tasks keep the workers), the keeper runs one small job of a
    task per core that imports ``modules`` (already there: nothing to do) and ends.
    It runs in a daemon thread until :meth:`stop`.
    """

    def __init__(self, session: Any, modules: list[str], every: float) -> None:
        self.session = session
        self.modules = list(modules)
        self.every = every
        #: Jobs run so far (for tests and the log).
        self.runs = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.every <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="spark-keep-workers", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread; a job it is running is cancelled."""
        self._stopping.set()
        if self._thread is None:
            return
        with contextlib.suppress(Exception):
            self.session.sparkContext.cancelJobGroup(KEEPER_JOB_GROUP)
        self._thread.join(timeout)

    def keep(self) -> bool:
        """Run the keeping job now unless another job runs; whether it ran."""
        context = self.session.sparkContext
        if context.statusTracker().getActiveJobsIds():
            return False
        job = _warming_job(self.session, self.modules, overlap=0.0)
        with spark_job_group(self.session, KEEPER_JOB_GROUP, "cdcflow: keep the Python workers"):
            job.collect()
        self.runs += 1
        return True

    def _run(self) -> None:
        while not self._stopping.wait(self.every):
            try:
                self.keep()
            except Exception as exc:  # noqa: BLE001 - the next batch starts workers instead
                if self._stopping.is_set() or getattr(self.session.sparkContext, "_jsc", None) is None:
                    return  # stopped, or Spark stopped under it: nothing left to keep
                log.warning("the job keeping Spark's Python workers failed (%s); tried again in %.0fs", exc, self.every)


def stop_spark_session() -> None:
    """Stop the process's SparkSession, if any (its JVM and workers end)."""
    from pyspark.sql import SparkSession

    with _lock:
        # getActiveSession() is the calling thread's; a capture stops Spark from another
        # thread than the one that started it, so fall back to the process's default one.
        session = SparkSession.getActiveSession() or SparkSession._instantiatedSession
        if session is not None:
            session.stop()
