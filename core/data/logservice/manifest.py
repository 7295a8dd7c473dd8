"""The event store's manifest: what is published, durable across a restart.

``manifest.json`` in the store's directory lists the spans (with their small
ids), the resolved chunks not yet released, the DDL barriers and the
published ts. It is rewritten atomically (temp file, fsync, rename) after the
chunk files it names are in place, so a reader (the Spark data source, in
another process) never sees a chunk that is not complete, and a restarted
capture finds exactly what was published.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST_NAME", "ChunkInfo", "Manifest", "SpanEntry", "read_manifest", "write_manifest"]

MANIFEST_NAME = "manifest.json"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """A resolved chunk: events of one span published in ``(lo, hi]``.

    ``lo`` is the changefeed's published ts before the cut and ``hi`` the cut.
    Rows of a span added after ``lo`` with an older checkpoint may carry a
    commit ts at or below ``lo`` (they are delivered late rather than lost).
    A span that joins behind the published ts is *caught up* by chunks with
    ``lo == hi`` (the published ts then): readers order chunks by :attr:`seq`,
    never by ``hi`` alone, or they would miss them.
    """

    file: str
    span_id: int
    lo: int
    hi: int
    rows: int
    size: int

    @property
    def seq(self) -> int:
        """The chunk's sequence number (its file name): chunks are published in this order."""
        return int(Path(self.file).stem)


@dataclass(frozen=True, slots=True)
class SpanEntry:
    """A span the store has seen, by id; ``replicating`` when it was published last.

    ``covered_from`` is the chunk sequence number a recorded checkpoint must
    reach to cover the span since it last started replicating (None: not
    reached yet, or not known in manifests written before it was recorded)."""

    span_id: int
    table_id: int
    start: str
    end: str
    replicating: bool = False
    covered_from: int | None = None


@dataclass
class Manifest:
    """Everything a restart (or a reader) needs to know about published data."""

    changefeed_id: str
    published_ts: int = 0
    released_ts: int = 0
    checkpoint_ts: int = 0
    next_chunk: int = 0
    #: Chunks below this sequence number are released (read by no batch again).
    released_chunk: int = 0
    #: Every chunk below this sequence number is flushed by every sink (with ``checkpoint_ts``).
    checkpoint_chunk: int = 0
    spans: list[SpanEntry] = field(default_factory=list)
    chunks: list[ChunkInfo] = field(default_factory=list)
    ddl_ts: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = _VERSION
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        if data.get("version") != _VERSION:
            raise ValueError(f"unsupported event-store manifest version {data.get('version')!r}")
        return cls(
            changefeed_id=data["changefeed_id"],
            published_ts=int(data["published_ts"]),
            released_ts=int(data["released_ts"]),
            checkpoint_ts=int(data["checkpoint_ts"]),
            next_chunk=int(data["next_chunk"]),
            released_chunk=int(data.get("released_chunk", 0)),
            checkpoint_chunk=int(data.get("checkpoint_chunk", 0)),
            spans=[SpanEntry(**s) for s in data["spans"]],
            chunks=[ChunkInfo(**c) for c in data["chunks"]],
            ddl_ts=[int(t) for t in data["ddl_ts"]],
        )


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest in ``directory``, or None when there is none yet."""
    path = directory / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return Manifest.from_json(json.loads(text))


def write_manifest(directory: Path, manifest: Manifest, *, fsync: bool = True) -> None:
    """Replace the manifest atomically."""
    path = directory / MANIFEST_NAME
    tmp = path.with_name(MANIFEST_NAME + ".tmp")
    with tmp.open("w") as fh:
        json.dump(manifest.to_json(), fh, separators=(",", ":"))
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    tmp.replace(path)
