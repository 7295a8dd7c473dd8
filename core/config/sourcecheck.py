"""A connector's transforms checked against its source's tables, when the source answers.

``cdcflow validate`` and ``POST /api/v2/verify_config`` check each transform's
options on their own (:mod:`cdcflow.core.config.loader`); whether a column a
transform names exists, and whether a route sends tables of different columns
into one table, depends on the upstream. This module asks the source: it opens
it, lists the tables the connector's filter replicates and their schemas now,
and runs :meth:`~cdcflow.core.data.transform.TransformChain.check` over them.

A source that cannot be reached within the timeout (or whose upstream only
exists while ``cdcflow run`` runs: the tikv source's embedded playground) is not
an error: the result carries a note saying the columns were not checked, and
the changefeed checks them itself when it starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdcflow.core.config.yamlsrc import Located, format_path
from cdcflow.core.data.events import TableSchema
from cdcflow.core.data.source import Source
from cdcflow.core.errors import CdcflowError, ConfigIssue

if TYPE_CHECKING:
    from cdcflow.core.config.loader import Connector

__all__ = ["DEFAULT_SOURCE_TIMEOUT", "SourceCheck", "check_transforms", "source_issues", "upstream_is_embedded"]

log = logging.getLogger(__name__)

#: Seconds the source gets to open and list its tables and schemas.
DEFAULT_SOURCE_TIMEOUT = 10.0


@dataclass(frozen=True)
class SourceCheck:
    """What the source's schemas say about a connector's transforms."""

    #: ``(transform index, field, message)`` per problem.
    problems: list[tuple[int, str, str]] = field(default_factory=list)
    #: Why the columns were not checked (None: they were, or there are no transforms).
    note: str | None = None
    #: Tables whose schemas were checked.
    tables: int = 0


def upstream_is_embedded(connector: Connector) -> bool:
    """Whether the connector reads an upstream started inside the capture's process (a
    source's ``playground`` option): one that exists only while the process runs."""
    embedded = getattr(connector.source.config, "embedded_playground", None)
    return callable(embedded) and embedded() is not None


async def check_transforms(connector: Connector, timeout: float = DEFAULT_SOURCE_TIMEOUT) -> SourceCheck:
    """Check ``connector``'s transforms against its source's tables as they are now."""
    if not connector.transforms:
        return SourceCheck()
    unchecked = f"connector {connector.name}: transform columns and routes were not checked against the source"
    if upstream_is_embedded(connector):
        return SourceCheck(note=f"{unchecked}: its upstream is the embedded playground, which starts with the capture")
    try:
        schemas = await asyncio.wait_for(_schemas(connector), timeout)
    except TimeoutError:
        return SourceCheck(note=f"{unchecked}: it did not answer within {timeout:g} s")
    except NotImplementedError as exc:
        return SourceCheck(note=f"{unchecked}: {exc}")
    except CdcflowError as exc:
        return SourceCheck(note=f"{unchecked}: {exc.message}")
    except Exception as exc:  # noqa: BLE001 - any failure to reach it is a note, never an error
        return SourceCheck(note=f"{unchecked}: cannot reach it ({type(exc).__name__}: {exc})")
    chain = connector.transform_chain()
    index = {step.label: i for i, step in enumerate(chain.steps)}
    problems = [(index[label], name, message) for label, name, message in chain.check(schemas)]
    return SourceCheck(problems, tables=len(schemas))


async def _schemas(connector: Connector) -> list[TableSchema]:
    source: Source[Any] = connector.source.instantiate()  # type: ignore[assignment]
    replicated = connector.settings.filter.table_filter()
    await source.open()
    try:
        ts = await source.current_ts()
        seen: dict[tuple[str, str], TableSchema] = {}
        tables: Sequence[Any] = await source.list_tables()
        for table in tables:
            key = (table.schema, table.table)
            if key in seen or not replicated.matches(table.schema, table.table):
                continue
            seen[key] = await source.table_schema(table, ts)
        return list(seen.values())
    finally:
        try:
            await source.close()
        except Exception:  # closing what could not be used
            log.debug("closing the source after the transform check failed", exc_info=True)


def source_issues(connector: Connector, check: SourceCheck, doc: Located | None, index: int = 0) -> list[ConfigIssue]:
    """``check``'s problems as issues naming the connector, the transform and the field:
    located in ``doc`` (connector ``index`` of a connectors.yaml), else by path within the
    connector (a request body)."""
    from cdcflow.core.config.loader import transform_label

    issues = []
    for i, name, message in check.problems:
        text = f"connector {connector.name}, {transform_label(i, connector.transforms[i].type_name)}: {message}"
        parts = tuple(int(p) if p.isdigit() else p for p in name.split(".")) if name else ()
        path = ("transforms", i, *parts)
        if doc is not None:
            issues.append(doc.issue(("connectors", index, *path), text))
        else:
            issues.append(ConfigIssue(text, path=format_path(path)))
    return issues
