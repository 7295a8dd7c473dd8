"""The committed generated modules match the .proto files, and the wire
numbers match the facts cdcflow relies on."""

import filecmp
import subprocess
import sys

from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, metapb_pb2, pdpb_pb2
from tests import REPO


def test_generated_modules_are_current(tmp_path):
    out = tmp_path / "kvproto"
    subprocess.run(
        ["bash", str(REPO / "scripts" / "gen-protos"), str(out)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        cwd=REPO,
    )
    committed = REPO / "plugins" / "sources" / "tikv" / "kvproto"
    generated = sorted(p.name for p in out.iterdir())
    assert generated == sorted(p.name for p in committed.iterdir() if p.name != "__init__.py" and p.suffix != "")
    for name in generated:
        assert filecmp.cmp(out / name, committed / name, shallow=False), f"{name} is stale: run scripts/gen-protos"


def number(message, field):
    return message.DESCRIPTOR.fields_by_name[field].number


def test_wire_numbers():
    assert number(cdcpb_pb2.ChangeDataRequest, "request_id") == 7
    assert number(cdcpb_pb2.ChangeDataRequest, "deregister") == 13
    assert number(cdcpb_pb2.ChangeDataRequest, "scan_priority") == 14
    assert number(cdcpb_pb2.Event, "request_id") == 7
    assert number(cdcpb_pb2.Event, "long_txn") == 8
    assert number(cdcpb_pb2.Event.Row, "generation") == 10
    assert number(cdcpb_pb2.Error, "congested") == 8
    assert cdcpb_pb2.Event.INITIALIZED == 5
    assert number(pdpb_pb2.UpdateServiceGCSafePointRequest, "safe_point") == 4
    assert number(pdpb_pb2.ScanRegionsResponse, "regions") == 4
    assert number(metapb_pb2.Store, "node_state") == 13
    assert cdcpb_pb2.DESCRIPTOR.services_by_name["ChangeData"].full_name == "cdcpb.ChangeData"
    assert pdpb_pb2.DESCRIPTOR.services_by_name["PD"].methods_by_name["Tso"].full_name == "pdpb.PD.Tso"


def test_kv_read_wire_numbers():
    from cdcflow.plugins.sources.tikv.kvproto import errorpb_pb2, kvrpcpb_pb2, tikvpb_pb2

    assert [number(kvrpcpb_pb2.ScanRequest, f) for f in ("context", "start_key", "limit", "version")] == [1, 2, 3, 4]
    assert [number(kvrpcpb_pb2.ScanRequest, f) for f in ("key_only", "reverse", "end_key")] == [5, 6, 7]
    assert [number(kvrpcpb_pb2.ScanResponse, f) for f in ("region_error", "pairs", "error")] == [1, 2, 3]
    assert [number(kvrpcpb_pb2.KvPair, f) for f in ("error", "key", "value")] == [1, 2, 3]
    assert number(kvrpcpb_pb2.KeyError, "locked") == 1
    assert [number(kvrpcpb_pb2.LockInfo, f) for f in ("primary_lock", "lock_version", "key", "lock_ttl")] == [
        1,
        2,
        3,
        4,
    ]
    assert [number(kvrpcpb_pb2.Context, f) for f in ("region_id", "region_epoch", "peer")] == [1, 2, 3]
    assert number(kvrpcpb_pb2.CheckTxnStatusRequest, "rollback_if_not_exist") == 6
    assert number(kvrpcpb_pb2.CheckTxnStatusResponse, "lock_info") == 6
    assert number(kvrpcpb_pb2.ResolveLockRequest, "keys") == 5
    assert number(errorpb_pb2.Error, "epoch_not_match") == 5
    assert number(errorpb_pb2.Error, "store_not_match") == 8
    methods = tikvpb_pb2.DESCRIPTOR.services_by_name["Tikv"].methods_by_name
    assert {"KvScan", "KvCheckTxnStatus", "KvResolveLock"} <= set(methods)
