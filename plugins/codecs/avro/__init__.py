"""The ``avro`` codec: TiCDC's Avro protocol over a Confluent Schema Registry.

Modules: :mod:`.codec` (the codec), :mod:`.types` (column types → Avro types
and values), :mod:`.layout` (a table's key and value schemas),
:mod:`.registry` (the Schema Registry REST client), :mod:`.wire` (Confluent
framing), :mod:`.decoder` (reading messages back), :mod:`.errors`.
"""

from __future__ import annotations

from typing import Any

from cdcflow.core.data.codec import Codec
from cdcflow.core.plugin import Registrar, hookimpl
from cdcflow.plugins.codecs.avro.codec import AvroCodec, subject_prefix
from cdcflow.plugins.codecs.avro.config import AvroConfig
from cdcflow.plugins.codecs.avro.decoder import AvroDecoder, AvroMessage
from cdcflow.plugins.codecs.avro.errors import (
    AvroEncodeError,
    AvroFormatError,
    SchemaIncompatibleError,
    SchemaNotFoundError,
    SchemaRegistryError,
)
from cdcflow.plugins.codecs.avro.registry import SchemaRegistryClient

__all__ = [
    "AvroCodec",
    "AvroConfig",
    "AvroDecoder",
    "AvroEncodeError",
    "AvroFormatError",
    "AvroMessage",
    "SchemaIncompatibleError",
    "SchemaNotFoundError",
    "SchemaRegistryClient",
    "SchemaRegistryError",
    "cdcflow_register_codecs",
    "subject_prefix",
]


@hookimpl
def cdcflow_register_codecs(registry: Registrar[Codec[Any]]) -> None:
    registry.add(AvroCodec)
