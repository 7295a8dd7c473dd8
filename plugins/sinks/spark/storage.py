"""Files of the Spark sink, through Hadoop's FileSystem (local, HDFS, S3A …).

Layout under the root directory::

    {schema}/{table}/changelog/commit_date=…/writer=…/batch_id=…/part-*.parquet
    {schema}/{table}/snapshot/v{end_ts:020d}/part-*.parquet, _COMMITTED
    _cdcflow/{changefeed}/writers/{writer}.json
    _cdcflow/{changefeed}/checkpoint.json       (a writer without id; earlier versions)

A change log made by a version without writers has no ``writer=`` level
(:meth:`Storage.changelog_by_writer` tells).

A snapshot version is visible once its ``_COMMITTED`` marker exists; the
marker is written after Spark committed the version's files. Readers take
the newest committed version (:func:`current_version`), so they never see a
half-written one.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Storage", "version_name"]

COMMITTED = "_COMMITTED"


def version_name(end_ts: int) -> str:
    return f"v{end_ts:020d}"


class Storage:
    """Small file operations on the sink's root directory."""

    def __init__(self, spark: Any, root: str) -> None:
        jvm = spark.sparkContext._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._IOUtils = jvm.org.apache.commons.io.IOUtils
        self.root = root.rstrip("/")
        self.fs = self._Path(self.root).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(self._Path(path)))

    def children(self, path: str) -> list[str]:
        if not self.exists(path):
            return []
        return sorted(str(s.getPath().getName()) for s in self.fs.listStatus(self._Path(path)))

    def write_text(self, path: str, text: str) -> None:
        """Write a small file: to a temporary name, then renamed (atomic on local FS and HDFS)."""
        tmp = self._Path(path + ".tmp")
        out = self.fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        final = self._Path(path)
        if self.fs.exists(final):
            self.fs.delete(final, False)
        if not self.fs.rename(tmp, final):
            raise OSError(f"cannot rename {tmp} to {path}")

    def read_text(self, path: str) -> str | None:
        if not self.exists(path):
            return None
        stream = self.fs.open(self._Path(path))
        try:
            return str(self._IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def delete(self, path: str) -> None:
        self.fs.delete(self._Path(path), True)

    # -- snapshot versions ---------------------------------------------------

    def committed_versions(self, snapshot_dir: str) -> list[str]:
        return [
            v
            for v in self.children(snapshot_dir)
            if v.startswith("v") and self.exists(f"{snapshot_dir}/{v}/{COMMITTED}")
        ]

    def current_version(self, snapshot_dir: str) -> str | None:
        versions = self.committed_versions(snapshot_dir)
        return versions[-1] if versions else None

    def commit_version(self, snapshot_dir: str, version: str, detail: dict[str, Any]) -> None:
        self.write_text(f"{snapshot_dir}/{version}/{COMMITTED}", json.dumps(detail, sort_keys=True))

    def prune_versions(self, snapshot_dir: str, keep: int) -> None:
        """Delete all but the newest ``keep`` committed versions, and abandoned uncommitted ones."""
        committed = self.committed_versions(snapshot_dir)
        newest = committed[-1] if committed else ""
        for name in self.children(snapshot_dir):
            if not name.startswith("v"):
                continue
            stale = name in committed[:-keep] if name in committed else name < newest
            if stale:
                self.delete(f"{snapshot_dir}/{name}")

    # -- sink checkpoint -------------------------------------------------------

    def checkpoint_path(self, changefeed_id: str, writer: str = "") -> str:
        """Where ``writer`` of the changefeed records its last batch ("" : no writer id)."""
        if not writer:
            return self.path("_cdcflow", changefeed_id, "checkpoint.json")
        return self.path("_cdcflow", changefeed_id, "writers", f"{writer}.json")

    def checkpoint(self, changefeed_id: str, writer: str = "") -> dict[str, Any]:
        text = self.read_text(self.checkpoint_path(changefeed_id, writer))
        return dict(json.loads(text)) if text else {}

    def write_checkpoint(self, changefeed_id: str, batch_id: int, resolved_ts: int, writer: str = "") -> None:
        body = json.dumps({"batch-id": batch_id, "resolved-ts": resolved_ts}, sort_keys=True)
        self.write_text(self.checkpoint_path(changefeed_id, writer), body)

    # -- change log layout -----------------------------------------------------

    def changelog_by_writer(self, changelog_dir: str) -> bool:
        """Whether a change log is partitioned by writer under its dates: true for a new one;
        false for one an earlier version made (``commit_date=…/batch_id=…``)."""
        for day in self.children(changelog_dir):
            if day.startswith("commit_date="):
                levels = [c for c in self.children(f"{changelog_dir}/{day}") if "=" in c]
                if levels:
                    return not levels[0].startswith("batch_id=")
        return True
