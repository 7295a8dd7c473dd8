"""The test kit for plugin authors (STYLE §15): everything needed to test a source,
sink or scheduler plugin without infrastructure.

* :mod:`.kit` — an in-memory :class:`ListSource`, a :class:`ListSink` with crash
  markers, and :func:`drive`, which runs one through the other keeping the
  runtime's contract (re-exported here: ``from cdcflow.core.testing import ListSource``);
* :mod:`.inprocess` — :class:`~cdcflow.core.testing.inprocess.InProcessSpanExecutor`,
  a span executor that runs feeds straight into sinks on the capture's event loop,
  so the control plane runs end to end without Spark;
* :mod:`.scheduling` — a simulated cluster that drives a scheduler plugin against
  in-memory agents, for scheduler plugin tests;
* :mod:`.waiting` — :func:`until` (and :func:`until_sync`), which polls a condition
  until it holds and fails saying what it awaited and what it last saw, instead of
  sleeping and then asserting (re-exported here).
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
from cdcflow.core.testing.waiting import WaitTimeout, until, until_sync

__all__ = [
    "DriveResult",
    "ListSink",
    "ListSinkConfig",
    "ListSource",
    "ListSourceConfig",
    "SimulatedCrash",
    "WaitTimeout",
    "create_table",
    "delete",
    "drive",
    "drop_table",
    "insert",
    "until",
    "until_sync",
    "update",
]
