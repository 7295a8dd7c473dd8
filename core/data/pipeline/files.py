"""A changefeed's pipeline files on a capture, and their reclaiming.

Every changefeed that runs spans on a capture keeps a directory under the
capture's data directory, ``<data-dir>/changefeeds/<changefeed-id>/``
(:func:`changefeed_dir`): ``store/`` (the event store), ``spark-checkpoint/``
(the streaming query's checkpoint and writer identity), ``snapshot/`` (the
initial snapshot's plan and parts) and ``feed-spill/`` (what a source's feeds
spill). ``changefeed.json`` (:data:`OWNER_FILE`) says which changefeed of the
id the files are for: its creation time.

Files of changefeeds that no longer exist are reclaimed by the capture's sweep
(:mod:`cdcflow.core.control.reclaim`) with the helpers here: the directories
are listed (:func:`scan_changefeed_dirs`), one to reclaim is first renamed out
of the way (:func:`detach_changefeed_dir`, one ``rename``: an executor started
afterwards finds no directory and starts afresh) and then deleted
(:func:`delete_detached`), which may take long on a big event store and runs
in a thread. A detached directory is named ``.reclaim-<id>-<random>`` beside
the changefeeds' own (ids never start with a dot); one left by a capture that
stopped while deleting it is deleted by the next sweep.

This module imports neither Spark nor the pipeline: the control plane uses it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from cdcflow.core.config.settings import CHANGEFEED_ID_PATTERN
from cdcflow.core.data.events import utc_text
from cdcflow.core.errors import CdcflowError

__all__ = [
    "DETACHED_PREFIX",
    "OWNER_FILE",
    "ChangefeedDir",
    "changefeed_dir",
    "changefeeds_root",
    "claim_changefeed_dir",
    "delete_detached",
    "detach_changefeed_dir",
    "discard_changefeed_data",
    "recorded_created_at",
    "scan_changefeed_dirs",
]

log = logging.getLogger(__name__)

#: The file in a changefeed's directory that says which changefeed of the id it is for.
OWNER_FILE = "changefeed.json"
#: How a directory being reclaimed is named (then ``<changefeed-id>-<random hex>``).
DETACHED_PREFIX = ".reclaim-"


def changefeeds_root(data_dir: str | Path) -> Path:
    """The directory holding every changefeed's directory on this capture."""
    return Path(data_dir) / "changefeeds"


def changefeed_dir(data_dir: str | Path, changefeed_id: str) -> Path:
    """Where a changefeed's event store and Spark checkpoint live."""
    return changefeeds_root(data_dir) / changefeed_id


def claim_changefeed_dir(directory: Path, changefeed_id: str, created_at: float) -> None:
    """Make ``directory`` the files of the changefeed ``changefeed_id`` created at ``created_at``.

    A changefeed removed and created again under the same id (``cli changefeed
    remove`` then ``create``, or ``cdcflow run`` replacing the embedded
    playground's) must not resume the previous one's event store, Spark
    checkpoint and snapshot: they hold chunks, offsets and batch ids of another
    start ts (a new start ts below the old one's published ts would skip rows).
    The directory records the creation time of the changefeed it belongs to;
    one recorded for another creation is deleted first. A directory without the
    record (made by a version that did not keep it) is taken as this changefeed's.
    """
    owner = directory / OWNER_FILE
    try:
        recorded = json.loads(owner.read_text(encoding="utf-8")).get("created_at")
    except FileNotFoundError:
        recorded = None
    except (OSError, ValueError, AttributeError) as exc:
        raise CdcflowError(
            f"changefeed {changefeed_id}: cannot read {owner} ({exc}); it says which changefeed the files in "
            f"{directory} belong to. Remove the directory if the changefeed is new, or restore the file"
        ) from exc
    if recorded is not None and recorded == created_at:
        return
    if recorded is not None:
        log.info(
            "changefeed %s was created again (at %s; its files are of the one created at %s): "
            "discarding the previous changefeed's event store, Spark checkpoint and snapshot in %s",
            changefeed_id,
            f"{utc_text(created_at)} UTC",
            f"{utc_text(recorded)} UTC",
            directory,
        )
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = owner.with_suffix(".tmp")
    tmp.write_text(json.dumps({"changefeed_id": changefeed_id, "created_at": created_at}), encoding="utf-8")
    os.replace(tmp, owner)


def discard_changefeed_data(data_dir: str | Path, changefeed_id: str) -> int:
    """Delete a changefeed's files on this capture at once (renamed out of the way first,
    see the module docs); the bytes freed (0: there were none)."""
    detached = detach_changefeed_dir(data_dir, changefeed_id)
    return 0 if detached is None else delete_detached(detached)


@dataclass(frozen=True, slots=True)
class ChangefeedDir:
    """A changefeed's directory found by :func:`scan_changefeed_dirs`."""

    changefeed_id: str
    path: Path
    #: The creation time its owner file records; None: no owner file, or one that cannot be read.
    created_at: float | None


def scan_changefeed_dirs(data_dir: str | Path) -> tuple[list[ChangefeedDir], list[Path]]:
    """The changefeeds' directories under ``data_dir`` (by id; entries whose name is not a
    changefeed id are not listed), and the detached ones left by an earlier sweep that did
    not finish deleting them. Blocking (file system reads)."""
    root = changefeeds_root(data_dir)
    found: list[ChangefeedDir] = []
    detached: list[Path] = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return [], []
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if entry.name.startswith(DETACHED_PREFIX):
            detached.append(path)
        elif CHANGEFEED_ID_PATTERN.match(entry.name):  # anything else is no changefeed's: left alone
            found.append(ChangefeedDir(entry.name, path, recorded_created_at(path)))
    return found, detached


def recorded_created_at(directory: Path) -> float | None:
    """The creation time the directory's owner file records (None: no file, or unreadable)."""
    try:
        recorded = json.loads((directory / OWNER_FILE).read_text(encoding="utf-8")).get("created_at")
    except (OSError, ValueError, AttributeError):
        return None
    return float(recorded) if isinstance(recorded, int | float) and not isinstance(recorded, bool) else None


def detach_changefeed_dir(data_dir: str | Path, changefeed_id: str) -> Path | None:
    """Rename the changefeed's directory out of the way (one ``rename``, quick enough for
    the event loop); the new path, or None when there is no such directory."""
    source = changefeed_dir(data_dir, changefeed_id)
    target = changefeeds_root(data_dir) / f"{DETACHED_PREFIX}{changefeed_id}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(source, target)
    except FileNotFoundError:
        return None
    return target


def delete_detached(path: Path) -> int:
    """Delete a detached directory; the bytes it held. Blocking (runs in a thread)."""
    size = _size(path)
    shutil.rmtree(path, ignore_errors=True)
    return size


def _size(path: Path) -> int:
    total = 0
    for parent, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue
    return total
