"""gRPC channels to PD and TiKV, plaintext or TLS."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["TLSFiles", "call_cancelled", "host_port", "open_channel"]

# Event batches of large transactions exceed gRPC's 4 MiB default.
_MAX_MESSAGE = 256 * 1024 * 1024
_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    # Each channel connects on its own. With gRPC's process-wide subchannel pool a new
    # channel shares the connection of any open channel to the same address, and with it
    # that connection's reconnect backoff (up to minutes after a long outage): the PD
    # client, which opens new channels to find the leader again, would then fail at once
    # with the old error for that long after PD is back.
    ("grpc.use_local_subchannel_pool", 1),
]


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """PEM files for mutual TLS; ``ca`` alone gives server-authenticated TLS."""

    ca: str
    cert: str = ""
    key: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


def host_port(url: str) -> str:
    """``host:port`` from a PD client URL such as ``http://127.0.0.1:2379``."""
    for scheme in ("http://", "https://", "grpc://"):
        if url.startswith(scheme):
            url = url[len(scheme) :]
    return url.rstrip("/")


def open_channel(address: str, tls: TLSFiles | None = None) -> grpc.aio.Channel:
    """A channel to ``address`` (``host:port``); it connects lazily on first use."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=_OPTIONS)
    return grpc.aio.secure_channel(address, tls.credentials(), options=_OPTIONS)


def call_cancelled() -> bool:
    """Whether the ``asyncio.CancelledError`` being handled came from a gRPC call that was
    cancelled locally (grpc.aio raises it from a read or write of such a call: the stream
    was reset or closed meanwhile), not from a cancellation of the running task, which
    must be re-raised."""
    task = asyncio.current_task()
    return task is None or not task.cancelling()
