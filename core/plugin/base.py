"""What every plugin class has in common: a stable type name and a config model.

A plugin *class* (a source, a sink, a scheduler, a codec) is registered under
its ``type_name``, the word users write as ``type:`` in ``connectors.yaml``.
It declares its configuration as a frozen pydantic model derived from
:class:`PluginConfig`; the same model feeds ``cdcflow validate``, the docs and
the REST API's validation endpoint (STYLE §8).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from cdcflow.core.plugin.manager import PluginManager

__all__ = ["TYPE_NAME_PATTERN", "Plugin", "PluginConfig", "kebab"]

#: A type name: lower-case words joined by single dashes (``two-phase``).
TYPE_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")


def kebab(name: str) -> str:
    """``max_batch_size`` → ``max-batch-size``: the spelling used in YAML and URIs."""
    return name.replace("_", "-")


class PluginConfig(BaseModel):
    """Base of every plugin configuration model.

    Fields are written in kebab-case in YAML and sink URIs (``max-batch-size``)
    and are Python attributes in snake_case (``max_batch_size``). Unknown
    fields are rejected and instances are immutable. Every field must have a
    default and a description; the plugin registry refuses a model without.
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=kebab,
        populate_by_name=True,
        use_attribute_docstrings=False,
    )


ConfigT = TypeVar("ConfigT", bound=PluginConfig)


class Plugin(Generic[ConfigT]):
    """Base of every plugin class.

    Subclasses set :attr:`type_name` and :attr:`Config`, and receive a
    validated ``Config`` instance in ``__init__``.
    """

    #: Stable name used by ``type:`` in connectors.yaml. Never change it once published.
    type_name: ClassVar[str]
    #: The configuration model.
    Config: ClassVar[type[PluginConfig]] = PluginConfig
    #: One line describing the plugin, shown by ``cdcflow plugins``.
    summary: ClassVar[str] = ""

    def __init__(self, config: ConfigT) -> None:
        self.config: ConfigT = config

    @classmethod
    def create(cls, config: PluginConfig, plugins: PluginManager | None) -> Self:
        """The instance the runtime uses for ``config`` (``PluginChoice.instantiate``).

        ``plugins`` is the plugin manager the connector was validated with. The
        default is ``cls(config)``; override it to hand the instance what it needs
        from other plugins (the tikv source takes its embedded upstream from the
        playground plugin this way). Keep ``__init__`` usable with the config
        alone, so that tests can build an instance directly.
        """
        return cls(config)  # type: ignore[arg-type]  # the registry checked that config is a cls.Config

    @classmethod
    def check_config(cls, config: PluginConfig, plugins: PluginManager) -> list[tuple[str, str]]:
        """Checks that need other plugins or the environment (a codec name, a URI).

        Returns ``(field, message)`` pairs; empty when the config is fine. Runs
        during validation, after the config model accepted the options.
        """
        return []

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """Name, summary and JSON schema of the configuration, for docs and the API."""
        return {
            "type": cls.type_name,
            "summary": cls.one_line_summary(),
            "config_schema": cls.Config.model_json_schema(by_alias=True),
        }

    @classmethod
    def one_line_summary(cls) -> str:
        """:attr:`summary`, or else the first line of the class docstring."""
        if cls.summary:
            return cls.summary
        lines = (cls.__doc__ or "").strip().splitlines()
        return lines[0] if lines else ""
