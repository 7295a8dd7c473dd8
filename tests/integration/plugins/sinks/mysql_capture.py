"""A capture process for the SIGKILL test: runs the workload into the MySQL sink, slowly.

``python -m tests.integration.plugins.sinks.mysql_capture URI DATABASE CHANGEFEED``
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from cdcflow.core.testing import ListSource, drive
from cdcflow.plugins.sinks.mysql import MySQLSink, MySQLSinkConfig
from tests.fixtures.workload import make_workload

TXNS = 200


class SlowSink(MySQLSink):
    """Pauses after each downstream transaction so that a kill lands mid-batch."""

    def _apply_transaction(self, conn: Any, segments: Any) -> None:
        super()._apply_transaction(conn, segments)
        time.sleep(0.01)


def main(uri: str, database: str, changefeed: str) -> None:
    w = make_workload(database, txns=TXNS)
    sink = SlowSink(MySQLSinkConfig(uri=uri, worker_count=4, max_txn_row=4))
    asyncio.run(drive(ListSource.of(w.events), [sink], changefeed_id=changefeed))


if __name__ == "__main__":
    main(*sys.argv[1:4])
