"""The ``tikv`` source plugin in raw mode against scripted PD and TiKV servicers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from cdcflow.core.data.events import OpType, RawKVEvent, ResolvedEvent, Span, TableName
from cdcflow.core.errors import CheckpointStaleError, ConfigInvalidError
from cdcflow.plugins.sources.tikv import TiKVSource, TiKVSourceConfig
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, cdcpb_pb2_grpc, pdpb_pb2_grpc
from cdcflow.plugins.sources.tikv.tidb.keys import encode_int

from .scripted import Event, PDState, Row, ScriptedPD, ScriptedStore, entries, entry, region, start_server


def test_raw_mode_spans_feed_and_mounter() -> None:
    async def body() -> None:
        store = ScriptedStore()
        state = PDState(regions=[(region(1, b"", b""), 1)], gc_safepoint=50)
        pd_server, pd_address = await start_server((pdpb_pb2_grpc.add_PDServicer_to_server, ScriptedPD(state)))
        state.leader_address = pd_address
        kv_server, kv_address = await start_server((cdcpb_pb2_grpc.add_ChangeDataServicer_to_server, store))
        state.stores[1] = kv_address
        source = TiKVSource(TiKVSourceConfig(pd=[pd_address], kv_api="rawkv", key_spans=[["61", "62"]]))
        await source.open()
        try:
            tables = await source.list_tables()
            assert tables == [TableName("rawkv", "keys_0")]
            (span,) = await source.spans_for(tables[0])
            assert span == Span(0, b"a", b"b")
            assert (await source.table_schema(tables[0], 0)).handle_key_columns() == ("key",)
            assert await source.current_ts() > 0

            with pytest.raises(CheckpointStaleError):
                await anext(aiter(source.feed(span, 10)))

            events: asyncio.Queue[Any] = asyncio.Queue()

            async def pump() -> None:
                async for ev in source.feed(span, 100):
                    await events.put(ev)

            task = asyncio.create_task(pump())
            conn = await store.next_conn()
            req = await conn.request()
            # Raw keys are not memcomparable-encoded in rawkv mode.
            assert (req.start_key, req.end_key, req.kv_api) == (b"a", b"b", cdcpb_pb2.ChangeDataRequest.RawKV)
            rid = req.request_id
            conn.send(
                entries(
                    1,
                    rid,
                    entry(Event.COMMITTED, b"a1", start=101, commit=102, value=b"v1"),
                    entry(Event.COMMITTED, b"a1", start=103, commit=104, value=b"v2", old=b"v1"),
                    entry(Event.COMMITTED, b"a1", start=105, commit=106, op=Row.DELETE, old=b"v2"),
                    entry(Event.INITIALIZED, b""),
                ),
                resolved=([1], 110, rid),
            )
            got = [await asyncio.wait_for(events.get(), 10) for _ in range(4)]
            assert got[3] == ResolvedEvent(span, 110)
            mounter = source.mounter()
            assert mounter is not None
            rows = []
            for ev in got[:3]:
                assert isinstance(ev, RawKVEvent)
                rows.append(await mounter.mount(ev))
            assert [r.op for r in rows if r] == [OpType.INSERT, OpType.UPDATE, OpType.DELETE]
            assert rows[1] is not None and rows[1].before == {"key": b"a1", "value": b"v1"}
            assert rows[1].after == {"key": b"a1", "value": b"v2"}
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        finally:
            await source.close()
            await kv_server.stop(None)
            await pd_server.stop(None)

    asyncio.run(asyncio.wait_for(body(), 60))


def test_tidb_mode_table_span_is_the_record_range() -> None:
    source = TiKVSource(TiKVSourceConfig())
    span = asyncio.run(source.spans_for(TableName("db", "t", table_id=42)))
    prefix = b"t" + encode_int(42)
    assert span == [Span(42, prefix + b"_r", prefix + b"_s")]


def test_bad_key_spans_are_config_errors() -> None:
    with pytest.raises(ConfigInvalidError) as info:
        TiKVSource(TiKVSourceConfig(kv_api="txnkv", key_spans=[["zz", "01"], ["02", "01"]]))
    assert [i.path for i in info.value.issues] == ["source.key_spans[0]", "source.key_spans[1]"]


def test_playground_option_is_off_by_default_and_takes_true_or_a_mapping() -> None:
    from cdcflow.plugins.sources.tikv.config import EmbeddedPlaygroundConfig

    assert TiKVSourceConfig().embedded_playground() is None
    assert TiKVSourceConfig.model_validate({"playground": True}).embedded_playground() == EmbeddedPlaygroundConfig()
    opts = TiKVSourceConfig.model_validate({"playground": {"stores": 2, "rate": 5, "seed": 9}}).embedded_playground()
    assert opts == EmbeddedPlaygroundConfig(stores=2, rate=5.0, seed=9)
    with pytest.raises(ValidationError):
        TiKVSourceConfig.model_validate({"playground": {"stores": 0}})
    with pytest.raises(ValidationError):
        TiKVSourceConfig.model_validate({"playground": {"nodes": 2}})


def test_the_tikv_source_does_not_import_the_playground():
    import subprocess
    import sys

    code = (
        "import sys, cdcflow.plugins.sources.tikv; "
        "assert not [m for m in sys.modules if m.startswith('cdcflow.plugins.sources.playground')]"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_the_playground_option_needs_a_plugin_that_provides_the_upstream():
    from cdcflow.core.plugin.manager import PluginManager

    config = TiKVSourceConfig.model_validate({"playground": True})
    tikv_only = PluginManager()
    tikv_only.load_builtins(["cdcflow.plugins.sources.tikv"])
    [(field, message)] = TiKVSource.check_config(config, tikv_only)
    assert field == "playground" and "cdcflow_tikv_embedded_upstream" in message
    assert TiKVSource.check_config(config, PluginManager.default(autoload=False)) == []
    with pytest.raises(ConfigInvalidError, match="no plugin provides an in-process upstream"):
        TiKVSource(config).gc_safepoint_keeper()
