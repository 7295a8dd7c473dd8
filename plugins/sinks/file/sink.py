"""The ``file`` sink: ``file:///dir?protocol=json``.

Layout under the target directory::

    {schema}/{table}/{batch_id:012d}-{end_ts}.{ext}   rows of one batch, laid out by the codec
    {schema}/{table}/ddl-{commit_ts}.{ext}            a table's DDL
    {schema}/ddl-{commit_ts}.{ext}                    a schema-level DDL
    metadata                                           {"checkpoint-ts": …, "batch-id": …}

The codec (``protocol=json|canal-json|open-protocol``) decides the layout of
a file (``Codec.file_bytes``): text protocols write one message per line;
``open-protocol`` writes records of ``LEN(8 bytes BE) + key`` then
``LEN(8 bytes BE) + value``, each key and value exactly as a Kafka message
would carry them (docs/reference/open-protocol.md, "Files").

Every file is written to a temporary name, flushed and fsynced, then renamed
into place, so a reader never sees a half-written file. A replayed batch
writes the same names again, which makes replay idempotent. ``metadata`` is
written last and records the batch's resolved ts.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import Field

from cdcflow.core.data.codec import Codec, EncodedMessage
from cdcflow.core.data.events import MicroBatch, RowChange, TableName
from cdcflow.core.data.sink import Sink, SinkContext
from cdcflow.core.errors import ConfigInvalidError, DownstreamUnavailableError
from cdcflow.core.plugin import PluginConfig, Registrar, hookimpl
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["FileSink", "FileSinkConfig", "cdcflow_register_sinks"]


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
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DownstreamUnavailableError(f"file sink cannot create {self._dir}: {exc}") from exc

    def write_batch(self, batch: MicroBatch) -> None:
        codec = self._require_codec()
        ext = codec.file_extension
        by_table: dict[TableName, list[RowChange]] = defaultdict(list)
        for row in batch.rows:
            by_table[row.table].append(row)
        try:
            for table, rows in by_table.items():
                name = f"{batch.batch_id:012d}-{batch.end_ts}.{ext}"
                self._write_file(self._table_dir(table) / name, codec.encode_rows(rows))
            for ddl in batch.ddl:
                folder = (
                    self._table_dir(ddl.table)
                    if ddl.table and ddl.table.table
                    else self._dir / (ddl.table.schema if ddl.table else "_")
                )
                message = codec.encode_ddl(ddl)
                if message is not None:
                    self._write_file(folder / f"ddl-{ddl.commit_ts}.{ext}", [message])
            meta = {"changefeed-id": batch.changefeed_id, "batch-id": batch.batch_id, "checkpoint-ts": batch.end_ts}
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
        return self._dir / table.schema / table.table

    def _write_file(self, path: Path, messages: list[EncodedMessage]) -> None:
        self._write_bytes(path, self._require_codec().file_bytes(messages))

    def _write_bytes(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                if self.config.fsync:
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if self.config.fsync:
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


@hookimpl
def cdcflow_register_sinks(registry: Registrar[Sink[Any]]) -> None:
    registry.add(FileSink)
