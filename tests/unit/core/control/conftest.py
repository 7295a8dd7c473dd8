"""Fixtures of the control-plane tests: a metastore URL of each kind (SQLite, a real etcd)."""

from __future__ import annotations

import time

import pytest

from tests.etcd_server import EtcdServer


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.integration)])
def metastore_url(request, tmp_path):
    """A fresh metastore of each kind: a SQLite file, or a prefix of its own in the module's etcd."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/meta.db"
    server = request.getfixturevalue("etcd")
    return f"etcd://{server.endpoint}/t{time.time_ns()}"
