"""Loading and validating ``connectors.yaml``.

Everything is checked before anything starts: the YAML itself, the server
section, each connector, and each plugin section against the plugin's own
config model. Every problem becomes a :class:`~cdcflow.core.errors.ConfigIssue`
with file, line, field path and what is allowed; all of them are reported in
one :class:`~cdcflow.core.errors.ConfigInvalidError`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any, cast
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from cdcflow.core.config.settings import ConnectorSettings, ServerSettings
from cdcflow.core.config.yamlsrc import Located, Path, load_located
from cdcflow.core.data.filter import TableFilter
from cdcflow.core.data.sink import Sink
from cdcflow.core.data.source import Source
from cdcflow.core.data.transform import Transform, TransformChain, TransformConfig, TransformStep
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue
from cdcflow.core.plugin.base import Plugin, PluginConfig
from cdcflow.core.plugin.manager import PluginManager, get_plugin_manager
from cdcflow.core.plugin.registry import PluginOrigin, PluginRegistry
from cdcflow.core.secrets import is_secret_key, redact

__all__ = [
    "DEFAULT_SCHEDULER",
    "Connector",
    "Deployment",
    "PluginChoice",
    "decode_config",
    "load_deployment",
    "transform_label",
    "validate_plugin_options",
    "validate_text",
]

#: The scheduler used when a connector does not name one.
DEFAULT_SCHEDULER = "two-phase"


@dataclass(frozen=True, slots=True)
class PluginChoice:
    """A plugin selected by a config section, with its validated config."""

    kind: str
    type_name: str
    cls: type[Plugin[Any]]
    config: PluginConfig
    origin: PluginOrigin
    #: The plugin manager the choice was validated with (handed to ``Plugin.create``).
    plugins: PluginManager | None = dataclasses.field(default=None, compare=False, repr=False)

    def instantiate(self) -> Plugin[Any]:
        """A new instance of the plugin with its config (``Plugin.create``)."""
        return self.cls.create(self.config, self.plugins)


@dataclass(frozen=True, slots=True)
class Connector:
    """One validated connector."""

    settings: ConnectorSettings
    source: PluginChoice
    sinks: tuple[PluginChoice, ...]
    scheduler: PluginChoice
    #: The ``transforms:`` list, in order.
    transforms: tuple[PluginChoice, ...] = ()

    @property
    def name(self) -> str:
        return self.settings.name

    def transform_chain(self) -> TransformChain:
        """The connector's transforms, instantiated, as the pipeline applies them."""
        return TransformChain(
            [
                TransformStep(
                    transform_label(i, choice.type_name),
                    cast("Transform[Any]", choice.instantiate()),
                    TableFilter(cast("TransformConfig", choice.config).tables or ["*.*"]),
                )
                for i, choice in enumerate(self.transforms)
            ]
        )


def transform_label(index: int, type_name: str) -> str:
    """How messages name a connector's transform: ``transforms[1] (mask)``."""
    return f"transforms[{index}] ({type_name})"


@dataclass(frozen=True, slots=True)
class Deployment:
    """A validated connectors.yaml."""

    file: str
    server: ServerSettings
    connectors: tuple[Connector, ...]

    def connector(self, name: str) -> Connector:
        for c in self.connectors:
            if c.name == name:
                return c
        raise KeyError(name)


def load_deployment(
    path: str | FsPath, plugins: PluginManager | None = None, env: Mapping[str, str] | None = None
) -> Deployment:
    """Read and validate a connectors.yaml; raise ConfigInvalidError listing every issue."""
    file = str(path)
    try:
        raw = FsPath(path).read_bytes()
    except OSError as exc:
        raise ConfigInvalidError(
            f"cannot read {file}: {exc.strerror or exc}",
            [ConfigIssue(f"cannot read the file: {exc.strerror or exc}", file=file)],
        ) from exc
    text = decode_config(raw, file)
    deployment, issues = validate_text(text, file, plugins, env)
    if issues or deployment is None:
        count = len(issues)
        raise ConfigInvalidError(f"{file}: {count} problem{'s' if count != 1 else ''} found", issues)
    return deployment


