"""Is there a Docker engine, and which kind of server does a fixture start?

:func:`docker_available` answers once per process (an engine that answers a
ping); :func:`choose_backend` turns that answer and the user's preference into
``"container"`` or ``"local"`` and logs the choice, with the reason, on the
``cdcflow.testing`` logger, so a test run says what it ran against.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Literal

__all__ = ["BACKEND_ENV", "Backend", "choose_backend", "docker_available"]

log = logging.getLogger("cdcflow.testing")

Backend = Literal["container", "local"]

#: ``auto`` (the default: a container when Docker answers), ``container`` or ``local``.
BACKEND_ENV = "CDCFLOW_TEST_BACKEND"


@functools.cache
def docker_available() -> bool:
    """True when a Docker engine answers a ping (``DOCKER_HOST`` or the default socket)."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means "no usable engine here"
        return False
    return True


def choose_backend(server: str, preference: str | None = None, *, container_possible: bool = True) -> Backend:
    """``"container"`` or ``"local"`` for ``server`` (a name for the log), logged with the reason.

    ``preference`` is ``auto``, ``container`` or ``local`` (default: the ``CDCFLOW_TEST_BACKEND``
    environment variable, else ``auto``); ``container`` without an engine is an error, not a
    silent fallback. ``container_possible=False`` is a server that only runs locally.
    """
    wanted = (preference or os.environ.get(BACKEND_ENV) or "auto").lower()
    if wanted not in ("auto", "container", "local"):
        raise ValueError(f"{BACKEND_ENV}={wanted!r}: expected auto, container or local")
    if wanted == "local":
        log.info("%s: local server (%s=local)", server, BACKEND_ENV)
        return "local"
    if not container_possible:
        log.info("%s: local server (no container flavour: it must run this machine's Python environment)", server)
        return "local"
    if docker_available():
        log.info("%s: testcontainers container (a Docker engine answered)", server)
        return "container"
    if wanted == "container":
        raise RuntimeError(
            f"{server}: {BACKEND_ENV}=container but no Docker engine answers (DOCKER_HOST, /var/run/docker.sock)"
        )
    log.info("%s: local server (no Docker engine answered: the local fallback)", server)
    return "local"
