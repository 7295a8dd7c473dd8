"""The ``file`` sink: ``file:///dir?protocol=json``.

Layout under the target directory::

    {schema}/{table}/{batch}.{ext}                     rows of one batch, written from the driver
    {schema}/{table}/{batch}-p{partition:05d}.{ext}    rows of one partition of a batch, written by a Spark task
    {schema}/{table}/ddl-{commit_ts}.{ext}            a table's DDL
    {schema}/ddl-{commit_ts}.{ext}                    a schema-level DDL
    metadata                                           {"checkpoint-ts": …, "batch-id": …, "writer": …}

where ``{batch}`` is ``{batch_id:012d}-{end_ts}``, followed by ``-w{writer}`` when the
pipeline has a writer identity (``SinkContext.writer_id``; the Spark pipeline always
has one). Batch ids are numbered per writer: on a cluster every capture running the
changefeed is a writer of its own, and two captures can write batches of the same id
and end ts into one table's directory (spans of one table on two captures); the
writer in the name keeps one capture's file from replacing the other's, while a
replay by the same writer still writes the same names. ``metadata`` is the last batch
any writer finished (with its writer): on a cluster, the changefeed's checkpoint is the
one in the metastore (``cdcflow cli changefeed query``), not this file's.

Schema and table names come from the upstream and may hold anything, so each
is written as one safe path segment, never joined raw (``segment_of``,
reversed by ``name_of``):

- ``%``, ``/``, ``\\``, NUL and every other control character are
  percent-encoded as ``%XX`` (UTF-8 bytes), as is a leading ``.`` (so ``..``,
  ``.`` and hidden names cannot occur) and the first character of a name the
  layout itself uses (``metadata``, ``_``, names starting with ``ddl-``);
- the empty name is written ``%``;
- an encoded name longer than 200 bytes keeps its first 150 bytes, then
  ``%~`` and 32 hex digits of the SHA-256 of the full name: unique, but not
  reversible (the full name is in every message of the file).

A table ``../../../x`` of schema ``shop`` is thus written in the directory
``shop/%2E.%2F..%2F..%2Fx``.
Every path is also checked, once resolved (symbolic links followed), to be
below the target directory; one that is not fails the batch with error 2001.

The codec (``protocol=json|canal-json|open-protocol``) decides the layout of
a file (``Codec.file_bytes``): text protocols write one message per line;
``open-protocol`` writes records of ``LEN(8 bytes BE) + key`` then
``LEN(8 bytes BE) + value``, each key and value exactly as a Kafka message
would carry them (docs/reference/open-protocol.md, "Files").

On Spark the rows are written by Spark tasks: each partition of a batch
(all changes of the keys hashed to it) writes one file per table, in
``(commit_ts, start_ts, key)`` order; a table's rows of one batch are the
union of its partition files, and the order of changes holds per key, not
across the files. The driver writes the batch's DDL files and ``metadata``
after every partition flushed.

Every file is written to a temporary name, flushed and fsynced, then renamed
into place, so a reader never sees a half-written file. A replayed batch (or
a retried partition) writes the same names again, which makes replay
idempotent. ``metadata`` is written last and records the batch's resolved ts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from pydantic import Field

from cdcflow.core.data.codec import Codec, EncodedMessage
from cdcflow.core.data.events import MicroBatch, RowChange, TableName
from cdcflow.core.data.sink import PartitionWriter, Sink, SinkContext, TaskWriter
from cdcflow.core.errors import ConfigInvalidError, DownstreamUnavailableError, Retryable
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["FileSink", "FileSinkConfig", "cdcflow_register_sinks", "name_of", "segment_of"]

#: Encoded names longer than this (bytes) are truncated and hashed; file systems allow 255.
MAX_SEGMENT_BYTES = 200
_KEEP_BYTES = 150
_HASHED = "%~"
#: Names the layout itself uses (their first character is encoded).
_RESERVED = ("metadata", "_")
_ENCODE = re.compile(r"[%/\\\x00-\x1f\x7f]")


def _percent(char: str) -> str:
    return "".join(f"%{b:02X}" for b in char.encode("utf-8", "surrogatepass"))


def segment_of(name: str) -> str:
    """``name`` (a schema or table name) as one safe path segment (module docs)."""
    if name == "":
        return "%"
    encoded = _ENCODE.sub(lambda m: _percent(m.group(0)), name)
    if encoded.startswith(".") or encoded in _RESERVED or encoded.startswith("ddl-"):
        encoded = _percent(encoded[0]) + encoded[1:]
    raw = encoded.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_SEGMENT_BYTES:
        return encoded
    head = raw[:_KEEP_BYTES].decode("utf-8", "ignore")
    head = re.sub(r"%[0-9A-F]?$", "", head)  # never end inside a %XX
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{head}{_HASHED}{digest}"


def name_of(segment: str) -> str | None:
    """The name ``segment_of`` encoded as ``segment``; None for a hashed (truncated) one."""
    if segment == "%":
        return ""
    if _HASHED in segment:
        return None
    data = bytearray()
    i = 0
    while i < len(segment):
        if segment[i] == "%":
            data.append(int(segment[i + 1 : i + 3], 16))
            i += 3
        else:
            data += segment[i].encode("utf-8", "surrogatepass")
            i += 1
    return data.decode("utf-8", "surrogatepass")


def _below(root: Path, path: Path) -> Path:
    """``path``, after checking that it resolves below ``root`` (2001, not retried, if not)."""
    base = root.resolve()
    resolved = path.resolve()
    if resolved != base and base not in resolved.parents:
        raise DownstreamUnavailableError(
            f"file sink refuses to write {path}: it resolves to {resolved}, outside the target directory {base}",
            detail={"path": str(path), "dir": str(base)},
            retryable=Retryable.NONE,
        )
    return path


def table_dir(root: Path, table: TableName) -> Path:
    """The directory of ``table``'s files below ``root``."""
    return _below(root, root / segment_of(table.schema) / segment_of(table.table))


