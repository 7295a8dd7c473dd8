"""CockroachDB HLC timestamps and cdcflow's 64-bit ts space.

An HLC timestamp is ``(wall_ns, logical)``: nanoseconds since the epoch and a
counter, written ``"<wall_ns>.<logical, 10 digits>"`` by changefeeds
(``updated``, ``mvcc_timestamp``, ``resolved``) and accepted as ``cursor``
(docs/how-to/replicate-from-cockroachdb.md, "Timestamps"). cdcflow orders changes by
``(commit_ts, start_ts, key)`` and shows lag from ``commit_ts >> 18`` in
milliseconds, as TiKV's TSO. The mapping (issue 14, "Timestamps"):

* ``commit_ts = physical_ms << 18 | sub_ms_ns // 4`` — the sub-millisecond
  nanoseconds fit in 18 bits once divided by 4 (``999_999 // 4 < 2**18``);
* ``start_ts = (wall_ns % 4) << 32 | logical`` — the rest of the wall time and
  the logical counter, the tie-breaker.

The pair ``(commit_ts, start_ts)`` then sorts exactly as ``(wall_ns, logical)``
does. A resolved HLC ``(w, l)`` promises no later row at or below it; rows
after it may still share ``w``'s 4 ns bucket, so it maps to
``commit_ts(w) - 1``: never more than CockroachDB claimed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

__all__ = ["HLC", "cursor_for", "resolved_ts"]

_NS_PER_MS = 1_000_000
_BUCKET = 4
_LOGICAL_BITS = 18
_LOGICAL_MASK = (1 << _LOGICAL_BITS) - 1
_SUB_MS_BUCKETS = _NS_PER_MS // _BUCKET  # 250_000 valid values of the low 18 bits
_MAX_LOGICAL = (1 << 32) - 1

_DECIMAL = re.compile(r"^\s*(\d+)(?:\.(\d{1,10}))?\s*$")
#: hlc.Timestamp's String(): ``<seconds>.<9 digits of ns>,<logical>`` (error messages).
_GO_STRING = re.compile(r"(\d+)\.(\d{9}),(\d+)")


@dataclass(frozen=True, slots=True, order=True)
class HLC:
    """A CockroachDB hybrid-logical-clock timestamp."""

    wall_ns: int
    logical: int = 0

    def __post_init__(self) -> None:
        if self.wall_ns < 0 or not 0 <= self.logical <= _MAX_LOGICAL:
            raise ValueError(f"not an HLC timestamp: wall {self.wall_ns}, logical {self.logical}")

    @classmethod
    def parse(cls, text: str | Decimal) -> HLC:
        """``"1532377312562986715.0000000000"`` (changefeeds, ``cluster_logical_timestamp()``)."""
        match = _DECIMAL.match(str(text))
        if match is None:
            raise ValueError(f"not an HLC timestamp: {text!r}")
        wall, logical = match.group(1), match.group(2) or "0"
        return cls(int(wall), int(logical.ljust(10, "0")))

    @classmethod
    def find_in(cls, message: str) -> HLC | None:
        """The first timestamp in an error message, in either of CockroachDB's spellings."""
        go = _GO_STRING.search(message)
        if go is not None:
            return cls(int(go.group(1)) * 1_000_000_000 + int(go.group(2)), int(go.group(3)))
        decimal = re.search(r"\d{10,}\.\d{10}", message)
        return cls.parse(decimal.group(0)) if decimal is not None else None

    def __str__(self) -> str:
        return f"{self.wall_ns}.{self.logical:010d}"

    def next(self) -> HLC:
        return HLC(self.wall_ns, self.logical + 1)

    def prev(self) -> HLC:
        if self.logical:
            return HLC(self.wall_ns, self.logical - 1)
        return HLC(self.wall_ns - 1, _MAX_LOGICAL)

    @property
    def commit_ts(self) -> int:
        """cdcflow's commit ts of a change at this HLC."""
        ms, sub = divmod(self.wall_ns, _NS_PER_MS)
        return ms << _LOGICAL_BITS | sub // _BUCKET

    @property
    def start_ts(self) -> int:
        """The tie-breaker between changes with the same :attr:`commit_ts`."""
        return (self.wall_ns % _BUCKET) << 32 | self.logical

    def go_string(self) -> str:
        """hlc.Timestamp's String() form, as CockroachDB's error messages print it."""
        sec, ns = divmod(self.wall_ns, 1_000_000_000)
        return f"{sec}.{ns:09d},{self.logical}"


def resolved_ts(resolved: HLC) -> int:
    """The cdcflow resolved ts of a resolved HLC: rounded down, never claiming more."""
    return max(resolved.commit_ts - 1, 0)


def cursor_for(ts: int) -> HLC:
    """The ``cursor`` that replays every change with ``commit_ts > ts``.

    The greatest wall time whose commit ts is ``ts`` (a ts whose low 18 bits are
    past the last valid bucket stands for the end of its millisecond); changes
    above it may repeat what ``ts`` covered, never miss one.
    """
    ms, sub = ts >> _LOGICAL_BITS, ts & _LOGICAL_MASK
    if sub >= _SUB_MS_BUCKETS:
        return HLC(ms * _NS_PER_MS + _NS_PER_MS - 1, 0)
    return HLC(ms * _NS_PER_MS + sub * _BUCKET + _BUCKET - 1, 0)
