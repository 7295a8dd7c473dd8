"""What a codec plugin is: a message format (Open Protocol, canal-json, Avro, JSON).

Codecs turn row changes, DDL and resolved timestamps into keyed messages for
message-oriented sinks (Kafka, files) and back, so that one sink can speak
several protocols (``protocol=`` in a sink URI).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from cdcflow.core.data.events import DDLEvent, InsertRun, RowChange, TableName
from cdcflow.core.data.frozen import frozen_maker
from cdcflow.core.errors import CdcflowError
from cdcflow.core.plugin.base import ConfigT, Plugin

__all__ = ["Codec", "EncodedMessage", "make_encoded_message"]


@dataclass(frozen=True, slots=True)
class EncodedMessage:
    """One encoded message: key and value bytes, and what it carries."""

    key: bytes | None
    #: Empty with a key: a tombstone, which message sinks send as a null value (Avro deletes).
    value: bytes
    #: The table the message belongs to (None for resolved events).
    table: TableName | None = None
    #: Number of row changes inside (a batching protocol packs several).
    row_count: int = 0
    #: Largest commit ts of the contents (resolved ts for resolved events).
    ts: int = 0


#: ``EncodedMessage(...)``, made about twice as fast (see :mod:`cdcflow.core.data.frozen`):
#: for paths that make one or more per row.
make_encoded_message = frozen_maker(EncodedMessage)


class Codec(Plugin[ConfigT], abc.ABC):
    """Base class of codec plugins."""

    #: File extension for file sinks, without the dot.
    file_extension: str = "bin"

    @abc.abstractmethod
    def encode_rows(self, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        """Messages for ``rows`` (in order). Batching protocols may pack several rows."""

    def encode_rows_for_topic(self, topic: str, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        """Messages for ``rows`` bound for ``topic``; message sinks call this rather than :meth:`encode_rows`.

        The default ignores the topic. Protocols that name things after it
        override this (Avro registers schemas under ``{topic}-key`` /
        ``{topic}-value``).
        """
        return self.encode_rows(rows)

    def encode_row_parts(self, topic: str, rows: Sequence[RowChange]) -> list[EncodedMessage]:
        """Each row of ``rows`` encoded on its own (one part per row, in order), for
        :meth:`assemble` to pack into messages elsewhere — in another Spark task, after
        the parts of rows encoded in parallel are put back in commit order.

        The default suits protocols with one message per row: the messages are the
        parts, and :meth:`assemble` keeps them as they are. A batching protocol
        overrides both, so that ``assemble(topic, encode_row_parts(topic, rows))`` is
        ``encode_rows_for_topic(topic, rows)``.
        """
        parts = self.encode_rows_for_topic(topic, rows)
        if len(parts) != len(rows):
            raise CdcflowError(
                f"codec {type(self).__name__} gave {len(parts)} messages for {len(rows)} rows: a codec "
                "that packs rows into messages must override encode_row_parts and assemble"
            )
        return parts

    def encode_insert_parts(self, topic: str, run: InsertRun) -> list[EncodedMessage]:
        """:meth:`encode_row_parts` of ``run.rows()`` (which the default gives): the parts
        of a run of one table's inserts at one ts (an initial snapshot's), for a codec that
        writes them faster without a row object each."""
        return self.encode_row_parts(topic, run.rows())

    def assemble(self, topic: str, parts: Sequence[EncodedMessage]) -> list[EncodedMessage]:
        """The messages for ``parts`` (from :meth:`encode_row_parts`, in commit order)."""
        return list(parts)

    @abc.abstractmethod
    def encode_ddl(self, ddl: DDLEvent) -> EncodedMessage | None:
        """One message for a schema change (never batched with rows), or None
        when the protocol carries no DDL (Avro: schemas live in a registry)."""

    @abc.abstractmethod
    def encode_resolved(self, ts: int) -> EncodedMessage | None:
        """A resolved-ts message, or None when the protocol has none."""

    def file_bytes(self, messages: Sequence[EncodedMessage]) -> bytes:
        """How file sinks lay ``messages`` out in one file.

        The default suits text protocols: each value followed by a newline
        (keys dropped). Binary protocols override it with a framing that keeps
        keys and cannot be confused by newline bytes.
        """
        return b"".join(m.value + b"\n" for m in messages)