def schema_dir(root: Path, schema: str | None) -> Path:
    """The directory of a schema's DDL files below ``root`` (``_`` without a schema)."""
    return _below(root, root / (segment_of(schema) if schema is not None else "_"))


class FileSinkConfig(PluginConfig):
    """Options of the file sink."""

    uri: str = Field("", description="Sink URI, file:///absolute/dir?protocol=...; overrides 'path' when set.")
    path: str = Field("./data/files", description="Target directory (used when 'uri' is empty).")
    protocol: str = Field("json", description="Codec (message format) of the files: json, canal-json or open-protocol.")
    fsync: bool = Field(True, description="fsync every file and directory before renaming it into place.")


def directory_of(config: FileSinkConfig) -> Path:
    """The target directory named by ``uri`` (``file:///dir``) or ``path``."""
    if not config.uri:
        return Path(config.path)
    parts = urlsplit(config.uri)
    if parts.scheme != "file":
        raise ConfigInvalidError(f"file sink URI must start with file://, got {config.uri!r}")
    if parts.netloc not in ("", "localhost", "."):
        raise ConfigInvalidError(
            f"file sink URI {config.uri!r} names host {parts.netloc!r}; write file:///absolute/dir "
            "or file://./relative/dir"
        )
    raw = unquote(parts.path)
    return Path("." + raw) if parts.netloc == "." else Path(raw)


class FileSink(Sink[FileSinkConfig]):
    """Writes each batch as files per table, atomically (for debugging and tests)."""

    type_name = "file"
    Config = FileSinkConfig
    uri_schemes = ("file",)

    def __init__(self, config: FileSinkConfig) -> None:
        super().__init__(config)
        self._dir = directory_of(config)
        self._codec: Codec[Any] | None = None
        self._writer = ""

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, FileSinkConfig)
        issues = []
        if config.protocol not in plugins.codecs:
            known = ", ".join(plugins.codecs.names()) or "none"
            issues.append(("protocol", f"unknown protocol {config.protocol!r}; known codecs: {known}"))
        try:
            directory_of(config)
        except ConfigInvalidError as exc:
            issues.append(("uri", exc.message))
        return issues

    def open(self, context: SinkContext) -> None:
        plugins = context.require_plugins("file")
        codec_cls = plugins.codecs[self.config.protocol]
        self._codec = codec_cls(codec_cls.Config())
        self._writer = context.writer_id
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DownstreamUnavailableError(f"file sink cannot create {self._dir}: {exc}") from exc

    def task_writer(self, tables: Sequence[TableName]) -> TaskWriter:
        return _FileTaskWriter(self._dir, self._require_codec(), self.config.fsync, self._writer)

    def write_batch(self, batch: MicroBatch) -> None:
        codec = self._require_codec()
        ext = codec.file_extension
        by_table: dict[TableName, list[RowChange]] = defaultdict(list)
        for row in batch.rows:
            by_table[row.table].append(row)
        try:
            for table, rows in by_table.items():
                name = f"{batch_stem(batch, self._writer)}.{ext}"
                self._write_file(self._table_dir(table) / name, codec.encode_rows(rows))
            for ddl in batch.ddl:
                folder = (
                    self._table_dir(ddl.table)
                    if ddl.table and ddl.table.table
                    else schema_dir(self._dir, ddl.table.schema if ddl.table else None)
                )
                message = codec.encode_ddl(ddl)
                if message is not None:
                    self._write_file(folder / f"ddl-{ddl.commit_ts}.{ext}", [message])
            meta = {"changefeed-id": batch.changefeed_id, "batch-id": batch.batch_id, "checkpoint-ts": batch.end_ts}
            if self._writer:
                meta["writer"] = self._writer
            self._write_bytes(self._dir / "metadata", json.dumps(meta, sort_keys=True).encode() + b"\n")
        except OSError as exc:
            raise DownstreamUnavailableError(
                f"file sink cannot write batch {batch.batch_id} to {self._dir}: {exc}",
                detail={"batch_id": batch.batch_id, "dir": str(self._dir)},
            ) from exc

    def _require_codec(self) -> Codec[Any]:
        if self._codec is None:
            raise RuntimeError("FileSink.write_batch called before open()")
        return self._codec

    def _table_dir(self, table: TableName) -> Path:
        return table_dir(self._dir, table)

    def _write_file(self, path: Path, messages: list[EncodedMessage]) -> None:
        self._write_bytes(path, self._require_codec().file_bytes(messages))

    def _write_bytes(self, path: Path, data: bytes) -> None:
        _write_atomically(path, data, fsync=self.config.fsync)


