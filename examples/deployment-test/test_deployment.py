"""Test connectors.yaml end to end: copy this file and the connectors file next to it.

cdcflow's pytest plugin (installed with cdcflow) gives the fixtures: ``cdcflow_deployment``
runs ``cdcflow run`` on the file with its addresses replaced by a playground (TiKV), a
MariaDB and a Kafka cluster: containers when Docker answers, local servers otherwise.
"""

from pathlib import Path

import pytest

CONNECTORS = Path(__file__).with_name("connectors.yaml")
TABLES = ("customers", "products", "orders")


@pytest.mark.timeout(900)  # two capture start-ups (a JVM each) on a busy machine
def test_the_shop_survives_a_capture_crash(cdcflow_deployment, cdcflow_playground):
    deployment = cdcflow_deployment(CONNECTORS)
    playground = cdcflow_playground

    playground.run_workload(60)
    deployment.wait_checkpoint(playground.now())

    deployment.kill_capture()  # SIGKILL: no drain, no last checkpoint
    playground.run_workload(60)  # committed while the capture is down
    deployment.restart()

    deployment.wait_checkpoint(playground.now())
    for table in TABLES:
        compared = deployment.assert_replicated(table)
        assert len(compared) == 2, compared  # MySQL and Kafka
