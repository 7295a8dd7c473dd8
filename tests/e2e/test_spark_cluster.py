"""The main job on a Spark standalone cluster: a master and a worker, each a JVM of its own.

``cdcflow run`` (tikv source on the playground, Spark pipeline, Kafka sink in the Open
Protocol and the MySQL sink) runs with ``server.spark.master: spark://127.0.0.1:<port>``:
the driver is in the capture's process, the executors are JVMs the worker launched, running
this environment's Python (``PYSPARK_PYTHON``) and reading the capture's event store
directory (the same machine). Both downstreams must equal the playground's snapshot.

Catch-up on this cluster next to ``local[2]``, in the same run
(``python -m benchmarks.bench_catchup --rows 200000 --masters 'local[2]' standalone``; a backlog of
212,890 row changes, Kafka sink on the mock cluster, a 2-core machine whose load average was 7-8
from other test runs at the time, so the figures are indicative only):

=========================  ==========  =============  ==================
master                     start-up    catch-up       pipeline alone
=========================  ==========  =============  ==================
local[2]                   80.6 s      6,389 rows/s   6,400 rows/s
standalone, 1 worker × 2   58.1 s      10,214 rows/s  10,216 rows/s
=========================  ==========  =============  ==================

About half the backlog went in the first batches of each run (3 checkpoint values seen), so
the rates cover about 113,000 rows each; the raw mount stage ran at 23,566 rows/s in the same run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

TABLES = ("customers", "products", "orders")


def connectors(tmp_path: Path) -> Path:
    path = tmp_path / "connectors.yaml"
    doc = {
        "server": {"spark": {"master": "local[1]", "conf": {"spark.sql.shuffle.partitions": "2"}}},
        "connectors": [
            {
                "name": "shop-on-a-cluster",
                "source": {"type": "tikv", "pd": ["127.0.0.1:2379"], "tidb-status": "127.0.0.1:10080"},
                "sinks": [
                    {"uri": "kafka://127.0.0.1:9092/shop-on-a-cluster?protocol=open-protocol&partition-num=3"},
                    {"uri": "mysql://root@127.0.0.1:3306/"},
                ],
                "filter": {"rules": ["shop.*"]},
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(600)
def test_the_pipeline_on_a_standalone_cluster_equals_the_playground(
    tmp_path, cdcflow_deployment, cdcflow_playground, cdcflow_spark_cluster
):
    deployment = cdcflow_deployment(connectors(tmp_path), spark_cluster=True)
    assert deployment.document["server"]["spark"]["master"] == cdcflow_spark_cluster.master_url
    cdcflow_playground.start_workload(20.0)
    deployment.wait_checkpoint(cdcflow_playground.now())  # the pipeline is up and keeps up with live commits
    cdcflow_playground.run_workload(100)
    cdcflow_playground.stop_workload()
    deployment.wait_checkpoint(cdcflow_playground.now())

    # The job ran on the cluster: the master knows the application, the worker launched executors.
    status = cdcflow_spark_cluster.status()
    apps = [app for app in status["activeapps"] + status["completedapps"] if app["name"] == "cdcflow"]
    assert apps and all(app["cores"] > 0 or app["state"] == "FINISHED" for app in apps), status
    executors = list((cdcflow_spark_cluster.work_dir / "work").glob("app-*/*/stderr"))
    assert executors, "the worker launched no executor"

    for table in TABLES:
        compared = deployment.assert_replicated(table)
        assert len(compared) == 2 and all(rows > 0 for rows in compared.values()), compared
