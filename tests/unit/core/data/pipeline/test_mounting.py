"""Raw key-value events are mounted into rows on the capture's event loop, then
filtered and column-selected (the driver-side step of each micro-batch)."""

import asyncio
import threading

from cdcflow.core.config.settings import ColumnSelectorSettings
from cdcflow.core.data.events import OpType, RawKVEvent, RowChange, Span, TableName
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.logservice import EventStore
from cdcflow.core.data.logservice.records import batch_to_records, read_record_batches
from cdcflow.core.data.pipeline.columns import ColumnSelection
from cdcflow.core.data.pipeline.runtime import ChangefeedPipeline
from cdcflow.core.data.source import Mounter

SPAN = Span(7, b"t7", b"t7~")


class KeyValueMounter(Mounter):
    """Keys b"<schema>.<table>/<id>", values b"<n>"; keys starting with b"i" are index keys."""

    def __init__(self):
        self.threads = set()

    async def mount(self, event):
        self.threads.add(threading.get_ident())
        if event.key.startswith(b"i"):
            return None
        name, _, ident = event.key.decode().partition("/")
        schema, table = name.split(".")
        row = {"id": int(ident), "n": int(event.value), "secret": "s"}
        op = OpType.DELETE if event.delete else OpType.INSERT
        after, before = (None, row) if event.delete else (row, None)
        return RowChange(TableName(schema, table, 7), op, event.commit_ts, event.start_ts, after, before, key=event.key)


def test_raw_events_are_mounted_on_the_event_loop_then_filtered_and_selected(tmp_path):
    store = EventStore(tmp_path, "cf", start_ts=1, fsync=False)
    store.add_span(SPAN, 1, replicating=True)
    for i, key in enumerate([b"shop.orders/1", b"idx/1", b"mysql.user/2", b"shop.orders/3"]):
        store.put(SPAN, RawKVEvent(SPAN, key, b"%d" % (i * 10), b"", 5, 10 + i))
    store.resolve(SPAN, 20)
    records = [
        r
        for c in store.chunks_between(1, 20)
        for b in read_record_batches(tmp_path / c.file)
        for r in batch_to_records(b)
    ]

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    mounter = KeyValueMounter()
    try:
        pipeline = ChangefeedPipeline(
            changefeed_id="cf",
            store=store,
            sinks=[],
            spark=None,
            checkpoint_dir=tmp_path / "ckpt",
            table_filter=TableFilter(["*.*"]),
            mounter=mounter,
            loop=loop,
            column_selection=ColumnSelection([ColumnSelectorSettings(matcher=["shop.*"], columns=["*", "!secret"])]),
        )
        rows = pipeline._rows(records)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()
    assert mounter.threads == {thread.ident}
    assert [(r.table.table, r.after) for r in rows] == [("orders", {"id": 1, "n": 0}), ("orders", {"id": 3, "n": 30})]


def test_the_driver_path_applies_the_connectors_transforms_after_column_selection(tmp_path):
    from cdcflow.core.data.transform import TransformChain, TransformStep
    from cdcflow.plugins.transforms.filter import FilterConfig, FilterTransform
    from cdcflow.plugins.transforms.route import RouteConfig, RouteTransform

    store = EventStore(tmp_path, "cf", start_ts=1, fsync=False)
    store.add_span(SPAN, 1, replicating=True)
    for i, key in enumerate([b"shop.orders/1", b"shop.orders/2", b"shop.orders/3"]):
        store.put(SPAN, RawKVEvent(SPAN, key, b"%d" % (i * 10), b"", 5, 10 + i))
    store.resolve(SPAN, 20)
    records = [
        r
        for c in store.chunks_between(1, 20)
        for b in read_record_batches(tmp_path / c.file)
        for r in batch_to_records(b)
    ]
    chain = TransformChain(
        [
            TransformStep("transforms[0] (filter)", FilterTransform(FilterConfig(where="n >= 10")), TableFilter()),
            TransformStep(
                "transforms[1] (route)",
                RouteTransform(RouteConfig(routes=[{"source": r"shop\.(\w+)", "target": r"lake.\1"}])),
                TableFilter(),
            ),
        ]
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        pipeline = ChangefeedPipeline(
            changefeed_id="cf",
            store=store,
            sinks=[],
            spark=None,
            checkpoint_dir=tmp_path / "ckpt",
            mounter=KeyValueMounter(),
            loop=loop,
            column_selection=ColumnSelection([ColumnSelectorSettings(matcher=["shop.*"], columns=["*", "!secret"])]),
            transforms=chain,
        )
        rows = pipeline._rows(records)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()
    assert [(str(r.table), r.after) for r in rows] == [
        ("lake.orders", {"id": 2, "n": 10}),
        ("lake.orders", {"id": 3, "n": 20}),
    ]
