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
