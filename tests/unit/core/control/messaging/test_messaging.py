"""Messages survive the wire; the gRPC transport delivers by topic, with and without TLS."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from cdcflow.core.control.messaging.center import MessageCenter
from cdcflow.core.control.messaging.grpc import GrpcTransport, MessageServer, TLSConfig
from cdcflow.core.control.messaging.messages import (
    CoordinatorBootstrapResponse,
    MaintainerHeartbeat,
    MaintainerStatus,
    SchedulingMessage,
    Topic,
    decode,
    encode,
)


def test_roundtrip_with_nested_statuses():
    beat = MaintainerHeartbeat("c1", 7, (MaintainerStatus("cf", 3, "working", 10, 12, {"code": 2001}),))
    assert decode(encode(beat)) == beat
    request = SchedulingMessage("c2", "cf", 3, {"type": "heartbeat-request", "seq": 4}, {"id": "cf"})
    assert decode(encode(request)) == request
    barrier = SchedulingMessage("c2", "cf", 3, barrier_ts=1 << 62)  # a changefeed barrier alone
    assert decode(encode(barrier)) == barrier
    with pytest.raises(ValueError, match="unknown message type"):
        decode(b'{"type": "Nope", "body": {}}')


def make_certs(tmp):
    """A CA and one certificate for 127.0.0.1 signed by it (openssl)."""

    def ssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=cdcflow-test-ca",
        "-keyout", f"{tmp}/ca.key", "-out", f"{tmp}/ca.pem")  # fmt: skip
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", f"{tmp}/node.key",
        "-out", f"{tmp}/node.csr")  # fmt: skip
    (tmp / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("x509", "-req", "-in", f"{tmp}/node.csr", "-CA", f"{tmp}/ca.pem", "-CAkey", f"{tmp}/ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", f"{tmp}/ext.cnf", "-out", f"{tmp}/node.pem")  # fmt: skip
    return TLSConfig(f"{tmp}/ca.pem", f"{tmp}/node.pem", f"{tmp}/node.key")


@pytest.mark.parametrize("use_tls", [False, True])
def test_grpc_delivery_between_two_captures(tmp_path, use_tls):
    tls = make_certs(tmp_path) if use_tls else None

    async def main():
        servers, centers = [], []
        for name in ("a", "b"):
            server = MessageServer("127.0.0.1:0", tls)
            await server.start()
            center = MessageCenter(name, GrpcTransport(name, tls))
            server.center = center
            servers.append(server)
            centers.append(center)
        peers = {"a": f"127.0.0.1:{servers[0].port}", "b": f"127.0.0.1:{servers[1].port}"}
        for center in centers:
            center.set_peers(peers)
        got: asyncio.Queue = asyncio.Queue()

        async def on_coordinator(message):
            await got.put(message)

        centers[1].register(Topic.COORDINATOR, on_coordinator)
        sent = [CoordinatorBootstrapResponse("a", n) for n in range(5)]
        for message in sent:
            assert centers[0].send("b", Topic.COORDINATOR, message)
        received = [await asyncio.wait_for(got.get(), 10) for _ in sent]
        assert received == sent  # in order, by topic
        assert not centers[0].send("nobody", Topic.COORDINATOR, sent[0])  # unknown target
        for center in centers:
            await center.close()
        for server in servers:
            await server.stop()

    asyncio.run(main())
