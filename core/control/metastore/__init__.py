"""The metastore: one interface (:class:`MetaStore`), SQLite and etcd implementations."""

from __future__ import annotations

from urllib.parse import urlsplit

from cdcflow.core.control.metastore.base import MetaStore, MetaStoreConflictError, NotOwnerError, OwnerTerm, Session
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue

__all__ = ["MetaStore", "MetaStoreConflictError", "NotOwnerError", "OwnerTerm", "Session", "open_metastore"]


def open_metastore(url: str) -> MetaStore:
    """The metastore for ``url``: ``sqlite:///path`` or ``etcd://host:port[,host:port][/prefix]``."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        from cdcflow.core.control.metastore.sqlite import SQLiteMetaStore

        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else parts.path
        return SQLiteMetaStore(path or ":memory:")
    if parts.scheme == "etcd":
        from cdcflow.core.control.metastore.etcd import EtcdMetaStore

        endpoints = [e for e in parts.netloc.split(",") if e]
        return EtcdMetaStore(endpoints, prefix=parts.path.strip("/") or "cdcflow")
    message = f"metastore URL {url!r} must be sqlite:///path or etcd://host:port[,host:port]"
    raise ConfigInvalidError(message, [ConfigIssue(message, path="server.metastore")])