def decode_config(raw: bytes, file: str) -> str:
    """The text of a configuration file, which must be UTF-8; ConfigInvalidError
    naming the line and column of the first byte that is not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        issue = ConfigIssue(
            f"byte 0x{raw[exc.start]:02x} is not UTF-8 text; save the file as UTF-8",
            file=file,
            line=line,
            column=column,
        )
        raise ConfigInvalidError(f"{file}: 1 problem found", [issue]) from None


def validate_text(
    text: str, file: str, plugins: PluginManager | None = None, env: Mapping[str, str] | None = None
) -> tuple[Deployment | None, list[ConfigIssue]]:
    """Validate YAML text; returns the deployment (None on issues) and the issues."""
    plugins = plugins or get_plugin_manager()
    doc = load_located(text, file, env)
    if doc.data is None:
        return None, doc.issues
    if not isinstance(doc.data, dict):
        doc.issues.append(doc.issue((), "the file must be a mapping with 'server' and 'connectors'"))
        return None, doc.issues
    issues = doc.issues
    unknown = sorted(set(doc.data) - {"server", "connectors"})
    for key in unknown:
        issues.append(doc.issue((key,), f"unknown section '{key}'; allowed: server, connectors"))

    server = _validate_model(ServerSettings, doc.data.get("server") or {}, ("server",), doc, issues)
    raw_connectors = doc.data.get("connectors") or []
    if not isinstance(raw_connectors, list):
        issues.append(doc.issue(("connectors",), "connectors must be a list (each item starts with '- name: ...')"))
        raw_connectors = []

    connectors: list[Connector] = []
    first_line: dict[str, int] = {}
    for index, raw in enumerate(raw_connectors):
        connector = _validate_connector(raw, ("connectors", index), doc, plugins, issues)
        if connector is None:
            continue
        pos = doc.position(("connectors", index, "name")) or (0, 0)
        if connector.name in first_line:
            issues.append(
                doc.issue(
                    ("connectors", index, "name"),
                    f"duplicate connector name '{connector.name}' (first defined on line "
                    f"{first_line[connector.name]}); names are changefeed ids and must be unique",
                )
            )
            continue
        first_line[connector.name] = pos[0]
        connectors.append(connector)

    issues.sort(key=lambda i: (i.line or 0, i.column or 0))
    if issues or server is None:
        return None, issues
    return Deployment(file, server, tuple(connectors)), issues


def _validate_connector(
    raw: Any, path: Path, doc: Located, plugins: PluginManager, issues: list[ConfigIssue]
) -> Connector | None:
    if not isinstance(raw, dict):
        issues.append(doc.issue(path, "each connector must be a mapping with name, source and sinks"))
        return None
    settings = _validate_model(ConnectorSettings, raw, path, doc, issues)
    source = _select(plugins.sources, raw.get("source"), (*path, "source"), doc, plugins, issues)
    sinks: list[PluginChoice | None] = []
    raw_sinks = raw.get("sinks")
    if isinstance(raw_sinks, list):
        for i, item in enumerate(raw_sinks):
            if isinstance(item, dict) and item.get("uri") == "" and "type" not in item:
                continue  # `uri: ${VAR:-}` makes a sink optional: left out while VAR is unset
            sinks.append(_select(plugins.sinks, item, (*path, "sinks", i), doc, plugins, issues))
    scheduler_raw = raw.get("scheduler") or {"type": DEFAULT_SCHEDULER}
    scheduler = _select(plugins.schedulers, scheduler_raw, (*path, "scheduler"), doc, plugins, issues)
    transforms = _select_transforms(raw, path, doc, plugins, issues)
    if settings is not None and source is not None and settings.initial_snapshot:
        refusal = (
            source.cls.snapshot_refusal(source.config)
            if issubclass(source.cls, Source)
            else f"the {source.type_name} source cannot take an initial snapshot"
        )
        if refusal is not None:
            issues.append(doc.issue((*path, "initial-snapshot"), f"initial-snapshot: {refusal}"))
    if settings is None or source is None or scheduler is None or any(s is None for s in sinks) or transforms is None:
        return None
    return Connector(settings, source, tuple(s for s in sinks if s is not None), scheduler, transforms)


def _select_transforms(
    raw: dict[str, Any], path: Path, doc: Located, plugins: PluginManager, issues: list[ConfigIssue]
) -> tuple[PluginChoice, ...] | None:
    """The connector's transforms (None when one is invalid); each issue names the
    connector and the transform besides its field and line."""
    items = raw.get("transforms")
    if not isinstance(items, list):
        return ()  # absent, or not a list: the connector model reports it
    name = raw.get("name")
    chosen: list[PluginChoice] = []
    valid = True
    for i, item in enumerate(items):
        before = len(issues)
        choice = _select(plugins.transforms, item, (*path, "transforms", i), doc, plugins, issues)
        type_name = item.get("type") if isinstance(item, dict) else None
        label = transform_label(i, str(type_name or "?"))
        if choice is not None and len(issues) == before:
            try:
                choice.instantiate()
            except ConfigInvalidError as exc:
                field = str(exc.detail.get("field", ""))
                where = (*path, "transforms", i, field) if field else (*path, "transforms", i)
                issues.append(doc.issue(where, exc.message))
        for issue in issues[before:]:
            issue.message = f"connector {name}, {label}: {issue.message}"
        if choice is None or len(issues) > before:
            valid = False
        else:
            chosen.append(choice)
    return tuple(chosen) if valid else None


def _select(
    registry: PluginRegistry[Any],
    raw: Any,
    path: Path,
    doc: Located,
    plugins: PluginManager,
    issues: list[ConfigIssue],
) -> PluginChoice | None:
    """Pick the plugin a section names and validate its options."""
    singular = registry.kind[:-1]
    if raw is None:
        return None  # the connector model reports the missing section
    if not isinstance(raw, dict):
        issues.append(doc.issue(path, f"the {singular} must be a mapping with 'type' and its options"))
        return None
    type_name = raw.get("type")
    uri = raw.get("uri") if issubclass(registry.base, Sink) else None
    if type_name is None and isinstance(uri, str):
        type_name = _type_for_scheme(registry, uri, path, doc, issues)
        if type_name is None:
            return None
    if type_name is None:
        allowed = ", ".join(registry.names()) or "none installed"
        hint = " or a 'uri'" if registry.base is Sink else ""
        issues.append(doc.issue(path, f"missing 'type'{hint}; {singular} types: {allowed}"))
        return None
    entry = registry.get(str(type_name))
    if entry is None:
        allowed = ", ".join(registry.names()) or "none installed"
        issues.append(
            doc.issue(
                (*path, "type"),
                f"unknown {singular} type '{type_name}'; known: {allowed} (`cdcflow plugins` lists installed plugins)",
            )
        )
        return None
    try:
        options, from_uri = _options(entry.cls, raw, uri, path, doc, issues)
    except ValueError as exc:  # urlsplit: an unclosed '[', a port that is not a number
        issues.append(doc.issue((*path, "uri"), f"not a valid URI: {exc}"))
        return None
    config = validate_plugin_options(entry.cls, options, path, doc, issues, from_uri=from_uri)
    if config is None:
        return None
    try:
        checked = entry.cls.check_config(config, plugins)
    except ConfigInvalidError as exc:
        checked = [("uri" if uri is not None else "", exc.message)]
    except ValueError as exc:
        checked = [("uri" if uri is not None else "", f"not a valid URI or option: {exc}")]
    for field, message in checked:
        # A nested field is given as a dotted path: routes.0.source.
        parts = tuple(int(p) if p.isdigit() else p for p in field.split(".")) if field else ()
        issues.append(doc.issue((*path, *parts), message))
    return PluginChoice(registry.kind, entry.type_name, entry.cls, config, entry.origin, plugins)


def _options(
    cls: type[Plugin[Any]], raw: dict[str, Any], uri: Any, path: Path, doc: Located, issues: list[ConfigIssue]
) -> tuple[dict[str, Any], set[str]]:
    """The section's options with the uri's query options merged in."""
    options = {k: v for k, v in raw.items() if k != "type"}
    from_uri: set[str] = set()
    if not (isinstance(uri, str) and issubclass(cls, Sink)):
        return options, from_uri
    for key, value in cls.options_from_uri(uri).items():
        if key == "uri":
            continue
        if key in options:
            issues.append(doc.issue((*path, key), f"'{key}' is given both here and in the uri; give it once"))
            continue
        options[key] = value
        from_uri.add(key)
    if "uri" not in {info.alias or name for name, info in cls.Config.model_fields.items()}:
        options.pop("uri", None)  # fully expanded into options above
    return options, from_uri


def _type_for_scheme(
    registry: PluginRegistry[Any], uri: str, path: Path, doc: Located, issues: list[ConfigIssue]
) -> str | None:
    try:
        scheme = urlsplit(uri).scheme.lower()
    except ValueError as exc:
        issues.append(doc.issue((*path, "uri"), f"not a valid URI: {exc}"))
        return None
    schemes: dict[str, str] = {}
    for entry in registry:
        for s in getattr(entry.cls, "uri_schemes", ()):
            schemes[s] = entry.type_name
    if scheme in schemes:
        return schemes[scheme]
    known = ", ".join(f"{s}://" for s in sorted(schemes)) or "none"
    issues.append(doc.issue((*path, "uri"), f"no sink handles URI scheme '{scheme}://'; known: {known}"))
    return None


def validate_plugin_options(
    cls: type[Plugin[Any]],
    options: Mapping[str, Any],
    path: Path,
    doc: Located,
    issues: list[ConfigIssue],
    *,
    from_uri: set[str] | None = None,
) -> PluginConfig | None:
    """Validate ``options`` with ``cls.Config``; issues are located under ``path``."""
    return _validate_model(cls.Config, dict(options), path, doc, issues, from_uri=from_uri or set())


M = typing.TypeVar("M", bound=BaseModel)


def _validate_model(
    model: type[M],
    data: Any,
    path: Path,
    doc: Located,
    issues: list[ConfigIssue],
    *,
    from_uri: set[str] | None = None,
) -> M | None:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            issues.append(_issue_for(model, err, loc, path, doc, from_uri or set()))
        return None


def _issue_for(
    model: type[BaseModel], err: Any, loc: tuple[Any, ...], path: Path, doc: Located, from_uri: set[str]
) -> ConfigIssue:
    kind = err["type"]
    full: Path = (*path, *loc)
    if kind == "extra_forbidden":
        allowed = ", ".join(_field_names(_model_at(model, loc[:-1]))) or "none"
        message = f"unknown field '{loc[-1]}'; allowed: {allowed}"
    elif kind == "missing":
        message = "required field is missing"
    else:
        message = err["msg"]
        if kind == "value_error":
            message = message.removeprefix("Value error, ")
        elif "input" in err and not isinstance(err["input"], dict | list) and not (loc and is_secret_key(loc[-1])):
            message += f" (got {redact(err['input'])!r})"
    if loc and loc[0] in from_uri:
        full = (*path, "uri")
        message = f"in the uri, '{loc[0]}': {message}"
    return doc.issue(full, message)


def _field_names(model: type[BaseModel] | None) -> list[str]:
    if model is None:
        return []
    return sorted((info.alias or name) for name, info in model.model_fields.items())


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the value at ``loc`` below ``model``."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            current = _item_type(current)
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = next((info for name, info in current.model_fields.items() if part in (name, info.alias)), None)
        if field is None:
            return None
        current = _unwrap(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else annotation
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return annotation


def _item_type(annotation: Any) -> Any:
    args = typing.get_args(_unwrap(annotation))
    return _unwrap(args[0]) if args else None
