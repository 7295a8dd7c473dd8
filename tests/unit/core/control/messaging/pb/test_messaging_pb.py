"""The committed generated modules of the inter-capture protocol match messaging.proto,
and the wire numbers and service path that captures of different versions share are fixed."""

import filecmp
import subprocess
import sys

from cdcflow.core.control.messaging.messages import MaintainerHeartbeat, MaintainerStatus, Topic, decode, encode
from cdcflow.core.control.messaging.pb import messaging_pb2, messaging_pb2_grpc
from tests import REPO


def test_generated_modules_are_current(tmp_path):
    out = tmp_path / "pb"
    subprocess.run(
        ["bash", str(REPO / "scripts" / "gen-messaging-protos"), str(out)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        cwd=REPO,
    )
    committed = REPO / "core" / "control" / "messaging" / "pb"
    generated = sorted(p.name for p in out.iterdir() if p.name != "__init__.py")
    assert generated == sorted(p.name for p in committed.iterdir() if p.name != "__init__.py" and p.suffix != "")
    for name in generated:
        stale = f"{name} is stale: run scripts/gen-messaging-protos"
        assert filecmp.cmp(out / name, committed / name, shallow=False), stale


def number(message, field):
    return message.DESCRIPTOR.fields_by_name[field].number


def test_wire_numbers_and_service_path():
    assert [(f.name, f.number) for f in messaging_pb2.Envelope.DESCRIPTOR.fields] == [
        ("topic", 1),
        ("sender", 2),
        ("target", 3),
        ("payload", 4),
    ]
    assert number(messaging_pb2.StreamAck, "received") == 1
    method = messaging_pb2.DESCRIPTOR.services_by_name["MessageCenter"].methods_by_name["SendMessages"]
    assert method.full_name == "cdcflow.messaging.MessageCenter.SendMessages"
    assert method.client_streaming and not method.server_streaming  # one stream per peer, one ack at its end
    assert hasattr(messaging_pb2_grpc, "MessageCenterStub") and hasattr(messaging_pb2_grpc, "MessageCenterServicer")


def test_an_envelope_carries_a_control_plane_message_across_the_wire():
    beat = MaintainerHeartbeat("c1", 7, (MaintainerStatus("cf", 3, "working", 10, 12),))
    sent = messaging_pb2.Envelope(topic=Topic.COORDINATOR.value, sender="c1", target="c2", payload=encode(beat))
    received = messaging_pb2.Envelope.FromString(sent.SerializeToString())
    assert (received.topic, received.sender, received.target) == (Topic.COORDINATOR.value, "c1", "c2")
    assert Topic(received.topic) is Topic.COORDINATOR
    assert decode(received.payload) == beat
