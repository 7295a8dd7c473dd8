"""Spark's Python workers started and the pipeline's modules imported when the capture starts."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from cdcflow.core.data.pipeline.session import TASK_MODULES, warm_python_workers, worker_modules
from cdcflow.core.plugin.manager import PluginManager
from tests.fixtures.spark import spark  # noqa: F401 - the fixture

#: A module nothing else imports in Spark's workers in this test session.
_PROBE = "xml.dom.minidom"


def _loaded(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"loaded": [_PROBE in sys.modules] * batch.num_rows})


def _probe(session: Any) -> list[bool]:
    return [row.loaded for row in session.range(1, numPartitions=1).mapInArrow(_loaded, "loaded boolean").collect()]


def test_the_workers_import_the_modules_before_the_first_task(spark: Any) -> None:  # noqa: F811
    assert _probe(spark) == [False]  # a worker of this session, not warmed with the probe
    warm_python_workers(spark, [_PROBE])
    assert _probe(spark) == [True]


def test_the_modules_warmed_are_the_tasks_and_every_source_and_sink() -> None:
    modules = worker_modules(PluginManager.default())
    assert modules[: len(TASK_MODULES)] == list(TASK_MODULES)
    assert "cdcflow.plugins.sources.tikv.plugin" in modules
    assert "cdcflow.plugins.sinks.kafka.sink" in modules
    assert len(modules) == len(set(modules))
