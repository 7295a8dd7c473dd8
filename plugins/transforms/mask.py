"""``mask``: hash or null out columns.

``method: hash`` replaces each value by the hex SHA-256 of a salt and the
value (its text; bytes as they are), so equal values stay equal — across
batches, restarts and tables — and can still be joined on, while the value
cannot be read back without the salt. The salt is read from the environment
variable ``salt-env`` (default ``CDCFLOW_MASK_SALT``) of the process that
starts the changefeed, which must set it; it travels to Spark tasks with the
batch. A hashed column becomes ``char(64)`` downstream. NULL stays NULL.

``method: null`` replaces every value by NULL (the column becomes nullable
downstream). Key columns can be hashed, not nulled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Literal

from pydantic import Field

from cdcflow.core.data.events import ColumnInfo, RowChange, TableSchema
from cdcflow.core.data.expr import _text
from cdcflow.core.data.transform import Transform, TransformConfig
from cdcflow.core.data.types import TypeCode
from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.plugin.base import PluginConfig
from cdcflow.core.plugin.hookspec import hookimpl
from cdcflow.core.plugin.manager import PluginManager
from cdcflow.core.plugin.registry import Registrar
from cdcflow.plugins.transforms._common import per_schema

__all__ = ["DEFAULT_SALT_ENV", "MaskConfig", "MaskTransform", "mask_value"]

#: The environment variable the salt is read from, by default.
DEFAULT_SALT_ENV = "CDCFLOW_MASK_SALT"


class MaskConfig(TransformConfig):
    columns: list[str] = Field(default_factory=list, description="Columns to mask (required).")
    method: Literal["hash", "null"] = Field("hash", description="hash: salted SHA-256 (hex); null: NULL.")
    salt_env: str = Field(
        DEFAULT_SALT_ENV, description="Environment variable holding the salt of method hash (must be set)."
    )


def mask_value(value: Any, salt: bytes) -> str | None:
    """The hex SHA-256 of ``salt`` and ``value`` (NULL stays NULL)."""
    if value is None:
        return None
    data = value if isinstance(value, bytes) else _text(value).encode()
    return hashlib.sha256(salt + b"\0" + data).hexdigest()


class MaskTransform(Transform[MaskConfig]):
    """Hash (salted SHA-256) or null out columns."""

    type_name = "mask"
    Config = MaskConfig

    def __init__(self, config: MaskConfig, salt: bytes | None = None) -> None:
        super().__init__(config)
        if salt is None and config.method == "hash":
            value = os.environ.get(config.salt_env)
            if not value:
                raise ConfigInvalidError(
                    f"mask: environment variable {config.salt_env} (salt-env) is not set; set it to the salt "
                    "(the same value for as long as masked values must stay comparable)",
                    detail={"field": "salt-env"},
                )
            salt = value.encode()
        self.salt = salt or b""

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        assert isinstance(config, MaskConfig)
        problems = []
        if not config.columns:
            problems.append(("columns", "name the columns to mask"))
        if config.method == "hash" and not os.environ.get(config.salt_env):
            problems.append(("salt-env", f"environment variable {config.salt_env} is not set; it holds the salt"))
        return problems

    def _targets(self, schema: TableSchema | None) -> tuple[str, ...]:
        def build(s: TableSchema | None) -> tuple[str, ...]:
            wanted = {c.lower() for c in self.config.columns}
            if s is None:
                return tuple(self.config.columns)
            found = tuple(c.name for c in s.columns if c.name.lower() in wanted)
            missing = wanted - {n.lower() for n in found}
            if missing:
                raise ConfigInvalidError(
                    f"columns: unknown column(s) {', '.join(sorted(missing))}; the table has: "
                    + ", ".join(c.name for c in s.columns),
                    detail={"field": "columns"},
                )
            if self.config.method == "null":
                keys = [k for k in s.handle_key_columns() if k in found]
                if keys:
                    raise ConfigInvalidError(
                        f"columns: {', '.join(keys)} is a key column; it can be hashed, not nulled",
                        detail={"field": "columns"},
                    )
            return found

        return per_schema(self, schema, build)

    def schema(self, schema: TableSchema) -> TableSchema:
        targets = set(self._targets(schema))
        hashed = self.config.method == "hash"
        columns = []
        for c in schema.columns:
            if c.name not in targets:
                columns.append(c)
            elif hashed:
                columns.append(
                    ColumnInfo(
                        c.name,
                        int(TypeCode.VARCHAR),
                        (c.flags & ~(ColumnInfo.BINARY | ColumnInfo.UNSIGNED)),
                        "char(64)",
                        c.nullable,
                        None,
                    )
                )
            else:
                columns.append(dataclasses.replace(c, nullable=True, flags=c.flags | ColumnInfo.NULLABLE))
        return dataclasses.replace(schema, columns=tuple(columns))

    def _out_schema(self, schema: TableSchema | None) -> TableSchema | None:
        return None if schema is None else self.schema(schema)

    def apply(self, rows: list[RowChange]) -> list[RowChange]:
        out: list[RowChange] = []
        hashed = self.config.method == "hash"
        salt = self.salt
        current: Any = object()
        targets: tuple[str, ...] = ()
        new_schema: TableSchema | None = None
        for row in rows:
            if row.schema is not current:
                current = row.schema
                targets = self._targets(row.schema)
                new_schema = per_schema(self, row.schema, self._out_schema, "_cache_out")
            after = dict(row.after) if row.after is not None else None
            before = dict(row.before) if row.before is not None else None
            for image in (after, before):
                if image is None:
                    continue
                for name in targets:
                    if name in image:
                        image[name] = mask_value(image[name], salt) if hashed else None
            out.append(dataclasses.replace(row, after=after, before=before, schema=new_schema))
        return out


@hookimpl
def cdcflow_register_transforms(registry: Registrar[Transform[Any]]) -> None:
    registry.add(MaskTransform)
