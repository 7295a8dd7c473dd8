"""The test kit for plugin authors (STYLE §15): everything needed to test a source,
sink or scheduler plugin without infrastructure.

* :mod:`.kit` — an in-memory :class:`ListSource`, a :class:`ListSink` with crash
  markers, and :func:`drive`, which runs one through the other keeping the
  runtime's contract (re-exported here: ``from cdcflow.core.testing import ListSource``);
* :mod:`.inprocess` — :class:`~cdcflow.core.testing.inprocess.InProcessSpanExecutor`,
  a span executor that runs feeds straight into sinks on the capture's event loop,
  so the control plane runs end to end without Spark;
* :mod:`.scheduling` — a simulated cluster that drives a scheduler plugin against
  in-memory agents, for scheduler plugin tests.
"""

from cdcflow.core.testing.kit import (
    DriveResult,
    ListSink,
    ListSinkConfig,
    ListSource,
    ListSourceConfig,
    SimulatedCrash,
    create_table,
    delete,
    drive,
    drop_table,
    insert,
    update,
)

__all__ = [
    "DriveResult",
    "ListSink",
    "ListSinkConfig",
    "ListSource",
    "ListSourceConfig",
    "SimulatedCrash",
    "create_table",
    "delete",
    "drive",
    "drop_table",
    "insert",
    "update",
]
