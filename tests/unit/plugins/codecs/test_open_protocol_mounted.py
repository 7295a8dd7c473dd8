"""Rows as the TiKV source mounts them, of every TiDB type, through the Open Protocol and back."""

import math

from hypothesis import given, settings

from cdcflow.plugins.codecs.canal_json import CanalJsonCodec, CanalJsonConfig
from cdcflow.plugins.codecs.open_protocol import OpenProtocolCodec, OpenProtocolConfig
from cdcflow.plugins.codecs.open_protocol_decode import decode_message
from cdcflow.plugins.sources.tikv.tidb.mounter import TiDBMounter
from tests.unit.plugins.sources.tikv.tidb import refcodec
from tests.unit.plugins.sources.tikv.tidb.test_mounter import (
    ALL_TYPES,
    mount,
    row_key,
    store_with,
    typed_rows,
    wide_table,
)


def mounted(case):
    handle, row = case
    raw = {}
    for cid, v in row.items():
        if v is None:
            raw[cid] = None
        elif cid - 2 < len(ALL_TYPES):
            raw[cid] = ALL_TYPES[cid - 2][2](v)
        else:
            tp, body = refcodec.json_bin(v)
            raw[cid] = bytes([tp]) + body
    return mount(
        TiDBMounter(store_with(wide_table())), key=row_key(500, handle), value=refcodec.row_v2(raw), commit_ts=10
    )


@settings(max_examples=60)
@given(typed_rows())
def test_every_mounted_type_round_trips(case):
    change = mounted(case)
    [message] = OpenProtocolCodec(OpenProtocolConfig()).encode_rows([change])
    [decoded] = decode_message(message.key, message.value)
    # the protocol writes ±Inf (and NaN) as 0, as TiCDC does
    expected = {k: 0.0 if isinstance(v, float) and math.isinf(v) else v for k, v in change.after.items()}
    assert decoded.after == expected
    flags = {c.name: (c.type_code, c.flags) for c in decoded.schema.columns}
    assert flags == {c.name: (c.type_code, c.flags) for c in change.schema.columns}
    # canal-json encodes the same rows without error, every value a string or null
    [doc] = CanalJsonCodec(CanalJsonConfig()).encode_rows([change])
    assert doc.value.startswith(b'{"id":0,"database":"shop","table":"wide"')
