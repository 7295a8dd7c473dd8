"""Making many instances of a frozen dataclass quickly.

A frozen dataclass's ``__init__`` sets each field with ``object.__setattr__`` by
name, to get past the class's own ``__setattr__``, which refuses. On the pipeline's
per-row path (a raw event, its row, and the row's encoded parts are frozen
dataclasses: several per row) that is about 0.8 µs per instance of seven fields.
:func:`frozen_maker` gives a function that makes the same instance by setting the
slots through their descriptors: about half the time, and the instance is the
class's own, frozen, equal and hashed as ``cls(...)`` would make it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["frozen_maker"]

T = TypeVar("T")


def frozen_maker(cls: type[T]) -> Callable[..., T]:
    """A function taking ``cls``'s fields as ``cls(...)`` does (positionally or by name,
    with their defaults) and returning the instance ``cls(...)`` would. For a frozen
    dataclass with ``slots=True``, without ``__post_init__``, whose fields are all set
    by ``__init__`` and have no default factory (nor a name the maker's code uses:
    ``self``, ``_new``, ``_cls``, ``_set_*``, ``_default_*``); anything else is refused
    (TypeError)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__qualname__}: not a frozen dataclass with slots")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__qualname__}: has __post_init__, which the maker would skip")
    fields = dataclasses.fields(cast(Any, cls))
    taken = [f.name for f in fields if f.name in ("self", "_new", "_cls") or f.name.startswith(("_set_", "_default_"))]
    if taken:
        raise TypeError(f"{cls.__qualname__}: field names the maker uses itself: {', '.join(taken)}")
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    signature: list[str] = []
    for f in fields:
        if not f.init or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__qualname__}.{f.name}: not a plain __init__ field")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is dataclasses.MISSING:
            signature.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            signature.append(f"{f.name}=_default_{f.name}")
    body = "".join(f"    _set_{f.name}(self, {f.name})\n" for f in fields)
    source = f"def make({', '.join(signature)}):\n    self = _new(_cls)\n{body}    return self\n"
    exec(compile(source, f"<frozen_maker {cls.__qualname__}>", "exec"), namespace)  # built from field names
    maker: Callable[..., T] = namespace["make"]
    maker.__qualname__ = maker.__name__ = f"make_{cls.__name__}"
    maker.__doc__ = f"{cls.__qualname__}(...), without its frozen __init__'s per-field setattr."
    return maker
