"""The pipeline's writer identity: who wrote a batch, for sinks that record batches.

Spark numbers a streaming query's micro-batches from 0 within its checkpoint
directory, and replays a batch under the same id after a crash. So a batch id
only means something together with the directory: on a cluster every capture
running a changefeed has its own pipeline, directory and ids (each from 0),
and a directory that is lost starts again at 0. A sink that recognises replays
by batch id (the ``mysql`` sink's checkpoint table) keys its record by
(changefeed, writer), with the writer identity kept here.

The identity is created once, as a random id in ``writer.json`` inside the
checkpoint directory, and read back on every start: a restart of the same
capture on the same directory keeps it (and Spark replays its batch ids under
it); a new or lost directory gets a new one. It reaches sinks as
:attr:`SinkContext.writer_id <cdcflow.core.data.sink.SinkContext.writer_id>`.

A directory that already held Spark's checkpoint when its identity was created
was written by a version without writer ids: its identity says it
``inherits`` (:attr:`SinkContext.writer_inherits`), so that a sink may take
over what it recorded then under no writer.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from cdcflow.core.errors import CdcflowError

__all__ = ["WRITER_FILE", "WriterIdentity", "writer_identity"]

#: The file in the checkpoint directory that holds the identity.
WRITER_FILE = "writer.json"


@dataclass(frozen=True, slots=True)
class WriterIdentity:
    """A pipeline's identity as a writer of batches."""

    #: Stable for as long as the checkpoint directory (and its batch ids) lasts.
    id: str
    #: The directory held Spark's checkpoint before the identity was created.
    inherits: bool = False


def writer_identity(checkpoint_dir: Path) -> WriterIdentity:
    """The identity kept in ``checkpoint_dir``, created there on first use."""
    path = checkpoint_dir / WRITER_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return _create(checkpoint_dir, path)
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("writer"), str) or not data["writer"]:
            raise ValueError("no non-empty string under 'writer'")
        return WriterIdentity(data["writer"], bool(data.get("inherits", False)))
    except ValueError as exc:
        raise CdcflowError(
            f"{path}: the pipeline's writer identity is unreadable ({exc}). Its batch ids cannot be told "
            f"from another capture's without it: delete the directory {checkpoint_dir} (the changefeed "
            "restarts its Spark query from its checkpoint, and the sinks apply the rows again idempotently).",
            detail={"file": str(path)},
        ) from exc


def _create(checkpoint_dir: Path, path: Path) -> WriterIdentity:
    # Spark's own files there (offsets/, commits/, metadata): batches were written before ids.
    inherits = checkpoint_dir.is_dir() and any(p.name != WRITER_FILE for p in checkpoint_dir.iterdir())
    identity = WriterIdentity(uuid.uuid4().hex, inherits)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{WRITER_FILE}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        json.dump({"writer": identity.id, "inherits": identity.inherits}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return identity
