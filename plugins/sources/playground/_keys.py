"""Key helpers of the playground: region boundaries are memcomparable-encoded raw keys."""

from __future__ import annotations

from cdcflow.plugins.sources.tikv.tidb.keys import encode_bytes

__all__ = ["encode_key"]


def encode_key(raw: bytes) -> bytes:
    """Memcomparable form of a raw TiDB key (order-preserving), as PD and TiKV keep it."""
    return encode_bytes(raw)
