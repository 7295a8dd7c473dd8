"""YAML that remembers where every value came from.

``connectors.yaml`` errors must name the file, the line and the field path
(STYLE §8). PyYAML's plain loaders forget positions, so this module composes
the node graph and builds Python values itself, recording the line and column
of every mapping key and value by path. It also rejects duplicate keys (plain
YAML silently keeps the last) and expands ``${ENV}`` references.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from cdcflow.core.errors import ConfigIssue

__all__ = ["Located", "Path", "format_path", "load_located"]

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


class _Builder:
    def __init__(self, doc: Located, env: Mapping[str, str]) -> None:
        self.doc = doc
        self.env = env

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.doc.positions.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        return self._scalar(node, path)

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
        value = loader.construct_object(node, deep=True)
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


def load_located(text: str, file: str, env: Mapping[str, str] | None = None) -> Located:
    """Parse ``text`` as one YAML document, recording positions and issues.

    A syntax error becomes a single issue at its line; the data is then None.
    """
    doc = Located(data=None, file=file)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
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
    except yaml.YAMLError as exc:
        doc.issues.append(ConfigIssue(f"not valid YAML: {exc}", file=file))
        return doc
    if node is None:
        doc.data = {}
        return doc
    doc.data = _Builder(doc, os.environ if env is None else env).build(node, ())
    return doc
