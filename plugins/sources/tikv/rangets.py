"""Resolved ts per key range of one span, whatever the regions currently are.

A span is covered by regions that split, merge and move. The resolved ts is
kept per key range (not per region), so a range whose region is being
re-subscribed keeps holding the span's frontier back at the ts it had, and
the new subscription starts exactly there: nothing is lost, and only changes
above the frontier may be delivered twice.
"""

from __future__ import annotations

__all__ = ["RangeTs"]


class RangeTs:
    """Pieces ``[start, end) → ts`` covering ``[span_start, span_end)``; ts only moves forward.

    Keys are region-space keys; an empty end is +infinity. Operations are
    linear in the number of pieces, which stays near the number of regions.
    """

    def __init__(self, start: bytes, end: bytes, ts: int) -> None:
        self._pieces: list[tuple[bytes, bytes, int]] = [(start, end, ts)]

    def __len__(self) -> int:
        return len(self._pieces)

    def pieces(self) -> list[tuple[bytes, bytes, int]]:
        return list(self._pieces)

    @property
    def frontier(self) -> int:
        """The minimum ts over the whole span."""
        return min(ts for _, _, ts in self._pieces)

    def min_ts(self, start: bytes, end: bytes) -> int:
        """The minimum ts over the pieces overlapping ``[start, end)``."""
        found = [ts for s, e, ts in self._pieces if _overlap(s, e, start, end)]
        return min(found) if found else self.frontier

    def forward(self, start: bytes, end: bytes, ts: int) -> None:
        """Raise the ts of ``[start, end)`` to ``ts`` (pieces already above keep theirs)."""
        out: list[tuple[bytes, bytes, int]] = []
        for s, e, old in self._pieces:
            if not _overlap(s, e, start, end) or old >= ts:
                out.append((s, e, old))
                continue
            lo = max(s, start)
            hi = _min_end(e, end)
            if lo > s:
                out.append((s, lo, old))
            out.append((lo, hi, ts))
            if hi and (not e or hi < e):
                out.append((hi, e, old))
        self._pieces = _merge(out)


def _overlap(s1: bytes, e1: bytes, s2: bytes, e2: bytes) -> bool:
    return (not e2 or s1 < e2) and (not e1 or s2 < e1)


def _min_end(a: bytes, b: bytes) -> bytes:
    if not a:
        return b
    if not b:
        return a
    return min(a, b)


def _merge(pieces: list[tuple[bytes, bytes, int]]) -> list[tuple[bytes, bytes, int]]:
    merged: list[tuple[bytes, bytes, int]] = []
    for piece in pieces:
        if merged and merged[-1][2] == piece[2] and merged[-1][1] == piece[0]:
            merged[-1] = (merged[-1][0], piece[1], piece[2])
        else:
            merged.append(piece)
    return merged
