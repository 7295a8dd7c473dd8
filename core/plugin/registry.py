"""Registries of plugin classes, one per kind, keyed by ``type_name``.

Registration hooks receive a :class:`Registrar` that knows which plugin is
registering, so that every entry remembers where it came from and a conflict
names both origins (STYLE §2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic_core import PydanticUndefined

from cdcflow.core.errors import ConfigInvalidError, PluginConflictError
from cdcflow.core.plugin.base import TYPE_NAME_PATTERN, Plugin, PluginConfig

__all__ = ["PluginEntry", "PluginOrigin", "PluginRegistry", "Registrar"]

P = TypeVar("P", bound=Plugin)  # type: ignore[type-arg]


@dataclass(frozen=True, slots=True)
class PluginOrigin:
    """Where a plugin came from.

    ``kind`` is ``builtin`` (shipped in cdcflow.plugins), ``entry-point``
    (discovered from an installed distribution's ``cdcflow`` entry point) or
    ``runtime`` (registered by code, e.g. in a test).
    """

    kind: str
    name: str
    module: str
    distribution: str | None = None

    def __str__(self) -> str:
        if self.kind == "entry-point":
            dist = f" in distribution {self.distribution}" if self.distribution else ""
            return f"entry point '{self.name}'{dist} ({self.module})"
        if self.kind == "builtin":
            return f"builtin ({self.module})"
        return f"registered at runtime by {self.name} ({self.module})"


@dataclass(frozen=True, slots=True)
class PluginEntry(Generic[P]):
    """One registered plugin class and its origin."""

    kind: str
    type_name: str
    cls: type[P]
    origin: PluginOrigin


class PluginRegistry(Generic[P]):
    """All registered plugin classes of one kind (sources, sinks, …)."""

    def __init__(self, kind: str, base: type[Any]) -> None:
        self.kind = kind
        self.base = base
        self._entries: dict[str, PluginEntry[P]] = {}

    def add(self, cls: type[P], origin: PluginOrigin) -> None:
        """Register ``cls`` under its ``type_name``.

        Raises :class:`PluginConflictError` when another class already claims
        the name, naming both origins, and :class:`ConfigInvalidError` when
        the class is not a proper plugin of this kind.
        """
        self._check_class(cls, origin)
        name = cls.type_name
        existing = self._entries.get(name)
        if existing is not None:
            if existing.cls is cls:
                return
            raise PluginConflictError(
                f"two {self.kind} plugins claim type '{name}': "
                f"{existing.cls.__module__}.{existing.cls.__qualname__} from {existing.origin} "
                f"and {cls.__module__}.{cls.__qualname__} from {origin}; "
                "uninstall one of them or give one another type_name",
                detail={"kind": self.kind, "type": name},
            )
        self._entries[name] = PluginEntry(self.kind, name, cls, origin)

    def get(self, type_name: str) -> PluginEntry[P] | None:
        return self._entries.get(type_name)

    def __getitem__(self, type_name: str) -> type[P]:
        entry = self._entries.get(type_name)
        if entry is None:
            raise KeyError(type_name)
        return entry.cls

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._entries

    def __iter__(self) -> Iterator[PluginEntry[P]]:
        return iter(sorted(self._entries.values(), key=lambda e: e.type_name))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def _check_class(self, cls: type[P], origin: PluginOrigin) -> None:
        where = f"{cls.__module__}.{getattr(cls, '__qualname__', cls)} from {origin}"
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise ConfigInvalidError(
                f"{where} is registered as a {self.kind[:-1]} but does not derive from "
                f"{self.base.__module__}.{self.base.__qualname__}"
            )
        name = getattr(cls, "type_name", None)
        if not isinstance(name, str) or not TYPE_NAME_PATTERN.match(name):
            raise ConfigInvalidError(
                f"{where} has type_name {name!r}; it must be lower-case words joined by dashes, e.g. 'two-phase'"
            )
        config = cls.Config
        if not (isinstance(config, type) and issubclass(config, PluginConfig)):
            raise ConfigInvalidError(f"{where}: Config must derive from cdcflow PluginConfig")
        settings = config.model_config
        if settings.get("extra") != "forbid" or not settings.get("frozen"):
            raise ConfigInvalidError(
                f"{where}: Config {config.__qualname__} must be frozen with extra='forbid' "
                "(derive from PluginConfig and keep its model_config)"
            )
        for field_name, info in config.model_fields.items():
            if not info.description:
                raise ConfigInvalidError(
                    f"{where}: config field '{field_name}' has no description; declare it with Field(description=...)"
                )
            if info.default is PydanticUndefined and info.default_factory is None:
                raise ConfigInvalidError(
                    f"{where}: config field '{field_name}' has no default; every plugin "
                    "option needs one so that a minimal connectors.yaml works"
                )


class Registrar(Generic[P]):
    """What a registration hook receives: ``registry.add(MySink)``.

    ``origin`` answers which plugin's hook is running (the plugin manager
    knows: registration hooks are historic and run while a plugin is being
    registered), so entries record their origin without the plugin having to
    say it.
    """

    def __init__(self, registry: PluginRegistry[P], origin: Callable[[], PluginOrigin]) -> None:
        self._registry = registry
        self._origin = origin

    @property
    def kind(self) -> str:
        return self._registry.kind

    def add(self, cls: type[P]) -> None:
        """Register a plugin class under its ``type_name``."""
        self._registry.add(cls, self._origin())
