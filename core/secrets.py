"""Masking secrets wherever cdcflow shows a configuration: the REST API, the CLI,
logs and error messages.

There is one rule, applied by :func:`redact` (values of any shape) and
:func:`mask_text` (free text such as an error message):

- a mapping key that is secret has its value replaced by ``******``. A key is
  secret when a plugin declares the field as pydantic ``SecretStr`` (by field
  name or kebab-case alias, see :func:`secret_keys`), or when its name says so
  (``password``, ``secret``, ``token``, ``credential`` …, in any case and with
  ``-`` or ``_``);
- in a URI (``scheme://…``), the password of the user info is masked — the user
  info ends at the **last** ``@`` of the authority, so a password may itself
  hold ``@`` — and so is the value of every secret query parameter
  (``sasl-password=``, ``password=``, ``ssl-key-password=`` …); a query value
  that is itself a URI (``schema-registry=http://user:pass@host``) is masked in
  turn.

The masked form keeps the user name, the host and every other option, so an
operator can still tell what a changefeed writes to.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

from pydantic import SecretStr

__all__ = ["MASK", "is_secret_key", "mask_text", "mask_uri", "redact", "secret_keys"]

#: What a secret is replaced by.
MASK = "******"

#: Words that make a key secret wherever they appear in it.
_SECRET_WORDS = ("password", "passwd", "secret", "token", "credential", "private-key", "api-key", "basic-auth")
#: A URI in free text: scheme, ``://`` and everything up to white space or a quote.
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
#: ``key=value`` in free text (a libpq keyword DSN: ``host=h password=pw``).
_KEYWORD_IN_TEXT = re.compile(r"(?<![\w.-])([A-Za-z][\w.-]*)=([^\s&'\"]+)")

_known: tuple[int, frozenset[str]] = (-1, frozenset())


def _norm(key: str) -> str:
    return key.strip().lower().replace("_", "-").replace(".", "-")


def secret_keys() -> frozenset[str]:
    """Names (field names and kebab-case aliases, normalised to lower kebab case) of
    every plugin config field declared ``SecretStr`` (or ``SecretStr | None``)."""
    global _known
    from cdcflow.core.plugin.base import PluginConfig

    classes: list[type[Any]] = []
    pending: list[type[Any]] = [PluginConfig]
    while pending:
        cls = pending.pop()
        classes.append(cls)
        pending.extend(cls.__subclasses__())
    if _known[0] == len(classes):
        return _known[1]
    names: set[str] = set()
    for cls in classes:
        for name, info in cls.model_fields.items():
            annotation = info.annotation
            args = getattr(annotation, "__args__", ()) or ()
            if annotation is SecretStr or SecretStr in args:
                names.add(_norm(name))
                if info.alias:
                    names.add(_norm(info.alias))
    _known = (len(classes), frozenset(names))
    return _known[1]


def is_secret_key(key: object) -> bool:
    """Whether a mapping key or query parameter names a secret."""
    name = _norm(str(key))
    return any(word in name for word in _SECRET_WORDS) or name in secret_keys()


def mask_uri(uri: str) -> str:
    """``uri`` with the password of its user info and its secret query values masked."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    end = len(rest)
    for stop in ("/", "?", "#"):
        at = rest.find(stop)
        if at != -1:
            end = min(end, at)
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        if colon:
            authority = f"{user}:{MASK}@{host}"
    path, qmark, query = tail.partition("?")
    if qmark:
        query, hash_, fragment = query.partition("#")
        query = "&".join(_mask_parameter(p) for p in query.split("&")) + hash_ + fragment
    return f"{scheme}://{authority}{path}{qmark}{query}"


def _mask_parameter(parameter: str) -> str:
    key, eq, value = parameter.partition("=")
    if not eq or not value:
        return parameter
    if is_secret_key(unquote(key)):
        return f"{key}={MASK}"
    plain = unquote(value)
    if "://" in plain:
        masked = mask_uri(plain)
        if masked != plain:
            return f"{key}={quote(masked, safe=':/@*?=&')}"
    return parameter


def mask_text(text: str) -> str:
    """``text`` with every URI in it masked, and every ``key=value`` whose key is
    secret (for error messages and log lines)."""
    if "://" in text:
        text = _URI_IN_TEXT.sub(lambda m: mask_uri(m.group(0)), text)
    if "=" in text:
        text = _KEYWORD_IN_TEXT.sub(lambda m: f"{m[1]}={MASK}" if is_secret_key(m[1]) else m[0], text)
    return text


def redact(value: Any) -> Any:
    """``value`` (mappings, lists, strings) with every secret masked: the values of
    secret keys, and the secrets inside URIs. Used by everything that shows a
    changefeed's configuration."""
    if isinstance(value, dict):
        return {k: MASK if v not in (None, "") and is_secret_key(k) else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, SecretStr):
        return MASK if value.get_secret_value() else ""
    if isinstance(value, str):
        return mask_text(value)
    return value
