"""A capture process for the stop test: a list source, the Spark pipeline, a sink whose
Spark tasks wait at a gate (:class:`~tests.integration.data.gated.GatedTaskSink`).

Run as ``python -m tests.integration.data.stop_capture DATA_DIR GATE_DIR [then-fail]``.
Logs as a capture does (INFO, to stderr; Spark's own log too). SIGTERM stops it as it
stops ``cdcflow run``: the executor closes, stopping the query. It ends by itself once
everything up to FINAL_TS is flushed. With ``then-fail``, after a stop it runs a second
changefeed in the same Spark whose batch fails (its gate, ``GATE_DIR/failing``, says
``fail``) and prints its error.
"""

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.session import spark_session
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.testing import ListSource, insert
from tests.integration.data.gated import GatedTaskSink

ROWS = 30
START_TS = 50
FINAL_TS = 500
SETTINGS = SparkSettings(master="local[2]", trigger_interval=0.3)


async def changefeed(name: str, spark: Any, data_dir: Path, gate_dir: Path) -> PipelineSpanExecutor:
    events = [insert("shop", "orders", {"id": i}, commit_ts=100 + i) for i in range(ROWS)]
    source = ListSource(ListSource.Config(), [*events, ListSource.resolved(FINAL_TS)])
    sink = GatedTaskSink()
    sink.gate_dir = gate_dir
    context = PipelineContext(
        name, source, [sink], data_dir=data_dir, start_ts=START_TS, spark=spark, spark_settings=SETTINGS
    )
    executor = PipelineSpanExecutor(context)
    for table in await source.list_tables():
        for span in await source.spans_for(table):
            await executor.add_span(span, START_TS, prepare=False)
    return executor


async def main(data_dir: Path, gate_dir: Path, then_fail: bool) -> None:
    spark = await asyncio.to_thread(spark_session, SETTINGS)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    executor = await changefeed("stop", spark, data_dir, gate_dir)
    print("started", flush=True)
    while executor.checkpoint_ts < FINAL_TS and not stop.is_set():
        if executor.error() is not None:
            raise SystemExit(f"pipeline failed: {executor.error()}")
        await asyncio.sleep(0.1)
    await executor.close()
    print("stopped" if stop.is_set() else "done", executor.checkpoint_ts, flush=True)
    logging.getLogger("stop_capture").info("%s closed", "stopped" if stop.is_set() else "done")
    if stop.is_set() and then_fail:
        failing = await changefeed("fail", spark, data_dir, gate_dir / "failing")
        while failing.error() is None:
            await asyncio.sleep(0.1)
        print("failed:", failing.error(), flush=True)
        await failing.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:] == ["then-fail"]))