def batch_stem(batch: MicroBatch, writer: str) -> str:
    """The start of the names of ``batch``'s files: ``{batch_id:012d}-{end_ts}``, then
    ``-w{writer}`` for a pipeline with a writer identity (module docs)."""
    stem = f"{batch.batch_id:012d}-{batch.end_ts}"
    return f"{stem}-w{segment_of(writer)}" if writer else stem


def _write_atomically(path: Path, data: bytes, *, fsync: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class _FileTaskWriter(TaskWriter):
    """Ships the target directory and the codec to Spark tasks."""

    def __init__(self, directory: Path, codec: Codec[Any], fsync: bool, writer: str) -> None:
        self.directory = directory
        self.codec = codec
        self.fsync = fsync
        self.writer = writer

    def open(self, batch: MicroBatch, partition: int) -> PartitionWriter:
        return _FilePartitionWriter(self, batch, partition)


class _FilePartitionWriter(PartitionWriter):
    """One partition of one batch: a file per table, appended to a temporary file as rows
    come (a huge transaction is never held in memory), renamed into place on flush."""

    def __init__(self, target: _FileTaskWriter, batch: MicroBatch, partition: int) -> None:
        self._target = target
        self._name = f"{batch_stem(batch, target.writer)}-p{partition:05d}.{target.codec.file_extension}"
        self._batch_id = batch.batch_id
        self._open: dict[TableName, tuple[Path, BinaryIO]] = {}
        #: The temporary file of each target path, renamed into place on flush.
        self._temporary: dict[Path, Path] = {}

    def _file(self, table: TableName) -> BinaryIO:
        entry = self._open.get(table)
        if entry is None:
            path = table_dir(self._target.directory, table) / self._name
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            entry = self._open[table] = (path, os.fdopen(fd, "wb"))
            self._temporary[path] = Path(tmp)
        return entry[1]

    def write(self, rows: Sequence[RowChange]) -> None:
        by_table: dict[TableName, list[RowChange]] = defaultdict(list)
        for row in rows:
            by_table[row.table].append(row)
        codec = self._target.codec
        try:
            for table, table_rows in by_table.items():
                self._file(table).write(codec.file_bytes(codec.encode_rows(table_rows)))
        except OSError as exc:
            raise self._unavailable(exc) from exc

    def flush(self) -> None:
        try:
            for path, fh in self._open.values():
                fh.flush()
                if self._target.fsync:
                    os.fsync(fh.fileno())
                fh.close()
                os.replace(self._temporary.pop(path), path)
                if self._target.fsync:
                    _fsync_dir(path.parent)
        except OSError as exc:
            raise self._unavailable(exc) from exc
        self._open.clear()

    def close(self) -> None:
        # After an error: nothing half-written stays behind.
        for _, fh in self._open.values():
            fh.close()
        for tmp in self._temporary.values():
            tmp.unlink(missing_ok=True)
        self._open.clear()
        self._temporary.clear()

    def _unavailable(self, exc: OSError) -> DownstreamUnavailableError:
        directory = self._target.directory
        return DownstreamUnavailableError(
            f"file sink cannot write batch {self._batch_id} to {directory}: {exc}",
            detail={"batch_id": self._batch_id, "dir": str(directory)},
        )


@hookimpl
def cdcflow_register_sinks(registry: Registrar[Sink[Any]]) -> None:
    registry.add(FileSink)
