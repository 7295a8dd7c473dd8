"""A capture process for the crash test: a paced list source, the Spark pipeline, a file sink.

Run as ``python -m tests.integration.data.pipeline_capture DATA_DIR OUT_DIR CHECKPOINT_FILE``. It
resumes from the checkpoint in CHECKPOINT_FILE (written atomically after each flushed batch,
as the coordinator would persist it) and exits once everything up to FINAL_TS is flushed.
"""

import asyncio
import os
import sys
from pathlib import Path

from cdcflow.core.config.settings import SparkSettings
from cdcflow.core.data.pipeline.session import spark_session
from cdcflow.core.data.pipeline.spark_executor import PipelineContext, PipelineSpanExecutor
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.testing import ListSource, insert
from cdcflow.plugins.sinks.file import FileSink, FileSinkConfig

TXNS = 40
ROWS_PER_TXN = 50
START_TS = 50
FINAL_TS = 100 + TXNS * 10


def events():
    out = []
    for txn in range(TXNS):
        commit = 100 + txn * 10
        for j in range(ROWS_PER_TXN):
            out.append(insert("shop", "orders", {"id": txn * ROWS_PER_TXN + j}, commit_ts=commit))
        out.append(ListSource.resolved(commit + 5))
    out.append(ListSource.resolved(FINAL_TS))
    return out


#: The feed holds back the second half until the first half is flushed, so that a
#: kill right after the first flush always lands mid-run.
GATE_TS = 100 + (TXNS // 2 - 1) * 10 + 5


class PacedListSource(ListSource):
    """Pauses after each resolved marker, like an upstream that commits over time."""

    checkpoint_file: Path

    async def feed(self, span, start_ts):
        async for event in super().feed(span, start_ts):
            yield event
            if hasattr(event, "table"):
                continue
            await asyncio.sleep(0.1)
            while event.ts == GATE_TS and read_checkpoint(self.checkpoint_file) < GATE_TS:
                await asyncio.sleep(0.1)


def read_checkpoint(path: Path) -> int:
    return int(path.read_text()) if path.exists() else START_TS


def save_checkpoint(path: Path, ts: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(ts))
    os.replace(tmp, path)


async def main(data_dir: Path, out_dir: Path, checkpoint_file: Path) -> None:
    start_ts = read_checkpoint(checkpoint_file)
    settings = SparkSettings(master="local[2]", trigger_interval=0.3)
    spark = await asyncio.to_thread(spark_session, settings)
    source = PacedListSource(PacedListSource.Config(), events())
    source.checkpoint_file = checkpoint_file
    executor = PipelineSpanExecutor(
        PipelineContext(
            "crash",
            source,
            [FileSink(FileSinkConfig(path=str(out_dir)))],
            data_dir=data_dir,
            start_ts=start_ts,
            spark=spark,
            spark_settings=settings,
            plugins=PluginManager.default(autoload=False),  # the file sink's codecs
            on_checkpoint=lambda ts: save_checkpoint(checkpoint_file, ts),
        )
    )
    for table in await source.list_tables():
        for span in await source.spans_for(table):
            await executor.add_span(span, start_ts, prepare=False)
    print("started", start_ts, flush=True)
    while executor.checkpoint_ts < FINAL_TS:
        if executor.error() is not None:
            raise SystemExit(f"pipeline failed: {executor.error()}")
        await asyncio.sleep(0.2)
    await executor.close()
    print("done", executor.checkpoint_ts, flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
