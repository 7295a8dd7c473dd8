"""What the built-in transforms share: a per-schema cache and expression checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from cdcflow.core.data.events import TableSchema
from cdcflow.core.data.expr import ExpressionError, compile_expression, parse
from cdcflow.core.errors import ConfigInvalidError

__all__ = ["check_expression", "expression_error", "per_schema"]

T = TypeVar("T")


def per_schema(
    owner: Any, schema: TableSchema | None, build: Callable[[TableSchema | None], T], slot: str = "_cache"
) -> T:
    """``build(schema)``, made once per schema object and kept on ``owner`` (in its
    attribute ``slot``, a name starting with ``_cache``: transforms do not pickle those)."""
    cache: dict[int, tuple[TableSchema | None, T]] | None = owner.__dict__.get(slot)
    if cache is None:
        cache = owner.__dict__[slot] = {}
    key = id(schema)
    hit = cache.get(key)
    if hit is not None and hit[0] is schema:
        return hit[1]
    value = build(schema)
    cache[key] = (schema, value)
    return value


def expression_error(field: str, text: str, exc: ExpressionError) -> ConfigInvalidError:
    return ConfigInvalidError(f"{field}: {exc} in {text!r}", detail={"field": field})


def check_expression(text: str, field: str) -> list[tuple[str, str]]:
    """Problems of ``text`` as a Spark SQL expression without a schema (syntax, functions)."""
    try:
        compile_expression(parse(text))
    except ExpressionError as exc:
        return [(field, f"{exc} in {text!r}")]
    return []
