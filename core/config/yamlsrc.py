"""YAML that remembers where every value came from.

``connectors.yaml`` errors must name the file, the line and the field path
(STYLE §8). PyYAML's plain loaders forget positions, so this module composes
the node graph and builds Python values itself, recording the line and column
of every mapping key and value by path. It also rejects duplicate keys (plain
YAML silently keeps the last) and expands ``${ENV}`` references.

Anchors and aliases are allowed, within bounds that a hostile file cannot
stretch: an alias that refers to a node containing itself is refused, the
document may expand to at most :data:`MAX_NODES` values (aliases counted each
time they are expanded: nine nested levels of nine aliases, "billion laughs",
are refused at once instead of filling the memory) and may nest at most
:data:`MAX_DEPTH` levels. Each refusal is an issue at the line of the alias or
of the value where the bound was reached.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from cdcflow.core.errors import ConfigIssue

__all__ = ["MAX_DEPTH", "MAX_NODES", "Located", "Path", "format_path", "load_located"]

#: Values (mappings, lists and scalars, each alias counted every time it is expanded)
#: a document may hold; a connectors.yaml of hundreds of connectors holds far fewer.
MAX_NODES = 100_000
#: Levels of nesting a document may have.
MAX_DEPTH = 64

#: A path into the document: mapping keys and sequence indexes.
Path = tuple[str | int, ...]

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def format_path(path: Path) -> str:
    """``('connectors', 0, 'sinks', 1, 'uri')`` → ``connectors[0].sinks[1].uri``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


@dataclass
class Located:
    """A parsed document and the position (1-based line, column) of each path."""

    data: Any
    file: str
    positions: dict[Path, tuple[int, int]] = field(default_factory=dict)
    issues: list[ConfigIssue] = field(default_factory=list)

    def position(self, path: Path) -> tuple[int, int] | None:
        """The position of ``path`` or of its nearest ancestor that exists."""
        probe = tuple(path)
        while True:
            if probe in self.positions:
                return self.positions[probe]
            if not probe:
                return None
            probe = probe[:-1]

    def issue(self, path: Path, message: str) -> ConfigIssue:
        """A ConfigIssue located at ``path`` (or its nearest ancestor)."""
        pos = self.position(path)
        line, col = pos if pos else (None, None)
        return ConfigIssue(message, file=self.file, line=line, column=col, path=format_path(path))


class _TooLarge(Exception):
    """The document expands past MAX_NODES: building stops at once."""


class _Builder:
    def __init__(self, doc: Located, env: Mapping[str, str]) -> None:
        self.doc = doc
        self.env = env
        self.count = 0
        #: Ids of the collection nodes being built (an alias to one of them is a cycle).
        self.open: set[int] = set()

    def _problem(self, node: yaml.Node, path: Path, message: str) -> None:
        self.doc.issues.append(
            ConfigIssue(
                message,
                file=self.doc.file,
                line=node.start_mark.line + 1,
                column=node.start_mark.column + 1,
                path=format_path(path),
            )
        )

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.doc.positions.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        self.count += 1
        if self.count > MAX_NODES:
            self._problem(
                node,
                path,
                f"the document expands to more than {MAX_NODES} values (anchors and aliases nested "
                "inside each other multiply); write the values out or use fewer nested aliases",
            )
            raise _TooLarge
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if id(node) in self.open:
            self._problem(
                node,
                path,
                f"an alias here refers to the anchored value of line {node.start_mark.line + 1}, which contains "
                "it (a cycle); an alias must refer to a value outside itself",
            )
            return None
        if len(path) > MAX_DEPTH:
            self._problem(node, path, f"values are nested more than {MAX_DEPTH} levels deep")
            return None
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            assert isinstance(node, yaml.SequenceNode)
            return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
        finally:
            self.open.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = self._scalar(key_node, path) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str | int | float | bool) or key is None:
                self.doc.issues.append(
                    ConfigIssue(
                        "mapping keys must be plain words",
                        file=self.doc.file,
                        line=key_node.start_mark.line + 1,
                        column=key_node.start_mark.column + 1,
                        path=format_path(path),
                    )
                )
                continue
            key = str(key)
            child = (*path, key)
            line = key_node.start_mark.line + 1
            if key in seen:
                self.doc.issues.append(
                    ConfigIssue(
                        f"duplicate key '{key}' (first given on line {seen[key]}); give each key once",
                        file=self.doc.file,
                        line=line,
                        column=key_node.start_mark.column + 1,
                        path=format_path(child),
                    )
                )
                continue
            seen[key] = line
            self.doc.positions[child] = (line, key_node.start_mark.column + 1)
            out[key] = self.build(value_node, child)
        return out

    def _scalar(self, node: yaml.ScalarNode, path: Path) -> Any:
        loader = yaml.SafeLoader("")
        try:
            value = loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # a tag SafeLoader does not know (!!python/...)
            self._problem(node, path, f"not a plain value: {getattr(exc, 'problem', None) or exc}")
            return None
        except (ValueError, TypeError, OverflowError) as exc:  # 2001-13-45, !!float 'x', !!int 'x'
            self._problem(node, path, f"{node.value!r} is not a valid {node.tag.rsplit(':', 1)[-1]}: {exc}")
            return None
        if isinstance(value, str) and "${" in value:
            value = self._expand(value, node, path)
        return value

    def _expand(self, text: str, node: yaml.ScalarNode, path: Path) -> str:
        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in self.env:
                return self.env[name]
            if default is not None:
                return default
            self.doc.issues.append(
                ConfigIssue(
                    f"environment variable {name} is not set; export it or write "
                    f"${{{name}:-default}} to give a default",
                    file=self.doc.file,
                    line=node.start_mark.line + 1,
                    column=node.start_mark.column + 1,
                    path=format_path(path),
                )
            )
            return ""

        return _ENV_REF.sub(substitute, text)


def _too_deep(text: str) -> tuple[int, int] | None:
    """Where the text nests deeper than MAX_DEPTH, read as events (PyYAML's composer
    recurses per level and would end in a RecursionError): 0-based line and column."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                return (mark.line, mark.column) if mark is not None else (0, 0)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


def load_located(text: str, file: str, env: Mapping[str, str] | None = None) -> Located:
    """Parse ``text`` as one YAML document, recording positions and issues.

    A syntax error becomes a single issue at its line; the data is then None.
    """
    doc = Located(data=None, file=file)
    try:
        deep = _too_deep(text)
        if deep is not None:
            doc.issues.append(
                ConfigIssue(
                    f"values are nested more than {MAX_DEPTH} levels deep; flatten the document",
                    file=file,
                    line=deep[0] + 1,
                    column=deep[1] + 1,
                )
            )
            return doc
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        doc.issues.append(
            ConfigIssue(f"not valid YAML: values are nested more than {MAX_DEPTH} levels deep", file=file)
        )
        return doc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        doc.issues.append(
            ConfigIssue(
                f"not valid YAML: {exc.problem or exc}",
                file=file,
                line=mark.line + 1 if mark else None,
                column=mark.column + 1 if mark else None,
            )
        )
        return doc
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (a control character)
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        doc.issues.append(
            ConfigIssue(
                f"not valid YAML: character {exc.character!r} is not allowed in a YAML file; remove it",
                file=file,
                line=line,
                column=column,
            )
        )
        return doc
    except yaml.YAMLError as exc:
        doc.issues.append(ConfigIssue(f"not valid YAML: {exc}", file=file))
        return doc
    if node is None:
        doc.data = {}
        return doc
    try:
        doc.data = _Builder(doc, os.environ if env is None else env).build(node, ())
    except _TooLarge:
        doc.data = None
    return doc
