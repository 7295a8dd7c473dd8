"""librdkafka's built-in mock cluster, started in-process (``kafka://mock``).

Why ctypes: the mock cluster auto-creates a topic on first use with a fixed
4 partitions, and it answers no CreateTopics/CreatePartitions request, so an
AdminClient cannot give a topic ``partition-num`` partitions. librdkafka's C
API has ``rd_kafka_mock_topic_create`` for exactly that, but confluent-kafka
does not wrap it; its wheels bundle librdkafka as a shared library, which
ctypes loads. A librdkafka handle created here owns the cluster
(``rd_kafka_mock_cluster_new``); any client (in this process or another) reaches it at
:attr:`MockCluster.bootstrap_servers` while the handle lives.

One cluster per broker count is shared by the whole process and lives until
:func:`shutdown_mock_clusters` (tests) or process exit: sinks come and go
(a replayed batch reopens the sink) but what they wrote must stay readable.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from typing import Any

from cdcflow.core.errors import DownstreamUnavailableError, NotAvailableError

__all__ = ["MockCluster", "mock_cluster", "shutdown_mock_clusters"]

_RD_KAFKA_PRODUCER = 0
#: rd_kafka_resp_err_t TOPIC_ALREADY_EXISTS.
_TOPIC_ALREADY_EXISTS = 36

_lib: Any = None
_lock = threading.Lock()
_clusters: dict[int, MockCluster] = {}


def _librdkafka() -> Any:
    """The librdkafka shared library bundled with confluent-kafka (or the system one)."""
    global _lib
    if _lib is not None:
        return _lib
    import confluent_kafka

    here = os.path.dirname(confluent_kafka.__file__)
    candidates = sorted(glob.glob(os.path.join(here, "..", "confluent_kafka.libs", "librdkafka*.so*")))
    candidates += sorted(glob.glob(os.path.join(here, ".dylibs", "librdkafka*.dylib")))
    candidates += ["librdkafka.so.1"]
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as exc:
            errors.append(f"{path}: {exc}")
    else:
        raise NotAvailableError("librdkafka shared library not found for the mock cluster: " + "; ".join(errors))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.restype = ctypes.c_int
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_mock_broker_set_down.restype = ctypes.c_int
    lib.rd_kafka_mock_broker_set_down.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_up.restype = ctypes.c_int
    lib.rd_kafka_mock_broker_set_up.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    _lib = lib
    return lib


class MockCluster:
    """An in-process mock Kafka cluster of ``brokers`` brokers (ids 1..brokers)."""

    def __init__(self, brokers: int) -> None:
        lib = _librdkafka()
        self.brokers = brokers
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # log_level 3: the handle has no bootstrap.servers of its own, which librdkafka warns about.
        for name, value in (("log_level", "3"),):
            if lib.rd_kafka_conf_set(conf, name.encode(), value.encode(), errstr, len(errstr)) != 0:
                raise NotAvailableError(f"librdkafka refused {name}={value}: {errstr.value.decode()}")
        handle = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not handle:
            raise NotAvailableError(f"librdkafka could not start a mock cluster: {errstr.value.decode()}")
        self._handle: int | None = handle
        self._cluster = lib.rd_kafka_mock_cluster_new(handle, brokers)
        if not self._cluster:
            lib.rd_kafka_destroy(handle)
            raise NotAvailableError(f"librdkafka could not start a mock cluster of {brokers} brokers")
        self.bootstrap_servers: str = lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    def create_topic(self, topic: str, partitions: int, replication_factor: int) -> bool:
        """Create ``topic``; False when it exists already. Replication is capped at the broker count."""
        code = _librdkafka().rd_kafka_mock_topic_create(
            self._cluster, topic.encode(), partitions, min(replication_factor, self.brokers)
        )
        if code == _TOPIC_ALREADY_EXISTS:
            return False
        if code != 0:
            raise DownstreamUnavailableError(f"mock cluster could not create topic {topic!r} (error {code})")
        return True

    def set_broker_down(self, broker_id: int, down: bool = True) -> None:
        """Make a broker refuse connections (fault injection in tests)."""
        lib = _librdkafka()
        call = lib.rd_kafka_mock_broker_set_down if down else lib.rd_kafka_mock_broker_set_up
        call(self._cluster, broker_id)

    def close(self) -> None:
        if self._handle is not None:
            _librdkafka().rd_kafka_mock_cluster_destroy(self._cluster)
            _librdkafka().rd_kafka_destroy(self._handle)
            self._handle = None


def mock_cluster(brokers: int) -> MockCluster:
    """The process's mock cluster of ``brokers`` brokers, started on first use."""
    with _lock:
        cluster = _clusters.get(brokers)
        if cluster is None:
            cluster = _clusters[brokers] = MockCluster(brokers)
        return cluster


def shutdown_mock_clusters() -> None:
    """Stop every mock cluster of the process (their data is gone)."""
    with _lock:
        for cluster in _clusters.values():
            cluster.close()
        _clusters.clear()
