"""An example transform plugin: e-mail addresses → their domain.

Two ways to use it from connectors.yaml, once installed:

* as its own transform type (registered below through the entry point)::

      transforms:
        - type: redact-email
          tables: ["shop.customers"]
          column: email

* as a function of the built-in ``python`` transform::

      transforms:
        - type: python
          function: "cdcflow_redact:domains"
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from cdcflow.core.data.events import RowChange
from cdcflow.core.data.transform import Transform, TransformConfig
from cdcflow.core.plugin.hookspec import hookimpl


def _domain(value: Any) -> Any:
    return value.partition("@")[2] if isinstance(value, str) else value


def domains(batch: pa.RecordBatch) -> pa.RecordBatch:
    """For the ``python`` transform: keep only the domain of the ``email`` column."""
    if "email" not in batch.schema.names:
        return batch
    index = batch.schema.get_field_index("email")
    domain = pc.replace_substring_regex(batch.column(index), pattern=r"^[^@]*@", replacement="")
    return batch.set_column(index, "email", domain)


class RedactConfig(TransformConfig):
    column: str = Field("email", description="The column holding e-mail addresses.")


class RedactEmail(Transform[RedactConfig]):
    """Replace e-mail addresses by their domain."""

    type_name = "redact-email"
    Config = RedactConfig

    def apply(self, rows: list[RowChange]) -> list[RowChange]:
        name = self.config.column

        def redact(image: Any) -> Any:
            return None if image is None or name not in image else {**image, name: _domain(image[name])}

        return [
            dataclasses.replace(r, after=redact(r.after) or r.after, before=redact(r.before) or r.before) for r in rows
        ]


@hookimpl
def cdcflow_register_transforms(registry: Any) -> None:
    registry.add(RedactEmail)
